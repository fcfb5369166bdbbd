"""The house's layering, read from the code's imports: no circle, and no import that runs back up.

core/detlaunch/ is a folder per part of the pipeline (each package's docstring says what it owns
and what it may import). The parts stand in the order of `PARTS`, lowest first: a module may
import its own part and the parts below it, never one above. Every import counts, the ones inside
a function and under TYPE_CHECKING too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import paths

CORE = paths.CORE
PLUGINS = paths.PLUGINS

# Lowest first. A part is a package (every module under it) or one top-level module.
PARTS: tuple[tuple[str, ...], ...] = (
    ("detlaunch.rank",),  # the wrapper and all it imports: stdlib only
    ("detlaunch.errors", "detlaunch.numbers", "detlaunch.options", "detlaunch.exit_codes", "detlaunch._lazy",
     "detlaunch.progress", "detlaunch.launcher_flags", "detlaunch.version"),
    ("detlaunch.tracebacks", "detlaunch.native_errors", "detlaunch.outcome"),
    ("detlaunch.system",),
    ("detlaunch.observe",),
    ("detlaunch.stacks",),
    ("detlaunch.restarts",),
    ("detlaunch.planning",),
    ("detlaunch.link",),
    ("detlaunch.node",),
    ("detlaunch.ssh", "detlaunch.testing"),  # public faces for layer authors
    ("detlaunch.cli",),
    ("detlaunch.__main__", "detlaunch"),  # `detlaunch` itself: the package's __init__ (lazy exports)
)
PUBLIC = ("detlaunch", "detlaunch.ssh", "detlaunch.launcher_flags", "detlaunch.testing", "detlaunch.progress")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, module: str) -> Iterator[str]:
    """Every module `path` imports (absolute names; `from X import y` yields X.y too, as y may be a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            yield source
            yield from (f"{source}.{alias.name}" for alias in node.names)


def graph(root: Path, top: str) -> dict[str, set[str]]:
    modules = {module_name(p, root): p for p in (root / top).rglob("*.py")}
    return {m: {i for i in imports_of(p, m) if i in modules and i != m} for m, p in modules.items()}


CORE_GRAPH = graph(CORE, "detlaunch")


def part_of(module: str) -> int:
    for index, part in enumerate(PARTS):
        if any(module == p or module.startswith(p + ".") for p in part if p != "detlaunch"):
            return index
    if module == "detlaunch":
        return len(PARTS) - 1
    raise AssertionError(f"{module} is in no part of PARTS: add it where it belongs")


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_in_a_part() -> None:
    for module in CORE_GRAPH:
        part_of(module)


def test_no_import_circle() -> None:
    assert circles(CORE_GRAPH) == []


def test_no_import_runs_back_up() -> None:
    upward = [f"{m} imports {i}" for m, deps in sorted(CORE_GRAPH.items()) for i in sorted(deps)
              if part_of(i) > part_of(m)]
    assert upward == []


def test_the_rank_side_imports_nothing_else_of_detlaunch() -> None:
    """The wrapper runs with `python -S` in front of every rank: it cannot afford the rest."""
    for module, deps in CORE_GRAPH.items():
        if module.startswith("detlaunch.rank"):
            assert all(d.startswith("detlaunch.rank") for d in deps), (module, deps)


@pytest.mark.parametrize("plugin", sorted(p.name for p in PLUGINS.iterdir() if p.is_dir()))
def test_a_built_in_layer_imports_only_the_public_api(plugin: str) -> None:
    for path in (PLUGINS / plugin).rglob("*.py"):
        module = module_name(path, PLUGINS / plugin)
        for imported in imports_of(path, module):
            if imported.split(".")[0] == "detlaunch":
                assert any(imported == p or imported.startswith(p + ".") and p != "detlaunch" for p in PUBLIC) \
                    or imported.rpartition(".")[0] in PUBLIC, f"{path}: imports {imported}"


def test_the_checker_sees_an_upward_import_and_a_circle() -> None:
    """The checks above would pass on an empty graph: this one proves they read what they should."""
    assert part_of("detlaunch.node.supervisor") > part_of("detlaunch.planning.plan") > part_of("detlaunch.rank.wrapper")
    assert circles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert "detlaunch.node.phase" in CORE_GRAPH["detlaunch.node.supervisor"]
