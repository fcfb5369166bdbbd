"""Grouping every rank's stack into a few lines and naming the suspects: pure, milliseconds."""

from __future__ import annotations

import dataclasses
import json

from detlaunch.stacks.groups import (
    describe_stack,
    format_json,
    format_text,
    format_unavailable,
    format_who,
    group_stacks,
    is_library,
    short_file,
)
from detlaunch.stacks.pyspy import Frame, ProcessStack, ThreadStack, Unavailable

SITE = "/venv/lib/python3.11/site-packages"
C10D = f"{SITE}/torch/distributed/distributed_c10d.py"
LOGGER = f"{SITE}/torch/distributed/c10d_logger.py"


def stack(*frames: Frame, stopped: bool = False, helpers: tuple[ThreadStack, ...] = ()) -> ProcessStack:
    return ProcessStack(1, (*helpers, ThreadStack("MainThread", 1, False, frames)), stopped)


def in_all_reduce(line: int = 88) -> ProcessStack:
    return stack(Frame("all_reduce", C10D, 2806, "work.wait()"), Frame("wrapper", LOGGER, 81),
                 Frame("step", "/job/train.py", line), Frame("<module>", "/job/train.py", 120))


def sleeping() -> ProcessStack:
    return stack(Frame("load_batch", "/job/data.py", 41, "time.sleep(30)"), Frame("step", "/job/train.py", 80),
                 Frame("<module>", "/job/train.py", 120))


