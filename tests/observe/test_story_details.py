"""The page and the end report agree: the details the supervisor adds to its events (story_details.py,
Attempts.details) are enough for a page built from the log to print what the report printed, word for word."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
from detlaunch.observe import story_details
from detlaunch.observe.emitter import EventEmitter
from detlaunch.observe.events import Event, EventKind
from detlaunch.observe.report import format_report
from detlaunch.observe.story_model import build
from detlaunch.observe.story_read import Reading, read_logs
from detlaunch.outcome import Failure, FailureKind, JobResult, RankStatus
from detlaunch.restarts.attempts import Attempts, attempt_end_from_verdict
from detlaunch.restarts.policy import RestartPolicy

pytestmark = pytest.mark.timeout(10)
K = EventKind
TAIL = ("warming up", "Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
        "    1 / 0", "ZeroDivisionError: division by zero")


def story_of(events: list[Event]) -> list[str]:
    return build(Reading(events=sorted(events, key=lambda e: e.time))).report


def test_a_page_from_the_log_prints_the_report_the_job_printed(tmp_path: Path) -> None:
    ranks = (RankStatus(0, 0, 143, None, wall=5.2, host="h0", stopped=True),
             RankStatus(1, 0, 0, None, wall=5.3, host="h0", killed=True),
             RankStatus(2, 1, 1, None, tail=TAIL, wall=5.0, host="h1"),
             RankStatus(3, 1, by := 128 + signal.SIGTERM, signal.SIGTERM, wall=5.1, host="h1"))
    assert by == 143
    failure = Failure("rank 2 on node 1 (h1) exited with code 1", 1, rank=ranks[2], tail=TAIL, tail_of="rank 2",
                      at=5.0, kind=FailureKind.RANK)
    result = JobResult(1, ranks, failure=failure, duration=6.0, stacks=("1 rank(s) 0: in barrier (train.py:9)",))
    now = [0.0]
    nodes = [EventEmitter("j", n, path=str(tmp_path / ("events.jsonl" if n == 0 else f"events-node-{n}.jsonl")),
                          hook=None, warn=pytest.fail, clock=lambda: now[0]) for n in (0, 1)]
    nodes[0].emit(K.JOB_PLANNED, layer="direct", nodes=2, ranks=4)
    for r in ranks:  # as the supervisor emits them (supervisor.py), through the log files
        node = nodes[r.node_rank]
        now[0] = 1.0
        node.emit(K.RANK_REGISTERED, r.rank, host=r.host, pid=10 + r.rank)
        node.emit(K.RANK_STARTED, r.rank, pid=20 + r.rank)
        now[0] = r.wall
        node.emit(K.RANK_EXITED, r.rank, **story_details.rank_exited(r))
    nodes[1].emit(K.FAILURE, 2, what=failure.what, exit_code=1, at=5.0)
    now[0] = 6.0
    nodes[0].emit(K.ROOT_CAUSE, 2, what=failure.what, exit_code=1, at=5.0, **story_details.root_cause(result))
    nodes[0].emit(K.JOB_FINISHED, exit_code=1, duration=6.0)
    for node in nodes:
        node.close()
    printed = [line.removeprefix("detlaunch: ") for line in format_report(result)]
    assert build(read_logs([str(tmp_path)])).report == printed
    assert "  rank 1 (node 0): SIGKILLed by detlaunch (it had not stopped when asked)" in printed
    assert "  | ZeroDivisionError: division by zero" in printed


def test_the_attempts_on_the_page_are_the_ones_the_chief_printed() -> None:
    policy = RestartPolicy(max_restarts=1, backoff_initial=0.0, backoff_cap=0.0)
    attempts = Attempts(policy, random.Random(0))
    failure = Failure("rank 1 on node 1 (h1) exited with code 3", 3,
                      rank=RankStatus(1, 1, 3, tail=TAIL), tail=TAIL, kind=FailureKind.RANK)
    events = [Event(0.0, "j", 0, None, K.JOB_PLANNED, {"layer": "direct", "nodes": 2, "ranks": 2})]
    for n, (start, stop) in enumerate([(10.0, 12.5), (13.0, 20.0)], 1):
        events.append(Event(start, "j", 0, None, K.ATTEMPT_STARTED, {"attempt": n - 1}))
        attempts.begin(n)
        attempts.ended(attempt_end_from_verdict(n, failure, None, 3, started=True, policy=policy, started_at=start,
                                                ended_at=stop))
        events.append(Event(stop, "j", 0, None, K.ATTEMPT_ENDED, attempts.ended_event(n, 3)))
    events.append(Event(20.5, "j", 0, None, K.JOB_FINISHED, {"exit_code": 3, "duration": 20.5}))
    printed = [line.removeprefix("detlaunch: ") for line in attempts.report()]
    assert printed[0] == "2 attempt(s):" and printed[-1].endswith(": not restarting (crash loop)")
    assert story_of(events)[:len(printed)] == printed
    # Only the attempt that ended last is known to the chief's bookkeeping; a worker has no history at all.
    assert attempts.ended_event(1, 3) == {"attempt": 0, "exit_code": 3}


def test_a_rank_that_ended_by_itself_has_only_the_schemas_details() -> None:
    assert story_details.rank_exited(RankStatus(0, 0, 3, wall=2.0)) == {"code": 3, "signal": None, "wall": 2.0,
                                                                      "stopped": False}
    assert story_details.rank_exited(RankStatus(0, 0, 137, signal.SIGKILL, lost=True, ended="raised")) == {
        "code": None, "signal": signal.SIGKILL, "wall": 0.0, "stopped": False, "lost": True, "ended": "raised"}
    assert story_details.root_cause(JobResult(0, ())) == {}
