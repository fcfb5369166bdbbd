"""Install the example plugin distributions (examples/detlaunch-*) for this test run, as a user would.

A normal ``pip install`` of a copy of each folder (so no build files land in the source tree), with
``--target`` a folder of this pytest process's own, put first on sys.path and on PYTHONPATH: every
detlaunch the tests start then sees their entry points, and the venv is never touched. The folder
goes when the run ends (tests/support/reaper.py), however it ends.

stevedore keeps an in-process cache of entry points per ``sys.path``: call :func:`ensure_installed`
at import time (collection), before anything in this process lists entry points; it also drops
that cache, for the case where something already did.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from support import paths, reaper

ROOT = paths.ROOT
EXAMPLES = ROOT / "examples"
MPIRUN = EXAMPLES / "detlaunch-mpirun"
JAX = EXAMPLES / "detlaunch-jax"
BROKEN = EXAMPLES / "detlaunch-broken"

_site: Path | None = None  # this run's folder of installed examples
_installed: set[Path] = set()


def run_site() -> Path:
    """This run's folder of installed examples, made and put on sys.path and PYTHONPATH the first time."""
    global _site
    if _site is None:
        _site = Path(tempfile.mkdtemp(prefix="detlaunch-test-plugins-"))
        reaper.remove_at_exit(_site)
        sys.path.insert(0, str(_site))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(_site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return _site


def ensure_installed(*folders: Path) -> None:
    """pip-install these example folders into this run's folder (each once)."""
    todo = [f for f in folders if f not in _installed]
    if not todo:
        return
    target = run_site()
    with tempfile.TemporaryDirectory() as tmp:
        copies = [shutil.copytree(f, Path(tmp) / f.name, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                                        "__pycache__"))
                  for f in todo]
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
             "--no-compile", "--disable-pip-version-check", "--upgrade", "--target", str(target), *map(str, copies)],
            capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pip install --target {target} {' '.join(map(str, todo))} failed:\n"
                           f"{done.stdout}{done.stderr}")
    _installed.update(todo)
    importlib.invalidate_caches()
    # test-only: stevedore never expects entry points to change under a running process
    stevedore = importlib.import_module("stevedore")
    stevedore.ExtensionManager.ENTRY_POINT_CACHE.clear()
    cache = getattr(importlib.import_module("stevedore._cache"), "_c", None)
    if cache is not None and hasattr(cache, "_internal"):
        cache._internal.clear()


FIXTURES = paths.FIXTURES


def fake_dist(site: Path, name: str, entry_points: dict[str, dict[str, str]], version: str = "0.1") -> dict[str, str]:
    """A distribution made of a dist-info folder in `site` (modules from tests/support/plugin_fixtures/).

    Returns the PYTHONPATH that makes it installed for a child process only, ahead of the run's own
    (which holds the installed examples): the venv is untouched.
    """
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    sections = [f"[{group}]\n" + "".join(f"{ep} = {target}\n" for ep, target in eps.items())
                for group, eps in entry_points.items()]
    (info / "entry_points.txt").write_text("".join(sections))
    return {"PYTHONPATH": os.pathsep.join([str(site), str(FIXTURES), *filter(None, [os.environ.get("PYTHONPATH")])])}
