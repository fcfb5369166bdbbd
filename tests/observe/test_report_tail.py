"""The report's "last stderr lines": the lines that explain a rank's exit.

The tracebacks are real: raised here and formatted by Python's own traceback module, as a rank prints them
(milliseconds, no processes); one real torchrun job checks what the user sees end to end.
"""

from __future__ import annotations

import traceback
import warnings
from pathlib import Path

import pytest
from detlaunch.node.verdict import RankEnded, as_failure
from detlaunch.observe.report import NO_STDERR, explaining_lines, format_report
from detlaunch.outcome import Failure, JobResult, RankStatus
from support.helpers import free_port
from support.jobs import Launcher

pytestmark = pytest.mark.timeout(10)

WARNING = ("/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:12: UserWarning: "
           "This DataLoader will create 4 worker processes")


def real_traceback(chained: str = "") -> list[str]:
    """Lines of a real traceback, from a real exception (optionally chained: 'cause' or 'context')."""
    def inner() -> None:
        raise KeyError("missing")

    def outer() -> None:
        try:
            inner()
        except KeyError as e:
            if chained == "cause":
                raise RuntimeError("could not load the batch") from e
            if chained == "context":
                raise RuntimeError("could not load the batch")  # noqa: B904
            raise

    try:
        outer()
    except Exception as e:  # noqa: BLE001
        return "".join(traceback.format_exception(e)).splitlines()
    raise AssertionError("unreachable")


def test_a_traceback_is_shown_whole_and_the_warnings_around_it_are_not() -> None:
    tb = real_traceback()
    tail = [WARNING, "  super().__init__(loader)", *tb, WARNING, "  super().__init__(loader)"]
    assert explaining_lines(tail) == tuple(tb)
    assert tb[0] == "Traceback (most recent call last):" and tb[-1] == "KeyError: 'missing'"


@pytest.mark.parametrize("chained", ["cause", "context"])
def test_a_chained_exception_shows_the_last_traceback(chained: str) -> None:
    tb = real_traceback(chained)
    last = max(i for i, line in enumerate(tb) if line.startswith("Traceback"))
    assert last > 0  # really chained
    got = explaining_lines([*tb, "[W1201 08:00:00.000 ProcessGroupGloo.cpp:1] Warning: destroyed late"])
    assert got == tuple(tb[last:])
    assert got[-1] == "RuntimeError: could not load the batch"


def test_an_exception_group_is_shown_whole_and_what_follows_it_is_not() -> None:
    try:
        raise ExceptionGroup("two ranks' loaders failed", [ValueError("a"), KeyError("b")])
    except ExceptionGroup as e:
        tb = "".join(traceback.format_exception(e)).splitlines()
    assert tb[0] == "  + Exception Group Traceback (most recent call last):"
    assert explaining_lines([WARNING, *tb, WARNING]) == tuple(tb)


def test_without_a_traceback_the_last_lines_are_shown() -> None:
    tail = [f"step {i}" for i in range(30)] + ["fatal: loss is nan, giving up"]
    assert explaining_lines(tail, limit=5) == ("step 26", "step 27", "step 28", "step 29",
                                               "fatal: loss is nan, giving up")


def test_progress_bars_with_carriage_returns_count_as_lines() -> None:
    tb = real_traceback()
    bar = "\r".join(f"epoch 1: {p:3d}%|{'#' * (p // 10):<10}|" for p in range(0, 101, 25))
    assert explaining_lines([bar, *tb]) == tuple(tb)
    assert explaining_lines([bar], limit=2) == ("epoch 1:  75%|#######   |", "epoch 1: 100%|##########|")


def test_no_output_says_so() -> None:
    assert explaining_lines([]) == (NO_STDERR,)
    assert explaining_lines(["", "   ", "\r"]) == (NO_STDERR,)


