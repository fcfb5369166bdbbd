"""The wheel keeps up with the layout: what ``pip install detlaunch`` gets is built here, installed in
a clean venv (no system site-packages, no PYTHONPATH, nothing of this checkout), and run for real.

A module or a package the build leaves out (a new folder the `packages.find` configuration misses,
rank/faultsite/ which has no __init__.py, an entry point naming a module that is not there) fails
here, not on a user's machine. The venv gets the wheel's own declared dependencies (its
Requires-Dist, with theirs) linked from the suite's venv: installing them would need the network,
and a dependency the wheel forgets to declare is then missing there too. No torch: the job runs
under `--layer direct` with a rank script that imports nothing heavy.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support.helpers import free_port
from support.jobs import Launcher
from support.paths import CORE, PLUGINS, ROOT

pytestmark = pytest.mark.timeout(300)

# What a build of a fresh clone would not see: the venv, build leftovers, caches, results.
NOT_IN_A_CLONE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
                                        "results")


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel` of a copy of the checkout (the build writes build/ and *.egg-info into its source)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(ROOT, source, ignore=NOT_IN_A_CLONE, symlinks=True)
    out = tmp / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                           "--disable-pip-version-check", "--wheel-dir", str(out), str(source)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    [wheel] = out.glob("detlaunch-*.whl")
    return wheel


def requirements_closure(wheel: Path) -> list[importlib.metadata.Distribution]:
    """The installed distributions the wheel needs: its Requires-Dist without extras, and theirs."""
    with zipfile.ZipFile(wheel) as z:
        [meta] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        declared = Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []
    todo, found = list(declared), {}
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name not in found:
            found[name] = dist = importlib.metadata.distribution(req.name)
            todo.extend(dist.requires or [])
    return list(found.values())


@pytest.fixture(scope="module")
def wheel_venv(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv of its own with only the wheel installed (pip, no deps) and its dependencies linked in."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                           "--quiet", "--disable-pip-version-check", str(built_wheel)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    for dist in requirements_closure(built_wheel):
        for file in dist.files or ():
            top = Path(file).parts[0]
            where = Path(str(dist.locate_file(file))).resolve()
            if top == "..":  # a program in bin/ (py-spy); the Python entry scripts name the other venv's python
                if where.parent.name == "bin" and where.read_bytes()[:2] != b"#!":
                    (venv / "bin" / where.name).symlink_to(where)
            elif not (site / top).exists():
                (site / top).symlink_to(Path(str(dist.locate_file(top))).resolve())
    return venv


def source_modules() -> set[str]:
    """Every .py file of the packages, as its path in the wheel (the source roots of packages.find)."""
    roots = [CORE, *(p for p in PLUGINS.iterdir() if p.is_dir())]
    return {str(f.relative_to(root)) for root in roots for f in root.rglob("*.py") if "__pycache__" not in f.parts}


def test_the_wheel_holds_every_module_of_the_source(built_wheel: Path) -> None:
    with zipfile.ZipFile(built_wheel) as z:
        in_wheel = {n for n in z.namelist() if n.endswith(".py")}
    expected = source_modules()
    assert "detlaunch/rank/faultsite/sitecustomize.py" in expected  # a folder without __init__.py
    assert expected - in_wheel == set(), "modules the wheel leaves out"
    assert in_wheel - expected == set(), "modules in the wheel that the source does not have"


def test_detlaunch_from_the_wheel_lists_its_layers_and_runs_a_job(wheel_venv: Path, launcher: Launcher,
                                                                  tmp_path: Path) -> None:
    launcher.env.pop("PYTHONPATH", None)  # nothing of this checkout: only what the wheel installed
    python = wheel_venv / "bin" / "python"
    where = subprocess.run([str(python), "-c", "import detlaunch, detlaunch_direct; "
                            "print(detlaunch.__file__); print(detlaunch_direct.__file__)"],
                           env=launcher.env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    assert all(Path(line).is_relative_to(wheel_venv) for line in where.stdout.split()), where.stdout

    layers = launcher.run("layers", command=(str(wheel_venv / "bin" / "detlaunch"),), timeout=60)
    assert layers.returncode == 0, layers.output
    for name in ("torchrun", "horovod", "deepspeed", "direct"):
        assert f"detlaunch_{name}.layer)  loaded" in layers.stdout, layers.output

    # faulthandler registered for SIGRTMIN+7 in the rank: rank/faultsite/sitecustomize.py ran from the wheel.
    script = tmp_path / "rank.py"
    script.write_text("import faulthandler, os, signal\n"
                      "print(f\"rank {os.environ['RANK']}/{os.environ['WORLD_SIZE']} \"\n"
                      "      f\"fault site {faulthandler.unregister(signal.SIGRTMIN + 7)}\")\n")
    job = launcher.run("--layer", "direct", "--nproc-per-node", "2", "--master-port", str(free_port()), str(script),
                       command=(str(wheel_venv / "bin" / "detlaunch"),), timeout=120)
    assert job.returncode == 0, job.output
    for rank in range(2):
        assert job.rank_lines(rank) == [f"rank {rank}/2 fault site True"], job.output
    assert "job finished: 2 rank(s) exited 0" in job.stderr, job.output
