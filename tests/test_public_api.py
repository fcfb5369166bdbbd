"""The built-in layers and the examples import only the public API, exactly as a third party would.

Public: what ``detlaunch`` exports (``__all__``) and its public submodules. A private import would
work today and break a third party's copy of the same code tomorrow, so it fails here, in
milliseconds, naming the file and the line.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import detlaunch
import pytest
from support.jobs import ROOT

PUBLIC_SUBMODULES = {"detlaunch.ssh", "detlaunch.launcher_flags", "detlaunch.testing"}
SOURCES = sorted(p for top in ("plugins", "examples") for p in (ROOT / top).rglob("*.py")
                 if ".venv" not in p.parts and "build" not in p.parts)


def private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            if node.module == "detlaunch":
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: from detlaunch import {a.name}"
                          for a in node.names if a.name not in detlaunch.__all__]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {m}" for m in modules
                  if m.startswith("detlaunch.") and m.split(".")[0] == "detlaunch"
                  and not any(m == p or m.startswith(p + ".") for p in PUBLIC_SUBMODULES)]
    return found


def test_there_are_layers_to_check() -> None:
    assert len(SOURCES) > 20, SOURCES


def test_plugins_and_examples_import_only_the_public_api() -> None:
    assert [line for path in SOURCES for line in private_imports(path)] == []


def test_every_export_is_found() -> None:
    for name in detlaunch.__all__:
        assert getattr(detlaunch, name) is not None, name


def test_names_that_moved_to_detlaunch_ssh_still_work_with_a_warning() -> None:
    from detlaunch import ssh

    with pytest.warns(DeprecationWarning, match=r"detlaunch.sshd_parts moved to detlaunch.ssh"):
        assert detlaunch.sshd_parts is ssh.sshd_parts
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert detlaunch.Stage is not None  # a name that did not move: no warning


def test_the_type_checkers_view_of_the_api_is_the_lazy_loaders(real_processes: None) -> None:
    """`__init__.py` names each export twice (for the lazy loader and for type checkers): the same."""
    tree = ast.parse((ROOT / "core" / "detlaunch" / "__init__.py").read_text())
    typed = {a.asname or a.name: node.module.removeprefix("detlaunch.") for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("detlaunch.")
             and node.module not in ("detlaunch._lazy", "detlaunch.version")  # __version__: not lazy
             for a in node.names}
    assert typed == detlaunch._EXPORTS
