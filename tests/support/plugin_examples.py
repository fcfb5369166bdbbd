"""Install the example plugin distributions (examples/detlaunch-*) into this venv, as a user would.

A normal ``pip install`` of a copy of the folder (so no build files land in the source tree),
done only when the installed files differ from the source: idempotent, and safe when several
pytest processes share the venv (an exclusive lock around check and install). Installing adds
entry points that every later detlaunch run sees; uninstalling is never needed.

stevedore keeps an in-process cache of entry points per ``sys.path``: call :func:`ensure_installed`
at import time (collection), before anything in this process lists entry points; it also drops
that cache, for the case where something already did.
"""

from __future__ import annotations

import fcntl
import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from support import paths

ROOT = paths.ROOT
EXAMPLES = ROOT / "examples"
MPIRUN = EXAMPLES / "detlaunch-mpirun"
JAX = EXAMPLES / "detlaunch-jax"
BROKEN = EXAMPLES / "detlaunch-broken"


def _project(folder: Path) -> tuple[str, str, set[tuple[str, str, str]], list[str]]:
    meta = tomllib.loads((folder / "pyproject.toml").read_text())
    project = meta["project"]
    eps = {(group, name, value) for group, entries in project.get("entry-points", {}).items()
           for name, value in entries.items()}
    return project["name"], project["version"], eps, meta["tool"]["setuptools"]["packages"]


def up_to_date(folder: Path) -> bool:
    """Is this folder's distribution installed, with the same version, entry points and files?"""
    name, version, eps, packages = _project(folder)
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    if dist.version != version or {(e.group, e.name, e.value) for e in dist.entry_points} != eps:
        return False
    for package in packages:
        for source in (folder / package).rglob("*.py"):
            installed = Path(str(dist.locate_file(source.relative_to(folder))))
            if not installed.is_file() or installed.read_bytes() != source.read_bytes():
                return False
    return True


def ensure_installed(*folders: Path) -> None:
    lock_path = Path(sys.prefix) / ".detlaunch-examples.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            stale = [f for f in folders if not up_to_date(f)]
            for folder in stale:
                with tempfile.TemporaryDirectory() as tmp:
                    copy = Path(tmp) / folder.name
                    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
                    done = subprocess.run(
                        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                         "--force-reinstall", "--disable-pip-version-check", str(copy)],
                        capture_output=True, text=True, timeout=300, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"pip install {folder} failed:\n{done.stdout}{done.stderr}")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    importlib.invalidate_caches()
    if stale:  # test-only: stevedore never expects entry points to change under a running process
        stevedore = importlib.import_module("stevedore")
        stevedore.ExtensionManager.ENTRY_POINT_CACHE.clear()
        cache = getattr(importlib.import_module("stevedore._cache"), "_c", None)
        if cache is not None and hasattr(cache, "_internal"):
            cache._internal.clear()


FIXTURES = paths.FIXTURES


def fake_dist(site: Path, name: str, entry_points: dict[str, dict[str, str]], version: str = "0.1") -> dict[str, str]:
    """A distribution made of a dist-info folder in `site` (modules from tests/support/plugin_fixtures/).

    Returns the PYTHONPATH that makes it installed for a child process only: the venv is untouched.
    """
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    sections = [f"[{group}]\n" + "".join(f"{ep} = {target}\n" for ep, target in eps.items())
                for group, eps in entry_points.items()]
    (info / "entry_points.txt").write_text("".join(sections))
    return {"PYTHONPATH": f"{site}{os.pathsep}{FIXTURES}"}
