"""The verdict, fed typed events as the supervisor would, over every case of the fault matrix (milliseconds)."""

from __future__ import annotations

import signal

import pytest
from detlaunch.node.verdict import (
    ChiefLost,
    ChiefVerdict,
    ChildExited,
    Decision,
    Interrupted,
    NodeLost,
    RankEnded,
    RemoteFailure,
    StartFailed,
    Verdict,
    as_failure,
    naming_the_node,
)
from detlaunch.outcome import Failure, FailureKind, ProcessEnd, RankStatus

WORKER = "127.0.0.2"


def rank(r: int, code: int | None = 0, *, node: int = 0, sig: int | None = None, at: float = 10.0,
         stopped: bool = False, lost: bool = False, killed: bool = False) -> RankEnded:
    return RankEnded(RankStatus(rank=r, node_rank=node, exit_code=code, signal=sig, wall=at, stopped=stopped,
                                lost=lost, killed=killed, host=WORKER if node else "127.0.0.1",
                                tail=(f"rank {r} said goodbye",)))


def launcher(code: int, at: float = 20.0) -> ChildExited:
    return ChildExited("torchrun", 4242, ProcessEnd(code), daemon=False, node=0, at=at)


def test_a_clean_end_is_no_failure() -> None:
    v = Verdict()
    assert v.add(rank(0)) is Decision.IGNORED
    assert v.add(launcher(0)) is Decision.IGNORED
    assert (v.failure, v.exit_code, v.stopping) == (None, 0, False)


def test_a_rank_exit_code_is_the_job_exit_code() -> None:
    v = Verdict()
    assert v.add(rank(1, 3)) is Decision.FIRST
    assert v.exit_code == 3 and v.stopping
    assert v.failure is not None and v.failure.what == "rank 1 on node 0 (127.0.0.1) exited with code 3"
    assert v.failure.kind is FailureKind.RANK and v.failure.tail == ("rank 1 said goodbye",)


@pytest.mark.parametrize(("event", "code", "what"), [
    (rank(3, 137, node=1, sig=signal.SIGKILL), 137, "rank 3 on node 1 (127.0.0.2) killed by SIGKILL"),
    (rank(3, 137, node=1, sig=signal.SIGKILL, lost=True), 137,
     "rank 3 on node 1 (127.0.0.2) its wrapper was killed before it could report (counted as SIGKILL)"),
    (NodeLost(1, WORKER, "its detlaunch closed the connection without saying goodbye", 1.0), 1,
     "lost node 1 (127.0.0.2): its detlaunch closed the connection without saying goodbye"),
    (ChiefLost("127.0.0.1", "the chief's detlaunch closed the connection", 1, 1.0), 1,
     "lost the chief (127.0.0.1): the chief's detlaunch closed the connection"),
    (ChildExited("sshd", 99, ProcessEnd.killed(signal.SIGTERM), daemon=True, node=1, at=1.0), 143,
     "sshd (pid 99) ended before the job did: killed by SIGTERM"),
    (ChildExited("sshd", 99, ProcessEnd(0), daemon=True, node=1, at=1.0), 1,
     "sshd (pid 99) ended before the job did: exit 0"),
    (launcher(1), 1, "torchrun exited: exit 1 (no rank on this node reported a failure first)"),
    (StartFailed("sshd on 127.0.0.2:1 did not answer", 1, 1.0), 1, "sshd on 127.0.0.2:1 did not answer"),
])
def test_each_fault_gives_its_cause_and_code(event: RankEnded, code: int, what: str) -> None:
    v = Verdict()
    assert v.add(event) is Decision.FIRST
    assert v.failure is not None and (v.failure.what, v.exit_code) == (what, code)


def test_what_a_worker_tells_the_chief_names_its_node() -> None:
    v = Verdict()
    v.add(launcher(1))
    assert v.failure is not None
    assert naming_the_node(v.failure, 1).what.startswith("node 1: torchrun exited: exit 1")
    v = Verdict()
    v.add(rank(3, 3, node=1))
    assert v.failure is not None and naming_the_node(v.failure, 1) == v.failure  # a rank's names its node


def test_the_earliest_failure_anywhere_wins() -> None:
    v = Verdict()
    survivor = rank(0, 1, at=12.0)  # a collective error, reported first
    cause = rank(3, 137, node=1, sig=signal.SIGKILL, at=11.0)  # the death that caused it, reported later
    assert v.add(survivor) is Decision.FIRST
    assert v.add(cause) is Decision.EARLIER
    assert v.failure is not None and v.failure.rank is not None and v.failure.rank.rank == 3
    assert v.add(rank(1, 1, at=13.0)) is Decision.IGNORED
    assert v.exit_code == 137