def test_a_traceback_whose_first_lines_were_cut_starts_at_its_first_frame_left() -> None:
    tb = real_traceback()
    frames = [i for i, line in enumerate(tb) if line.startswith('  File "')]
    cut = tb[frames[0] + 1 :]  # the header and the first frame's first line fell out of the tail
    got = explaining_lines([*cut, WARNING])
    assert got[0] == "Traceback (most recent call last): (its first lines are cut)"
    assert got[1:] == tuple(tb[frames[1] :])  # from the first whole frame on


def test_a_long_traceback_keeps_its_header_and_its_exception_line() -> None:
    tb = real_traceback()
    long = [tb[0], *tb[1:3] * 20, *tb[3:]]
    got = explaining_lines(long, limit=10)
    assert len(got) == 10 and got[0] == tb[0] and got[1] == "..." and got[-1] == "KeyError: 'missing'"


def test_a_warning_text_is_not_taken_for_a_traceback() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("super().__init__(loader) is deprecated", DeprecationWarning, stacklevel=1)
    text = warnings.formatwarning(caught[0].message, caught[0].category, caught[0].filename, caught[0].lineno)
    lines = text.splitlines()
    assert explaining_lines(lines) == tuple(lines)


def test_the_report_shows_the_explaining_lines_of_the_root_cause() -> None:
    tb = real_traceback()
    rank = RankStatus(rank=1, node_rank=0, exit_code=1, tail=(*tb, WARNING))
    result = JobResult(exit_code=1, ranks=(rank,),
                       failure=Failure(what="rank 1 exited with code 1", exit_code=1, rank=rank,
                                       tail=rank.tail, tail_of="rank 1"))
    report = format_report(result)
    assert report[1] == "detlaunch: last stderr lines of rank 1:"
    assert report[2 : 2 + len(tb)] == [f"detlaunch:   | {line}" for line in tb]
    assert not any(WARNING in line for line in report)
    silent = RankStatus(rank=1, node_rank=0, exit_code=3)
    result = JobResult(exit_code=3, ranks=(silent,),
                       failure=Failure(what="rank 1 exited with code 3", exit_code=3, rank=silent, tail_of="rank 1"))
    assert format_report(result)[1:3] == ["detlaunch: last stderr lines of rank 1:", f"detlaunch:   | {NO_STDERR}"]


def test_each_other_rank_is_marked_by_what_ended_it() -> None:
    cause = RankStatus(rank=3, node_rank=1, exit_code=3, wall=100.0)
    ranks = (RankStatus(rank=0, node_rank=0, exit_code=143, signal=15, wall=100.2),  # its launcher's SIGTERM
             RankStatus(rank=1, node_rank=0, exit_code=143, signal=15, wall=100.3, stopped=True),
             RankStatus(rank=2, node_rank=1, exit_code=143, signal=15, wall=99.0),  # before: a failure of its own
             RankStatus(rank=4, node_rank=1, exit_code=137, signal=9, wall=101.0, stopped=True, killed=True),
             RankStatus(rank=5, node_rank=1, exit_code=1, wall=101.0),
             RankStatus(rank=6, node_rank=1, exit_code=139, signal=11, wall=101.0),  # a crash of its own
             cause)
    failure = Failure(what="rank 3 on node 1 exited with code 3", exit_code=3, rank=cause, tail_of="rank 3", at=100.0)
    lines = [line for line in format_report(JobResult(exit_code=3, ranks=ranks, failure=failure))
             if line.startswith("detlaunch:   rank ")]
    assert lines == ["detlaunch:   rank 0 (node 0): killed by SIGTERM (after the root cause)",
                     "detlaunch:   rank 1 (node 0): killed by SIGTERM (stopped by detlaunch)",
                     "detlaunch:   rank 2 (node 1): killed by SIGTERM",
                     "detlaunch:   rank 3 (node 1): exit 3 (root cause)",
                     "detlaunch:   rank 4 (node 1): SIGKILLed by detlaunch (it had not stopped when asked)",
                     "detlaunch:   rank 5 (node 1): exit 1",
                     "detlaunch:   rank 6 (node 1): killed by SIGSEGV"]


