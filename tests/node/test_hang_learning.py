"""Issue 27, item 4: a hang is seen without --hang-timeout (reported once, the job goes on), and
--hang-timeout auto learns its limit from the job (the parts, with scripted answers, in milliseconds)."""

from __future__ import annotations

from typing import Any

import pytest
from detlaunch.node import hangs as hangs_module
from detlaunch.node.hangs import HangPolicy
from detlaunch.node.progress_watch import TimeoutLearner
from detlaunch.node.verdict import Hung, as_failure
from detlaunch.observe.events import EventKind
from detlaunch.system.eventloop import EventLoop

pytestmark = pytest.mark.timeout(10)
STACK = {"pid": 10, "stopped": False, "threads": [{"name": "MainThread", "thread_id": 1, "active": False,
         "owns_gil": False, "os_thread_id": 1, "frames": [{"function": "wait", "file": "t.py", "line": 3,
                                                           "code": "dist.all_reduce(t)"}]}]}
STACKS = {"nodes": [{"node": 0, "ranks": [{"rank": 0, "pid": 10, "stack": STACK}]}], "missing": []}
STALE = {"nodes": [{"node": 0, "ages": [[0, 1000.0]]}]}
MOVING = {"nodes": [{"node": 0, "ages": [[0, 0.0]]}]}


class Job:
    """What the policy is given, recorded: the questions, failures, lines and events."""

    def __init__(self, hang_timeout: object) -> None:
        self.loop = EventLoop()
        self.asked: list[str] = []
        self.failed: list[object] = []
        self.said: list[str] = []
        self.events: list[tuple[EventKind, dict[str, Any]]] = []
        self.answers: dict[str, object] = {"progress": MOVING, "stacks": STACKS}
        self.hangs = HangPolicy(self.loop, node=0, host="h", run_dir="/nonexistent", is_chief=True,
                                hang_timeout=hang_timeout, dump_budget=1.0,  # type: ignore[arg-type]
                                ask_job=self.ask_job, fail=self.failed.append, say=self.said.append,
                                live_ranks=lambda: [(0, 10)], active=lambda: True,
                                emit=lambda kind, rank=None, **d: self.events.append((kind, d)))
        self.hangs.stragglers = lambda: {"0": "0.50x (step)"}

    def ask_job(self, what: str, args: object, answer: Any) -> None:
        self.asked.append(what)
        answer(self.answers[what])

    def close(self) -> None:
        self.hangs.close()
        self.loop.close()


def test_without_the_option_a_hang_is_reported_once_and_the_job_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hangs_module, "REPORT_AFTER", 0.05)
    job = Job(None)
    job.answers["progress"] = STALE
    job.hangs.started(0)
    job.loop.run_until(lambda: "stacks" in job.asked, 5, "the stacks")
    for _ in range(5):
        job.loop.run_once(timeout=0.06)
    assert job.failed == [] and job.asked.count("stacks") == 1  # once; nothing stopped
    assert [k for k, _ in job.events] == [EventKind.HANG_DETECTED] and job.events[0][1]["stopping"] is False
    assert "the job goes on" in job.said[0]
    assert "  rank 0 (node 0): dist.all_reduce <- wait (t.py:3)" in job.said
    assert "  rank 0: named a straggler before (0.50x (step))" in job.said
    job.close()


def test_hang_timeout_0_watches_nothing() -> None:
    job = Job(0.0)
    job.hangs.started(0)
    assert job.hangs.watch is None and job.loop.next_timeout() is None
    job.close()


def test_the_learner_counts_after_the_warm_up_keeps_the_longest_across_attempts_and_has_a_floor() -> None:
    learner = TimeoutLearner(factor=5.0, floor=60.0, warmup=2)
    changed = [learner.observe(t) for t in (0.0, 30.0, 31.0, 33.0, 33.0, 37.0)]  # gaps 30, 1 (warm-up), 2, 4
    assert learner.longest == 4.0 and learner.timeout == 60.0  # 5 x 4 is under the floor
    assert changed == [False, False, False, True, False, False]
    learner.observe(57.0)  # a gap of 20 s: 100 s
    assert learner.timeout == 100.0
    learner.new_attempt()  # the next attempt's slow start is warm-up again; what was learned stays
    for t in (0.0, 500.0, 501.0):
        learner.observe(t)
    assert learner.timeout == 100.0
    assert TimeoutLearner().timeout is None


def test_auto_learns_says_so_then_stops_a_hang_at_the_learned_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hangs_module, "LEARN_EVERY", 0.01)
    job = Job("auto")
    assert job.hangs.facts() == {"hang_timeout": "auto: learning"}
    job.hangs.learner = TimeoutLearner(factor=5.0, floor=0.3, warmup=1)
    job.hangs.started(0)
    job.loop.run_until(lambda: job.events, 5, "a learned limit")
    assert job.events[0][0] is EventKind.HANG_TIMEOUT_LEARNED and job.events[0][1]["timeout"] >= 0.3
    assert job.hangs.facts() == {"hang_timeout": f"auto: {job.hangs.limit():g} s learned"}
    assert job.said[0].startswith("--hang-timeout auto: ")
    job.answers["progress"] = STALE
    job.loop.run_until(lambda: job.failed, 5, "the hang")
    (hung,) = job.failed
    assert isinstance(hung, Hung) and hung.learned
    failure = as_failure(hung)
    assert failure is not None and f"(--hang-timeout auto, learned {hung.timeout:g})" in failure.what
    assert "rank 0: named a straggler before (0.50x (step))" in hung.stacks
    job.close()