def test_who_names_the_ranks_and_their_nodes() -> None:
    assert format_who([(0, 0), (2, 1), (3, 1)]) == "ranks 0,2-3 (node 0, 1)"
    assert format_who([(1, 0)]) == "rank 1 (node 0)"
    assert format_who([(r, r // 8) for r in range(32)]) == "ranks 0-31 (nodes 0-3)"


def test_library_and_user_files() -> None:
    assert is_library(C10D) and is_library("/usr/lib/python3.11/threading.py") and is_library("<frozen runpy>")
    assert not is_library("/job/train.py")
    assert short_file(C10D) == "torch/distributed/distributed_c10d.py"
    assert short_file("/usr/lib/python3.11/threading.py") == "threading.py"
    assert short_file("/job/train.py") == "train.py"


def test_a_stack_reads_as_the_blocking_call_the_innermost_library_frame_and_the_users_frame() -> None:
    assert describe_stack(in_all_reduce()) == "work.wait <- all_reduce <- step (train.py:88)"
    assert describe_stack(sleeping()) == "time.sleep <- load_batch (data.py:41)"
    assert describe_stack(stack(Frame("wait", "/usr/lib/python3.11/threading.py", 320, "waiter.acquire()"))) == \
        "waiter.acquire <- wait (threading.py:320)"
    assert describe_stack(stack(Frame("spin", "/job/t.py", 3, "x += 1"))) == "spin (t.py:3)"
    assert describe_stack(stack()) == "(no Python frames)"
    assert describe_stack(dataclass_stopped(sleeping())) == "[SIGSTOPped] time.sleep <- load_batch (data.py:41)"


def test_a_rank_whose_script_had_ended_says_so_instead_of_no_python_frames() -> None:
    """Issue 23: ranks "blocked in loss.backward()" showed "(no Python frames)". They were not blocked: gloo
    had failed their collective, the exception had ended their script (its traceback ends in loss.backward),
    and Python was shutting down; py-spy then sees one unnamed thread without frames. The rank's end mark
    (its progress file, stacks/query.py) says so, and the line says it plainly; they group apart."""
    in_shutdown = ProcessStack(1, (ThreadStack("0x7f0", 0x7F0, True, ()),), ended="raised")  # as py-spy shows it
    assert describe_stack(in_shutdown) == ("(no Python frames: its script had ended with an uncaught exception, "
                                           "Python is shutting down)")
    in_atexit = dataclasses.replace(sleeping(), ended="finished")
    assert describe_stack(in_atexit) == ("[its script had finished, Python is shutting down] time.sleep <- "
                                         "load_batch (data.py:41)")
    report = group_stacks({(0, 0): in_shutdown, (1, 0): in_all_reduce(), (2, 0): in_shutdown})
    assert format_text(report) == [
        "ranks 0,2 (node 0): (no Python frames: its script had ended with an uncaught exception, Python is "
        "shutting down)",
        "rank 1 (node 0): work.wait <- all_reduce <- step (train.py:88)  [suspect: stack differs from the "
        "majority's (2 ranks)]"]


def dataclass_stopped(s: ProcessStack) -> ProcessStack:
    return ProcessStack(s.pid, s.threads, stopped=True)


def test_a_hundred_ranks_read_as_a_few_lines_with_the_odd_one_out_marked() -> None:
    results: dict[tuple[int, int], ProcessStack | Unavailable] = {(r, r // 50): in_all_reduce() for r in range(98)}
    results[1, 0] = sleeping()
    results[98, 1] = Unavailable(9, "permission", "permission denied: py-spy may not ptrace it (...)")
    results[99, 1] = Unavailable(9, "permission", "permission denied: py-spy may not ptrace it (...)")
    report = group_stacks(results)
    assert format_text(report) == [
        "ranks 0,2-97 (node 0, 1): work.wait <- all_reduce <- step (train.py:88)",
        "rank 1 (node 0): time.sleep <- load_batch (data.py:41)  "
        "[suspect: stack differs from the majority's (97 ranks)]",
        "ranks 98-99 (node 1): no stack: permission denied: py-spy may not ptrace it (...)",
    ]
    assert [(s.rank, s.node) for s in report.suspects] == [(1, 0)]


def test_busy_ranks_sampled_at_different_lines_and_their_helper_threads_group_together() -> None:
    helper = ThreadStack("pin_memory", 2, False, (Frame("loop", f"{SITE}/torch/utils/data/_utils/pin_memory.py", 9),))
    a = stack(Frame("forward", "/job/model.py", 10), Frame("step", "/job/train.py", 50))
    b = stack(Frame("forward", "/job/model.py", 14), Frame("step", "/job/train.py", 50), helpers=(helper,))
    c = stack(Frame("forward", "/job/model.py", 14), Frame("step", "/job/train.py", 51))  # a different call site
    report = group_stacks({(0, 0): a, (1, 0): b, (2, 0): c})
    assert [[r for r, _ in g.ranks] for g in report.groups] == [[0, 1], [2]]
    assert report.groups[1].suspect


def test_with_no_majority_the_rank_outside_the_collective_is_the_suspect() -> None:
    report = group_stacks({(0, 0): in_all_reduce(), (1, 0): sleeping()})
    assert format_text(report) == [
        "rank 0 (node 0): work.wait <- all_reduce <- step (train.py:88)",
        "rank 1 (node 0): time.sleep <- load_batch (data.py:41)  [suspect: not in the collective the others wait in]",
    ]
    assert not group_stacks({(0, 0): in_all_reduce(88), (1, 0): in_all_reduce(95)}).suspects  # no way to tell


def test_a_stopped_rank_is_a_suspect_even_with_the_others_stack() -> None:
    stopped = dataclass_stopped(in_all_reduce())
    report = group_stacks({(0, 0): in_all_reduce(), (1, 0): in_all_reduce(), (2, 0): stopped})
    assert format_text(report)[1] == \
        "rank 2 (node 0): [SIGSTOPped] work.wait <- all_reduce <- step (train.py:88)  [suspect: SIGSTOPped]"


def test_the_rank_that_stopped_making_progress_first_is_named() -> None:
    results = {(r, 0): in_all_reduce() for r in range(4)}
    report = group_stacks(results, last_progress={0: 100.0, 1: 100.4, 2: 95.0, 3: 100.2})
    assert [(s.rank, s.why) for s in report.suspects] == [
        (2, "stopped making progress first (5.0 s before the next rank)")]
    assert not group_stacks(results, last_progress={0: 100.0, 1: 100.4, 2: 99.5, 3: 100.2}).suspects


def test_json_has_the_groups_the_reasons_and_the_suspects() -> None:
    report = group_stacks({(0, 0): in_all_reduce(), (1, 0): sleeping(), (2, 1): in_all_reduce(),
                           (3, 1): Unavailable(5, "gone", "the process has exited")})
    data = json.loads(json.dumps(format_json(report)))
    assert [(g["ranks"], g["nodes"], g["suspect"] != "") for g in data["groups"]] == [([0, 2], [0, 1], False),
                                                                                     ([1], [0], True)]
    assert data["groups"][0]["summary"] == "work.wait <- all_reduce <- step (train.py:88)"
    assert data["groups"][0]["stack"]["threads"][0]["frames"][0]["code"] == "work.wait()"
    assert data["unavailable"] == [{"ranks": [3], "nodes": [1], "kind": "gone", "reason": "the process has exited"}]
    assert data["suspects"] == [{"rank": 1, "node": 0, "why": "stack differs from the majority's (2 ranks)"}]
    assert format_unavailable([(3, 1)], "the process has exited") == "rank 3 (node 1): no stack: the process has exited"


def test_full_text_shows_the_main_threads_frames_under_each_group() -> None:
    lines = format_text(group_stacks({(0, 0): sleeping()}), full=True)
    assert lines == ["rank 0 (node 0): time.sleep <- load_batch (data.py:41)",
                     "    load_batch (data.py:41): time.sleep(30)", "    step (train.py:80)",
                     "    <module> (train.py:120)"]


def test_the_blocking_call_is_read_from_the_innermost_source_line() -> None:
    def first(code: str) -> str:
        return describe_stack(stack(Frame("f", "/job/t.py", 1, code)))

    assert first("x = queue.get(timeout=5)") == "queue.get <- f (t.py:1)"
    assert first("print(line, flush=True)") == "print <- f (t.py:1)"  # a full stdout pipe blocks here
    assert first("return fut.result()") == "fut.result <- f (t.py:1)"
    assert first("while not done:") == "f (t.py:1)"
