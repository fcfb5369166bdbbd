"""The attempt bookkeeping (attempts.py): what the chief records and decides between attempts. Milliseconds."""

from __future__ import annotations

import random

from detlaunch.outcome import AttemptEnd, Failure, FailureKind, RankStatus, RestartClass
from detlaunch.restarts.attempts import Attempts, attempt_end_from_verdict
from detlaunch.restarts.policy import RestartPolicy

POLICY = RestartPolicy(max_restarts=1, backoff_initial=0.0, backoff_cap=0.0)


def rank_failure(code: int = 3) -> Failure:
    status = RankStatus(rank=1, node_rank=1, exit_code=code, host="127.0.0.2")
    return Failure(f"rank 1 on node 1 (127.0.0.2) exited with code {code}", code, rank=status, kind=FailureKind.RANK)


def lost() -> Failure:
    return Failure("lost node 1 (127.0.0.2): its detlaunch closed the connection", 1, kind=FailureKind.NODE_LOST)


def end(attempt: int, failure: Failure | None, code: int, interrupted_by: int | None = None) -> AttemptEnd:
    return attempt_end_from_verdict(attempt, failure, interrupted_by, code, started=True, policy=POLICY,
                                    started_at=10.0, ended_at=12.5)


def test_a_finished_attempt_ends_the_job() -> None:
    a = Attempts(POLICY, random.Random(0))
    decision = a.ended(end(1, None, 0))
    assert not decision.restart and decision.why == "attempt 1 finished"
    assert a.history[0].restart_class is None
    assert a.report()[1] == "detlaunch:   attempt 1: finished after 2.5 s (exit 0)"


def test_a_failed_rank_restarts_once_then_the_budget_is_spent() -> None:
    a = Attempts(POLICY, random.Random(0))
    first = a.ended(end(1, rank_failure(3), 3))
    assert first.restart and first.next_attempt == 2 and first.why == "restart 1 of 1 in 0.0 s"
    assert a.restarting() == "attempt 1 failed (exit 3): restart 1 of 1 in 0.0 s"
    a.wait()
    assert not a.running and a.number == 1
    a.begin(2)
    assert a.running and a.number == 2 and a.due is None
    second = a.ended(end(2, rank_failure(4), 4))
    assert not second.restart and second.why == "all 1 restarts used: not restarting"
    assert [e.attempt for e in a.history] == [1, 2]


def test_a_lost_node_is_retried_and_named_in_the_line_the_chief_prints() -> None:
    a = Attempts(POLICY, random.Random(0))
    decision = a.ended(end(1, lost(), 1))
    assert a.history[0].restart_class is RestartClass.NODE_LOST
    assert decision.restart and "(a lost node: not counted against --max-restarts)" in decision.why
    assert a.restarting().startswith("attempt 1 failed (lost node 1 (127.0.0.2): its detlaunch closed the "
                                     "connection): restart 1 of 1")
    # Another failure of the code still has its own restart: lost nodes are counted apart.
    a.begin(2)
    assert a.ended(end(2, rank_failure(3), 3)).restart


def test_a_stop_between_attempts_says_the_next_one_never_started() -> None:
    a = Attempts(POLICY, random.Random(0))
    a.ended(end(1, rank_failure(3), 3))
    a.wait()
    decision = a.stopped_waiting("lost node 1 (127.0.0.2): it did not join again within 40 s (--start-timeout)")
    assert not decision.restart
    assert a.report()[-1] == "detlaunch:     -> lost node 1 (127.0.0.2): it did not join again within 40 s " \
                             "(--start-timeout) before attempt 2 started: not restarting"


def test_the_users_signal_is_never_restarted() -> None:
    a = Attempts(RestartPolicy(max_restarts=5), random.Random(0))
    decision = a.ended(end(1, None, 130, interrupted_by=2))
    assert a.history[0].restart_class is RestartClass.INTERRUPTED and a.history[0].what == "interrupted by SIGINT"
    assert not decision.restart and decision.why == "interrupted by a signal: not restarting"


def test_no_attempt_ended_no_report() -> None:
    assert Attempts(POLICY).report() == []
