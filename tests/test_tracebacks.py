"""The one traceback reader (tracebacks.py), on real tracebacks: Python's own formatting, exception groups,
torch's "[rankN]: " prefix; and the end report and the restart policy reading the same exception from the same
tail. Milliseconds, no processes."""

from __future__ import annotations

import signal
import traceback
from collections.abc import Callable

import pytest
from detlaunch.observe.report import CUT, explaining_lines, format_report
from detlaunch.outcome import Failure, FailureKind, JobResult, RankStatus, RestartClass
from detlaunch.restarts.attempts import attempt_end_from_verdict
from detlaunch.restarts.policy import RestartPolicy
from detlaunch.tracebacks import last_traceback

pytestmark = pytest.mark.timeout(10)

WARNING = "[W1201 08:40:12.123 ProcessGroupGloo.cpp:123] Warning: destroy_process_group() was not called"


def tail_of(raise_it: Callable[[], object]) -> list[str]:
    """The stderr lines a rank prints when `raise_it` raises uncaught: Python's own formatting."""
    try:
        raise_it()
    except BaseException as e:  # noqa: BLE001 - any exception is the point
        return "".join(traceback.format_exception(e)).splitlines()
    raise AssertionError("did not raise")


def torch_prefixed(lines: list[str], rank: int = 1) -> list[str]:
    """What torch.distributed's excepthook prints once a process group exists."""
    return [f"[rank{rank}]: {line}" for line in lines]


def boom() -> None:
    raise ValueError("boom")


def import_missing() -> None:
    __import__("no_such_module_for_detlaunch_tests")


def chained() -> None:
    try:
        import_missing()
    except ImportError as e:
        raise RuntimeError("could not load the model") from e


def group() -> None:
    try:
        boom()
    except ValueError as e:
        raise ExceptionGroup("two loaders failed", [e, ExceptionGroup("inner", [KeyError("k")])]) from None


def group_then_handled() -> None:
    try:
        group()
    except ExceptionGroup:
        raise OSError("disk full while saving") from None


def group_of_imports() -> None:
    try:
        import_missing()
    except ImportError as e:
        raise ExceptionGroup("workers could not start", [e]) from None


# Each sample: the rank's stderr tail, and the exception line that ended its last traceback.
SAMPLES: dict[str, tuple[list[str], str]] = {
    "python": (tail_of(boom), "ValueError: boom"),
    "chained": (tail_of(chained), "RuntimeError: could not load the model"),
    "group": (tail_of(group), "ExceptionGroup: two loaders failed (2 sub-exceptions)"),
    "group, then a handler's own": (tail_of(group_then_handled), "OSError: disk full while saving"),
    "torch-prefixed": (torch_prefixed(tail_of(chained)), "RuntimeError: could not load the model"),
    "torch-prefixed group": (torch_prefixed(tail_of(group)), "ExceptionGroup: two loaders failed (2 sub-exceptions)"),
    "warnings after it": ([*tail_of(boom), WARNING, "Exception ignored in atexit callback"], "ValueError: boom"),
    "header cut off": (tail_of(chained)[-4:], "RuntimeError: could not load the model"),
}


@pytest.mark.parametrize("name", SAMPLES)
def test_the_last_traceback_and_its_exception_line(name: str) -> None:
    tail, exception = SAMPLES[name]
    tb = last_traceback(tail)
    assert tb is not None and tb.exception == exception
    assert tb.exception_name == exception.split(":")[0]
    assert tb.cut == (name == "header cut off")
    assert set(tb.lines) <= set(tail) and WARNING not in tb.lines  # as printed: prefixes kept, nothing after it


@pytest.mark.parametrize("name", SAMPLES)
def test_the_report_and_the_restart_policy_read_the_same_exception(name: str) -> None:
    """A rank's failure, as the verdict makes it: the report shows the exception line that the restart
    policy classes it by and that the crash-loop breaker compares."""
    tail, exception = SAMPLES[name]
    rank = RankStatus(rank=1, node_rank=0, exit_code=1, tail=tuple(tail), host="127.0.0.1")
    failure = Failure("rank 1 on node 0 (127.0.0.1) exited with code 1", 1, rank=rank, tail=rank.tail,
                      tail_of="rank 1", kind=FailureKind.RANK)
    report = format_report(JobResult(1, (rank,), failure))
    shown = [line.removeprefix("detlaunch:   | ") for line in report if line.startswith("detlaunch:   | ")]
    end = attempt_end_from_verdict(1, failure, None, 1, started=True, policy=RestartPolicy(),
                                   started_at=0.0, ended_at=1.0)
    assert end.cause == exception and end.exception == exception.split(":")[0]
    assert any(line.endswith(exception) for line in shown), shown
    assert WARNING not in shown


