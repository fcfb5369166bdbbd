"""A warm rank's stack (forked from the node's rank template) shows and groups as a cold rank's."""

from __future__ import annotations

import json

from detlaunch.stacks.groups import signature
from detlaunch.stacks.pyspy import parse_dump

SCRIPT = [{"name": "<module>", "filename": "/job/ranks.py", "line": 55}]
TEMPLATE = [{"name": "run_script", "filename": "/venv/lib/detlaunch/rank/template.py", "line": 258},
            {"name": "serve", "filename": "/venv/lib/detlaunch/rank/template.py", "line": 120}]


def dump(frames: list[dict[str, object]]) -> str:
    return json.dumps([{"thread_id": 1, "thread_name": "MainThread", "active": False, "owns_gil": False,
                        "frames": [{"name": "sleep", "filename": "<built-in>", "line": 0}, *frames]}])


def test_the_templates_frames_are_not_the_ranks() -> None:
    warm, cold = parse_dump(10, dump(SCRIPT + TEMPLATE)), parse_dump(11, dump(SCRIPT))
    assert [f.file for f in warm.threads[0].frames] == ["<built-in>", "/job/ranks.py"]
    assert signature(warm) == signature(cold)


def test_a_stack_of_template_frames_alone_is_kept() -> None:
    """The template itself (no rank's script under it) keeps its frames: nothing else would be left to show."""
    assert len(parse_dump(12, json.dumps([{"thread_id": 1, "frames": TEMPLATE}])).threads[0].frames) == 2
