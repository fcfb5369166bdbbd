"""The supervisor's phases: drawn in one docstring, changed in one method."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from detlaunch.node import supervisor
from detlaunch.node.supervisor import Phase
from support.helpers import free_port
from support.jobs import Launcher


def test_every_phase_is_in_the_drawing() -> None:
    drawing = Phase.__doc__ or ""
    assert {p.name for p in Phase} <= set(re.findall(r"\b[A-Z_]{4,}\b", drawing))


def test_the_phase_changes_in_one_place() -> None:
    source = inspect.getsource(supervisor)
    assignments = re.findall(r"self\.phase = ", source)
    assert len(assignments) == 2  # the start in __init__, and enter
    enter = inspect.getsource(supervisor.NodeSupervisor.enter)
    assert "self.phase = phase" in enter and "self.trace(" in enter
    others = [p.name for p in Path(supervisor.__file__).parent.glob("*.py")  # the parts call enter
              if p.name != "supervisor.py" and re.search(r"\.phase = ", p.read_text())]
    assert others == []


def test_the_groups_of_phases() -> None:
    assert [p for p in Phase if p.active] == [Phase.STARTING, Phase.RUNNING]
    assert [p for p in Phase if p.stopping] == [Phase.STOPPING_RANKS, Phase.STOPPING, Phase.KILLING]
    assert [p for p in Phase if p.over] == [Phase.LOCAL_DONE, Phase.CLOSING, Phase.DONE]


def phase_path(stderr: str) -> list[str]:
    """The phases one node went through, from its --debug lines; each change must start where the last ended."""
    changes = re.findall(r"^detlaunch: \[node 0\] phase: (.+) -> (.+)$", stderr, re.M)
    assert changes and all(a == prev[1] for prev, a in zip(changes, (c[0] for c in changes[1:]), strict=False)), changes
    return [changes[0][0], *(to for _, to in changes)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case, args, code, path", [
    ("ends 0", ["ok.py"], 0, "starting running stopping sweeping local_done closing done"),
    ("fails", ["bad.py"], 3, "starting running stopping killing sweeping local_done closing done"),
    ("restarts once", ["--max-restarts", "1", "--restart-on", "3", "--restart-backoff", "0", "bad.py"], 3,
     "starting running stopping killing sweeping local_done backoff "
     "starting running stopping killing sweeping local_done closing done"),
])
def test_debug_shows_each_phase_change_of_a_real_job(launcher: Launcher, tmp_path: Path, case: str, args: list[str],
                                                     code: int, path: str) -> None:
    (tmp_path / "ok.py").write_text("print('fine')\n")
    (tmp_path / "bad.py").write_text("raise SystemExit(3)\n")
    r = launcher.run("--debug", "--layer", "direct", "--nproc-per-node", "1", "--master-port", str(free_port()),
                     *[str(tmp_path / a) if a.endswith(".py") else a for a in args], timeout=100)
    assert r.returncode == code, r.stderr
    assert phase_path(r.stderr) == [Phase[p.upper()].value for p in path.split()], r.stderr
