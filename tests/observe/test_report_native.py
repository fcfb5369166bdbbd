"""The report of ranks that died in C++ (torch's NCCL watchdog, a CUDA error): the root cause's own lines
say why (its `terminate called` and `what():`, not twenty lines of C++ frames), and the survivors that
aborted on a NCCL timeout or a lost peer after it are marked as following it, not shown as crashes of
their own (issue 24, item 5). Recorded stderr (tests/support/native_stderr/); milliseconds."""

from __future__ import annotations

import signal

import pytest
from detlaunch.observe.report import format_report
from detlaunch.outcome import Failure, FailureKind, JobResult, RankStatus
from support.native_stderr import ILLEGAL_ACCESS, REMOTE_ERROR, REMOTE_ERROR_PYTHON, TIMEOUT, tail

pytestmark = pytest.mark.timeout(10)

ABRT = 128 + signal.SIGABRT


def abort(rank: int, wall: float, lines: list[str], **kw: object) -> RankStatus:
    return RankStatus(rank=rank, node_rank=rank // 4, exit_code=ABRT, signal=signal.SIGABRT, tail=tuple(lines),
                      wall=wall, **kw)  # type: ignore[arg-type]


def report_of(cause: RankStatus, *others: RankStatus) -> list[str]:
    failure = Failure(f"rank {cause.rank} on node {cause.node_rank} (10.0.0.1) killed by SIGABRT", ABRT,
                      rank=cause, tail=cause.tail, tail_of=f"rank {cause.rank}", at=cause.wall, kind=FailureKind.RANK)
    return format_report(JobResult(ABRT, (cause, *others), failure))


def test_the_survivors_that_aborted_after_the_root_cause_are_marked_as_following_it() -> None:
    cause = abort(3, 100.0, tail(ILLEGAL_ACCESS))
    lines = [line for line in report_of(
        cause,
        abort(0, 100.4, tail(REMOTE_ERROR)),  # its watchdog saw rank 3's process go: ncclRemoteError
        abort(1, 100.5, tail(TIMEOUT)),
        RankStatus(rank=2, node_rank=0, exit_code=1, tail=tuple(tail(REMOTE_ERROR_PYTHON)), wall=100.6),
        abort(4, 99.0, tail(TIMEOUT)),  # before the root cause: its own
        abort(5, 100.7, tail(ILLEGAL_ACCESS)),  # a CUDA error of its own, whenever it came
        RankStatus(rank=6, node_rank=1, exit_code=143, signal=15, wall=100.8, stopped=True),
    ) if line.startswith("detlaunch:   rank ")]
    assert lines == [
        "detlaunch:   rank 0 (node 0): killed by SIGABRT (aborted after rank 3 failed: NCCL network or peer error)",
        "detlaunch:   rank 1 (node 0): killed by SIGABRT (aborted after rank 3 failed: NCCL collective timeout)",
        "detlaunch:   rank 2 (node 0): exit 1 (failed after rank 3 failed: NCCL network or peer error)",
        "detlaunch:   rank 3 (node 0): killed by SIGABRT (root cause)",
        "detlaunch:   rank 4 (node 1): killed by SIGABRT",
        "detlaunch:   rank 5 (node 1): killed by SIGABRT",
        "detlaunch:   rank 6 (node 1): killed by SIGTERM (stopped by detlaunch)",
    ]


def test_the_root_causes_lines_are_its_terminate_line_and_what_it_says() -> None:
    report = report_of(abort(1, 100.0, tail(TIMEOUT)))
    start = report.index("detlaunch: last stderr lines of rank 1:")
    shown = [line.removeprefix("detlaunch:   | ") for line in report[start + 1 :] if line.startswith("detlaunch:   | ")]
    assert shown[0] == "terminate called after throwing an instance of 'c10::DistBackendError'"
    assert "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2415, OpType=ALLREDUCE" in shown[1]
    assert shown[2].startswith("Exception raised from checkTimeout at ") and len(shown) == 3