def test_ranks_detlaunch_stopped_are_never_the_cause() -> None:
    v = Verdict()
    v.add(rank(1, 3, at=10.0))
    assert v.add(rank(0, 143, sig=signal.SIGTERM, at=5.0, stopped=True)) is Decision.IGNORED
    assert v.failure is not None and v.failure.rank is not None and v.failure.rank.rank == 1


def test_a_rank_report_beats_its_launchers_exit() -> None:
    v = Verdict()
    v.add(rank(1, 3, at=10.0))
    assert v.add(launcher(1, at=10.5)) is Decision.IGNORED
    assert v.exit_code == 3


def test_a_launcher_exit_never_replaces_a_cause_even_if_noticed_earlier() -> None:
    v = Verdict()
    v.add(rank(1, 3, at=10.0))
    assert v.add(launcher(1, at=9.0)) is Decision.IGNORED
    assert v.failure is not None and v.failure.kind is FailureKind.RANK


def test_a_later_rank_report_with_an_earlier_time_replaces_a_launcher_exit() -> None:
    v = Verdict()
    v.add(launcher(1, at=10.5))
    assert v.add(rank(1, 3, at=10.0)) is Decision.EARLIER
    assert v.exit_code == 3


def test_a_start_failure_is_a_cause_only_when_nothing_else_is() -> None:
    v = Verdict()
    assert v.add(StartFailed("no peer", 0, 1.0)) is Decision.FIRST
    assert v.add(StartFailed("another", 0, 0.5)) is Decision.IGNORED
    assert v.failure is not None and v.failure.what == "no peer" and v.exit_code == 1


def test_the_users_interrupt_stands() -> None:
    v = Verdict()
    assert v.add(Interrupted(signal.SIGINT, 0, 1.0)) is Decision.FIRST
    assert v.add(rank(0, 130, sig=signal.SIGINT, at=0.5)) is Decision.IGNORED  # a rank it interrupted
    assert v.add(Interrupted(signal.SIGTERM, 0, 2.0)) is Decision.IGNORED
    assert (v.failure, v.interrupted_by, v.exit_code, v.stopping) == (None, signal.SIGINT, 130, True)


def test_a_failure_before_the_interrupt_keeps_its_exit_code() -> None:
    v = Verdict()
    v.add(rank(1, 3))
    assert v.add(Interrupted(signal.SIGINT, 0, 20.0)) is Decision.IGNORED
    assert v.exit_code == 3 and v.interrupted_by == signal.SIGINT


def test_an_interrupt_is_a_failure_for_the_other_nodes() -> None:
    failure = as_failure(Interrupted(signal.SIGTERM, 0, 1.0))
    assert failure is not None and (failure.what, failure.exit_code) == ("node 0 was interrupted by SIGTERM", 143)
    chief = Verdict()
    assert chief.add(RemoteFailure(failure)) is Decision.FIRST and chief.exit_code == 143


def test_the_chiefs_verdict_is_final_on_a_worker() -> None:
    v = Verdict()
    v.add(rank(3, 1, node=1, at=12.0))  # the worker's own view: its survivor's error
    chiefs = Failure("rank 0 on node 0 (127.0.0.1) killed by SIGKILL", 137, at=11.0, kind=FailureKind.RANK)
    assert v.add(ChiefVerdict(chiefs)) is Decision.FIRST
    assert v.add(rank(2, 9, node=1, at=1.0)) is Decision.IGNORED
    assert v.add(Interrupted(signal.SIGINT, 1, 13.0)) is Decision.IGNORED
    final = Failure("rank 1 on node 0 (127.0.0.1) exited with code 5", 5, at=10.0, kind=FailureKind.RANK)
    assert v.add(ChiefVerdict(final)) is Decision.EARLIER  # the end message: all nodes' reports considered
    assert v.failure == final and v.exit_code == 5


def test_a_clean_end_from_the_chief_changes_nothing() -> None:
    v = Verdict()
    v.add(ChiefVerdict(None))
    assert (v.failure, v.exit_code) == (None, 0)


def test_a_failure_survives_the_link_unchanged() -> None:
    v = Verdict()
    v.add(rank(3, 137, node=1, sig=signal.SIGKILL, killed=True))
    assert v.failure is not None
    assert Failure.from_json(v.failure.to_json()) == v.failure
