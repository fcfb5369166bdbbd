"""Ranks that died in C++ (SIGABRT from torch's NCCL watchdog, a CUDA error), as the restart policy reads
them: told apart by what the C++ side printed, not all "killed by SIGABRT" (issue 24, item 5). Recorded
stderr (tests/support/native_stderr/), the chief's own bookkeeping (attempts.py); milliseconds."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
from detlaunch.outcome import AttemptEnd, Failure, FailureKind, ProcessEnd, RankStatus, RestartClass
from detlaunch.restarts.attempts import Attempts, attempt_end_from_verdict
from detlaunch.restarts.classify import classify, exception_class, infrastructure, short_name, signature
from detlaunch.restarts.policy import RestartPolicy
from support.native_stderr import ILLEGAL_ACCESS, REMOTE_ERROR, REMOTE_ERROR_PYTHON, TIMEOUT, another_run, tail

pytestmark = pytest.mark.timeout(10)

ABORT = ProcessEnd.killed(signal.SIGABRT)
POLICY = RestartPolicy(max_restarts=3, backoff_initial=0.0, backoff_cap=0.0)


def aborted(lines: list[str], rank: int = 1) -> Failure:
    status = RankStatus(rank=rank, node_rank=0, exit_code=ABORT.code, signal=signal.SIGABRT, tail=tuple(lines),
                        host="10.0.0.1")
    return Failure(f"rank {rank} on node 0 (10.0.0.1) killed by SIGABRT", ABORT.code, rank=status,
                   tail=tuple(lines), tail_of=f"rank {rank}", kind=FailureKind.RANK)


def ended(attempt: int, lines: list[str], policy: RestartPolicy = POLICY) -> AttemptEnd:
    return attempt_end_from_verdict(attempt, aborted(lines), None, ABORT.code, started=True, policy=policy,
                                    started_at=10.0, ended_at=12.5)


def run(policy: RestartPolicy, *tails: list[str]) -> Attempts:
    attempts = Attempts(policy, random.Random(0))
    for n, lines in enumerate(tails, start=1):
        attempts.ended(ended(n, lines, policy))
    return attempts


def test_a_nccl_timeout_and_an_illegal_memory_access_are_two_different_failures() -> None:
    timeout, illegal = signature(ABORT, tail(TIMEOUT)), signature(ABORT, tail(ILLEGAL_ACCESS))
    assert timeout == ("killed by SIGABRT: c10::DistBackendError: Watchdog caught collective operation timeout: "
                       "WorkNCCL(SeqNum=?, OpType=ALLREDUCE, NumelIn=8192, NumelOut=8192, Timeout(ms)=600000) ran "
                       "for ? milliseconds before timing out.")
    assert illegal == ("killed by SIGABRT: c10::DistBackendError: CUDA error: an illegal memory access was "
                       "encountered")
    assert signature(ABORT, ["frame #0: <unknown function> + 0x9caa4 (0x7f in libc.so.6)"]) == "killed by SIGABRT"
    # What the reproduction in the issue did: the two in a row no longer read as a crash loop.
    decision = run(POLICY, tail(TIMEOUT), tail(ILLEGAL_ACCESS)).decision
    assert decision is not None and decision.restart and decision.why == "restart 2 of 3 in 0.0 s"


@pytest.mark.parametrize("path", [TIMEOUT, ILLEGAL_ACCESS, REMOTE_ERROR, REMOTE_ERROR_PYTHON])
def test_the_same_failure_twice_has_the_same_signature(path: Path) -> None:
    end = ProcessEnd(1) if path is REMOTE_ERROR_PYTHON else ABORT
    assert signature(end, tail(path)) == signature(end, another_run(tail(path)))


def test_a_cpp_abort_is_a_failed_rank_retried_and_its_class_is_the_cpp_one() -> None:
    for path in (TIMEOUT, ILLEGAL_ACCESS, REMOTE_ERROR):
        assert classify(FailureKind.RANK, ABORT, tail(path), started=True) is RestartClass.RANK_FAILED
        assert exception_class(tail(path)) == "c10::DistBackendError"
    assert short_name("c10::DistBackendError") == short_name("torch.distributed.DistBackendError") == \
        "DistBackendError"
    assert exception_class(tail(REMOTE_ERROR_PYTHON)) == "torch.distributed.DistBackendError"


def test_a_nccl_timeout_or_network_error_is_infrastructure_an_illegal_memory_access_is_not() -> None:
    assert infrastructure(tail(TIMEOUT)) and infrastructure(tail(REMOTE_ERROR))
    assert infrastructure(tail(REMOTE_ERROR_PYTHON))
    assert not infrastructure(tail(ILLEGAL_ACCESS)) and not infrastructure(["ValueError: boom"])
    assert ended(1, tail(TIMEOUT)).infrastructure and not ended(1, tail(ILLEGAL_ACCESS)).infrastructure


def test_the_same_illegal_memory_access_twice_is_a_crash_loop() -> None:
    attempts = run(POLICY, tail(ILLEGAL_ACCESS), another_run(tail(ILLEGAL_ACCESS)))
    assert attempts.decision is not None and not attempts.decision.restart
    assert attempts.decision.why == ("attempt 2 failed the same way as attempt 1 (c10::DistBackendError: CUDA error: "
                                     "an illegal memory access was encountered): not restarting (crash loop)")


def test_the_same_nccl_timeout_again_is_retried_until_the_budget_is_spent() -> None:
    """A flaky link or a bad peer times out the same collective on every attempt as readily as code does:
    --max-restarts bounds it, not the crash-loop breaker (as for a lost node)."""
    timeouts = [another_run(tail(TIMEOUT), seed) for seed in range(1, 5)]
    attempts = run(POLICY, *timeouts[:3])
    assert attempts.decision is not None and attempts.decision.why == "restart 3 of 3 in 0.0 s"
    assert len({e.signature for e in attempts.history}) == 1
    attempts.ended(ended(4, timeouts[3]))
    assert attempts.decision.why == "all 3 restarts used: not restarting"
    assert attempts.restarting().startswith("attempt 4 failed (c10::DistBackendError: Watchdog caught collective")


def test_no_restart_on_distbackenderror_stops_both_the_cpp_and_the_python_forms() -> None:
    policy = RestartPolicy(max_restarts=3, no_restart_on=("DistBackendError",))
    for lines in (tail(TIMEOUT), tail(REMOTE_ERROR)):
        decision = run(policy, lines).decision
        assert decision is not None and decision.why == "DistBackendError is in --no-restart-on: not restarting"
    python = attempt_end_from_verdict(1, Failure("rank 4 exited with code 1", 1, rank=RankStatus(4, 0, 1),
                                                 tail=tuple(tail(REMOTE_ERROR_PYTHON)), kind=FailureKind.RANK),
                                      None, 1, started=True, policy=policy, started_at=0.0, ended_at=1.0)
    assert not policy.decide([python], random.Random(0)).restart


def test_the_attempts_report_names_what_the_cpp_side_said() -> None:
    attempts = run(POLICY, tail(TIMEOUT), tail(ILLEGAL_ACCESS))
    lines = attempts.report()
    assert lines[1] == ("detlaunch:   attempt 1: rank-failed after 2.5 s: rank 1 on node 0 (10.0.0.1) killed by "
                        "SIGABRT (c10::DistBackendError: Watchdog caught collective operation timeout: WorkNCCL("
                        "SeqNum=?, OpType=ALLREDUCE, NumelIn=8192, NumelOut=8192, Timeout(ms)=600000) ran for ? "
                        "milliseconds before timing out.)")
    assert lines[3].endswith("killed by SIGABRT (c10::DistBackendError: CUDA error: an illegal memory access was "
                             "encountered)")