def test_a_user_error_is_read_through_torchs_prefix() -> None:
    tail = torch_prefixed(tail_of(import_missing), rank=3)
    rank = RankStatus(rank=3, node_rank=0, exit_code=1, tail=tuple(tail))
    failure = Failure("rank 3 exited with code 1", 1, rank=rank, tail=rank.tail, kind=FailureKind.RANK)
    end = attempt_end_from_verdict(1, failure, None, 1, started=True, policy=RestartPolicy(),
                                   started_at=0.0, ended_at=1.0)
    assert end.restart_class is RestartClass.USER_ERROR and end.exception == "ModuleNotFoundError"
    assert explaining_lines(tail)[0] == "[rank3]: Traceback (most recent call last):"


def test_an_exception_group_is_classed_by_its_own_exception_not_its_members() -> None:
    tb = last_traceback(tail_of(group_of_imports))
    assert tb is not None and tb.exception == "ExceptionGroup: workers could not start (1 sub-exception)"
    rank = RankStatus(rank=0, node_rank=0, exit_code=1, tail=tuple(tail_of(group_of_imports)))
    failure = Failure("rank 0 exited with code 1", 1, rank=rank, tail=rank.tail, kind=FailureKind.RANK)
    end = attempt_end_from_verdict(1, failure, None, 1, started=True, policy=RestartPolicy(),
                                   started_at=0.0, ended_at=1.0)
    assert end.restart_class is RestartClass.RANK_FAILED


def test_an_exception_group_is_shown_whole_and_ends_at_its_last_indented_line() -> None:
    tb_lines = tail_of(group)
    tb = last_traceback([WARNING, *tb_lines, WARNING])
    assert tb is not None and tb.lines == tuple(tb_lines)
    assert tb.lines[0] == "  + Exception Group Traceback (most recent call last):"
    assert "    | ValueError: boom" in tb.lines and "      | KeyError: 'k'" in tb.lines  # its members, shown


def test_a_cut_traceback_starts_at_its_first_frame_left_and_is_marked() -> None:
    tb_lines = tail_of(boom)
    cut = tb_lines[2:]  # the header and the first frame's first line fell out of the tail
    got = explaining_lines([*cut, WARNING])
    assert got[0] == CUT and got[-1] == "ValueError: boom"


def test_no_traceback_none_and_frames_without_an_exception_line_are_not_one() -> None:
    assert last_traceback(["epoch 3", "Loss: 0.25", "done"]) is None
    assert last_traceback([]) is None
    frames = [line for line in tail_of(boom) if line.startswith("  ")]
    assert last_traceback(frames) is None
    assert explaining_lines(["epoch 3", "Loss: 0.25"]) == ("epoch 3", "Loss: 0.25")


def test_a_tail_that_ends_inside_a_traceback_has_no_exception_line_yet() -> None:
    """The rank was killed while it printed (or is still printing): the traceback so far, no exception."""
    partial = tail_of(boom)[:-1]
    tb = last_traceback(partial)
    assert tb is not None and tb.exception == "" and tb.lines == tuple(partial)


def test_progress_bars_count_as_lines() -> None:
    bar = "\r".join(f"epoch 1: {p:3d}%|{'#' * (p // 10):<10}|" for p in range(0, 101, 25))
    tb = last_traceback([bar, *tail_of(boom)])
    assert tb is not None and tb.exception == "ValueError: boom" and tb.lines == tuple(tail_of(boom))


def test_a_killed_rank_has_no_exception_and_its_signature_says_how_it_ended() -> None:
    rank = RankStatus(rank=1, node_rank=0, exit_code=137, signal=signal.SIGKILL, tail=("step 7",))
    failure = Failure("rank 1 killed by SIGKILL", 137, rank=rank, tail=rank.tail, kind=FailureKind.RANK)
    end = attempt_end_from_verdict(1, failure, None, 137, started=True, policy=RestartPolicy(),
                                   started_at=0.0, ended_at=1.0)
    assert (end.signature, end.exception, end.restart_class) == ("killed by SIGKILL", "", RestartClass.RANK_FAILED)
