"""The house's sizes, read from the code: a room holds one idea, so none grows past what a newcomer reads
at once. No file over 500 lines and no class over 350 in core/ and plugins/; at most 15 modules directly
in core/detlaunch/ (the public face and the foundations), everything else in the folder of its part."""

from __future__ import annotations

import ast

from support import paths

MAX_FILE_LINES = 500
MAX_CLASS_LINES = 350
MAX_TOP_MODULES = 15
SOURCES = sorted([*paths.CORE.rglob("*.py"), *paths.PLUGINS.rglob("*.py")])


def test_there_are_sources_to_measure() -> None:
    assert len(SOURCES) > 50 and (paths.CORE / "detlaunch" / "node" / "supervisor.py") in SOURCES


def test_no_file_is_over_the_limit() -> None:
    lines = {str(p.relative_to(paths.ROOT)): len(p.read_text().splitlines()) for p in SOURCES}
    assert {p: n for p, n in lines.items() if n > MAX_FILE_LINES} == {}


def test_no_class_is_over_the_limit() -> None:
    big = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > MAX_CLASS_LINES:
                    big[f"{path.relative_to(paths.ROOT)}:{node.name}"] = length
    assert big == {}


def test_few_modules_stand_directly_in_the_package() -> None:
    top = sorted(p.name for p in (paths.CORE / "detlaunch").glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_the_limits_would_catch_a_big_room() -> None:
    """The checks above measure what they should: a class of 400 lines is seen as one."""
    source = "class Big:\n" + "    x = 1\n" * 399
    tree = ast.parse(source)
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))
    assert cls.end_lineno is not None and cls.end_lineno - cls.lineno + 1 == 400 > MAX_CLASS_LINES
