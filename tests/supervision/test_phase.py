"""The supervisor's phases: drawn in one docstring, changed in one method."""

from __future__ import annotations

import inspect
import re

from detlaunch import supervisor
from detlaunch.supervisor import Phase


def test_every_phase_is_in_the_drawing() -> None:
    drawing = Phase.__doc__ or ""
    assert {p.name for p in Phase} <= set(re.findall(r"\b[A-Z_]{4,}\b", drawing))


def test_the_phase_changes_in_one_place() -> None:
    source = inspect.getsource(supervisor)
    assignments = re.findall(r"self\.phase = ", source)
    assert len(assignments) == 2  # the start in __init__, and _enter
    enter = inspect.getsource(supervisor.NodeSupervisor._enter)
    assert "self.phase = phase" in enter and "self.trace(" in enter


def test_the_groups_of_phases() -> None:
    assert [p for p in Phase if p.active] == [Phase.STARTING, Phase.RUNNING]
    assert [p for p in Phase if p.stopping] == [Phase.STOPPING_RANKS, Phase.STOPPING, Phase.KILLING]
    assert [p for p in Phase if p.over] == [Phase.LOCAL_DONE, Phase.CLOSING, Phase.DONE]
