"""The report's lines for a job of several attempts (report.format_attempts): what ended each, and what followed."""

from __future__ import annotations

import pytest
from detlaunch.observe.report import format_attempts
from detlaunch.outcome import AttemptEnd, RestartClass

pytestmark = pytest.mark.timeout(10)


def end(attempt: int, exit_code: int = 1, cause: str = "ValueError: a", **kw: object) -> AttemptEnd:
    return AttemptEnd(attempt, RestartClass.RANK_FAILED, exit_code, signature=f"exit {exit_code}: {cause}",
                      what=f"rank 1 on node 0 (127.0.0.1) exited with code {exit_code}", exception="ValueError",
                      **kw)  # type: ignore[arg-type]


def test_each_attempt_and_why_the_next_started_or_none_did() -> None:
    history = [end(1, started_at=100.0, ended_at=110.0), end(2, 3, started_at=111.2, ended_at=112.0)]
    why = "attempt 2 failed the same way as attempt 1 (ValueError: a): not restarting (crash loop)"
    assert format_attempts(history, why) == [
        "detlaunch: 2 attempt(s):",
        "detlaunch:   attempt 1: rank-failed after 10.0 s: rank 1 on node 0 (127.0.0.1) exited with code 1 "
        "(ValueError: a)",
        "detlaunch:     -> attempt 2 started 1.2 s later",
        "detlaunch:   attempt 2: rank-failed after 0.8 s: rank 1 on node 0 (127.0.0.1) exited with code 3 "
        "(ValueError: a)",
        f"detlaunch:     -> {why}",
    ]


def test_a_finished_attempt_and_a_lost_node() -> None:
    ok = format_attempts([end(1), AttemptEnd(2, None, 0)], "attempt 2 finished")
    assert ok[-2:] == ["detlaunch:     -> attempt 2 started", "detlaunch:   attempt 2: finished (exit 0)"]
    lost = AttemptEnd(1, RestartClass.NODE_LOST, 1, signature="exit 1",
                      what="node 1 (127.0.0.2) was lost: no heartbeat for 5 s")
    assert format_attempts([lost], "restart 1 of 1 in 1.0 s")[1:] == [
        "detlaunch:   attempt 1: node-lost: node 1 (127.0.0.2) was lost: no heartbeat for 5 s",
        "detlaunch:     -> restart 1 of 1 in 1.0 s"]
    assert format_attempts([lost], None) == format_attempts([lost], "x")[:-1]