def test_a_rank_killed_after_its_script_had_ended_says_so_plainly() -> None:
    """A rank killed after its script had ended: the report says how far it had come (here under
    --strict-teardown, or in an atexit handler), not just "killed by SIGABRT"."""
    done = RankStatus(rank=0, node_rank=0, exit_code=134, signal=6, wall=100.0, host="127.0.0.1", ended="finalizing")
    raised = RankStatus(rank=1, node_rank=0, exit_code=134, signal=6, wall=100.5, ended="raised")
    midway = RankStatus(rank=2, node_rank=0, exit_code=134, signal=6, wall=100.6)  # no mark: it died mid-script
    by_code = RankStatus(rank=3, node_rank=0, exit_code=3, wall=100.7, ended="exit 3")  # sys.exit(3): its own code
    in_atexit = RankStatus(rank=4, node_rank=0, exit_code=139, signal=11, wall=100.8, ended="finished")
    after_exit = RankStatus(rank=5, node_rank=0, exit_code=134, signal=6, wall=100.9, ended="exit 3")
    failure = as_failure(RankEnded(done))
    assert failure is not None and failure.what == (
        "rank 0 on node 0 (127.0.0.1) killed by SIGABRT after its script and its atexit handlers had finished (its "
        "work was done: Python was finalizing)")
    lines = [line for line in format_report(JobResult(134, (done, raised, midway, by_code, in_atexit, after_exit),
                                                       failure))
             if line.startswith("detlaunch:   rank ")]
    assert lines == [
        "detlaunch:   rank 0 (node 0): killed by SIGABRT after its script and its atexit handlers had finished (its "
        "work was done: Python was finalizing) (root cause)",
        "detlaunch:   rank 1 (node 0): killed by SIGABRT after its script had ended with an uncaught exception "
        "(Python was shutting down)",
        "detlaunch:   rank 2 (node 0): killed by SIGABRT",
        "detlaunch:   rank 3 (node 0): exit 3",
        "detlaunch:   rank 4 (node 0): killed by SIGSEGV after its script had finished (Python was running its atexit "
        "handlers)",
        "detlaunch:   rank 5 (node 0): killed by SIGABRT after its script had called sys.exit(3) (Python was shutting "
        "down)"]


def test_a_finished_job_names_a_rank_counted_as_finished_after_a_crash_in_teardown() -> None:
    forgiven = RankStatus(rank=1, node_rank=0, exit_code=0, wall=100.0, ended="finalizing", teardown_signal=6)
    plain = RankStatus(rank=0, node_rank=0, exit_code=0, wall=100.0, ended="finalizing")
    assert format_report(JobResult(0, (plain, forgiven), None, duration=2.5)) == [
        "detlaunch: job finished: 2 rank(s) exited 0 in 2.50 s",
        "detlaunch:   rank 1 (node 0): exit 0 (killed by SIGABRT while Python finalized, after its script and its "
        "atexit handlers had finished: counted as finished)"]


@pytest.mark.timeout(120)
def test_a_real_rank_that_raises_then_warns_shows_its_traceback(launcher: Launcher, tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(
        "import atexit, os, sys, warnings\n"
        "atexit.register(lambda: print('UserWarning: super().__init__(loader)', file=sys.stderr))\n"
        "warnings.warn('before the failure')\n"
        "if os.environ['RANK'] == '1':\n"
        "    def load(): raise ValueError('bad batch 7')\n"
        "    load()\n")
    r = launcher.run("--layer", "torchrun", "--nproc-per-node", "2", "--master-port", str(free_port()), str(script))
    assert r.returncode == 1, r.output
    report = r.stderr[r.stderr.index("detlaunch: last stderr lines of rank 1:"):].splitlines()
    shown = [line.removeprefix("detlaunch:   | ") for line in report[1:] if line.startswith("detlaunch:   | ")]
    assert shown[0] == "Traceback (most recent call last):", r.stderr
    assert shown[-1] == "ValueError: bad batch 7", r.stderr
    assert not [line for line in shown if "Warning" in line], r.stderr
