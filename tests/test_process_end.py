"""How a process ended (outcome.ProcessEnd): the one form every part keeps, made from each form an end comes in."""

from __future__ import annotations

import signal

import pytest
from detlaunch.outcome import ProcessEnd, RankStatus

pytestmark = pytest.mark.timeout(10)


def test_a_process_end_in_each_form_it_comes_in() -> None:
    assert ProcessEnd.from_wait_status(3 << 8) == ProcessEnd(3) == ProcessEnd.from_returncode(3)
    killed = ProcessEnd.killed(signal.SIGKILL)
    assert killed == ProcessEnd(137, signal.SIGKILL) == ProcessEnd.from_returncode(-9)
    assert ProcessEnd.from_wait_status(signal.SIGKILL) == killed  # a wait status: the signal in the low bits
    assert (killed.describe(), ProcessEnd(3).describe(), ProcessEnd(0).ok, killed.ok) == (
        "killed by SIGKILL", "exit 3", True, False)


def test_a_ranks_status_is_a_process_end_kept_flat() -> None:
    status = RankStatus(rank=1, node_rank=0, exit_code=143, signal=signal.SIGTERM)
    assert status.end == ProcessEnd.killed(signal.SIGTERM) and status.describe() == "killed by SIGTERM"
    assert RankStatus(rank=1, node_rank=0, exit_code=None).end is None
    assert RankStatus(rank=1, node_rank=0, exit_code=None).describe() == "still running"
