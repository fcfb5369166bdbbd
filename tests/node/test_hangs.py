"""Issue 12: a hung job is found, explained and stopped.

The parts first, in milliseconds (the progress watch with scripted ages and a fake clock, the
wrapper's output mark and traceback detection, the verdict's hang events, the report), then
real jobs: torchrun ranks in real gloo all_reduces, one of them SIGSTOPped, asleep, or hanging
in atexit after its traceback; heartbeats from one rank only; `detlaunch stacks` on a healthy job.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import detlaunch.exit_codes as exit_codes
import pytest
from detlaunch.errors import ConfigError
from detlaunch.node import hangs as hangs_module
from detlaunch.node.hangs import HangPolicy
from detlaunch.node.progress_watch import NodeProgress, ProgressWatch, last_seen, latest_progress, parse_ages
from detlaunch.node.verdict import Decision, Hung, RankEnded, StuckAfterTraceback, Verdict, as_failure
from detlaunch.observe.report import format_report
from detlaunch.outcome import JobResult, RankStatus
from detlaunch.progress import OUTPUT_RECORD, OutputMark, create_progress_file, read_progress
from detlaunch.rank import progress as progress_module
from detlaunch.rank.protocol import ends_traceback
from detlaunch.stacks.pyspy import ProcessStack
from detlaunch.stacks.query import StackCollector, node_answer, report_of
from detlaunch.system.eventloop import EventLoop
from detlaunch.testing.runner import MARKER_VAR
from support import paths
from support.helpers import free_port, report_line, wait_until
from support.jobs import SCRIPTS, Launcher

HANG = str(SCRIPTS / "hang.py")
RANKS = str(SCRIPTS / "ranks.py")


# -- the parts ----------------------------------------------------------------------------------


def test_the_job_hangs_only_when_no_rank_anywhere_moved_for_the_timeout() -> None:
    watch = ProgressWatch(10.0, started=100.0)
    assert watch.deadline() == 110.0 and not watch.hung(109.9) and watch.hung(110.0)  # ranks that never start
    watch.update(0, [(0, 1.0), (1, 8.0)], now=109.0)  # node 0: rank 0 moved 1 s ago
    watch.update(1, [(2, 9.5)], now=109.0)
    assert watch.deadline() == 118.0 and not watch.hung(117.0)
    watch.update(0, [(0, 30.0)], now=110.0)  # a late, stale answer never moves a rank back
    assert watch.hung(118.0) and watch.idle_for(118.0) == pytest.approx(10.0)
    assert watch.last_progress() == {0: 108.0, 1: 101.0, 2: 100.0}  # rank 2: before the job started


def test_a_node_whose_ranks_have_not_started_yet_is_not_hung(tmp_path: Path) -> None:
    # deepspeed's launcher imports torch on every node: a worker's ranks may start seconds after the chief's
    watch = ProgressWatch(8.0, started=100.0)
    watch.update(0, [(0, 7.0), (1, 7.0)], now=108.0)
    watch.update(1, [], now=108.0, starting=True)
    assert not watch.hung(108.0) and watch.deadline() == 116.0
    watch.update(1, [(2, 0.5), (3, 0.5)], now=110.0)  # its ranks start
    assert watch.deadline() == 117.5 and watch.hung(117.5)  # from now on its ranks are judged like any
    watch.update(1, [], now=111.0, starting=True)  # a node that never starts ranks: --start-timeout's to judge
    assert watch.deadline() == 119.0
    node = NodeProgress(str(tmp_path))
    assert node.starting()
    node.started_rank(2, 109.5)
    assert not node.starting()


def test_a_rank_that_beats_is_judged_by_its_beats_alone() -> None:
    assert latest_progress(5.0, output=None, beat=None) == 5.0  # its start
    assert latest_progress(5.0, output=9.0, beat=None) == 9.0  # any output line
    assert latest_progress(5.0, output=20.0, beat=7.0) == 7.0  # it beats: printing is not progress
    assert parse_ages({"ages": [[0, 1.5], ["x", 2], [1]]}) == [(0, 1.5)]


def test_node_progress_reads_the_heartbeat_and_the_wrappers_output_mark(tmp_path: Path) -> None:
    path = create_progress_file(str(tmp_path), 3)
    node = NodeProgress(str(tmp_path))
    node.started_rank(3, time.monotonic() - 50)
    assert node.ages([3], time.monotonic())[0][1] == pytest.approx(50, abs=1)  # nothing yet: since its start
    OutputMark(path).touch()
    out = read_progress(path, OUTPUT_RECORD)
    assert out is not None and read_progress(path) is None  # the output mark is not a heartbeat
    assert node.ages([3], time.monotonic())[0][1] < 1


def test_a_ranks_exit_is_progress_and_an_ended_rank_is_still_watched(tmp_path: Path) -> None:
    """A launcher lingering after its ranks ended is silent from their exit on, not from their start
    (a restarted attempt's ranks that finished between two checks read as hung)."""
    create_progress_file(str(tmp_path), 0)
    node = NodeProgress(str(tmp_path))
    now = time.monotonic()
    node.started_rank(0, now - 50)
    node.exited(0, now - 2)
    assert node.watched([]) == [0] and node.watched([4]) == [0, 4]
    assert node.ages(node.watched([]), now)[0][1] == pytest.approx(2, abs=0.5)
    watch = ProgressWatch(6, now - 50)
    watch.update(0, node.ages(node.watched([]), now), now)
    assert not watch.hung(now) and watch.hung(now + 4.5)

def test_status_reads_last_output_and_heartbeat_from_the_same_records(real_processes: None, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = create_progress_file(str(tmp_path), 0)
    create_progress_file(str(tmp_path), 1)
    assert last_seen(str(tmp_path), [0, 1, 2]) == {0: (None, None), 1: (None, None), 2: (None, None)}  # 2: no file
    before = time.time()
    OutputMark(path).touch()
    monkeypatch.setenv("DETLAUNCH_PROGRESS_FILE", path)
    monkeypatch.setattr(progress_module, "_buf", None)
    progress_module.progress(7)
    (output, beat), after = last_seen(str(tmp_path), [0])[0], time.time()
    assert output is not None and beat is not None and before <= output <= beat <= after
    assert last_seen(str(tmp_path), [1]) == {1: (None, None)}


@pytest.mark.parametrize(("stderr", "ended"), [
    (b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n", False),
    (b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    f()\nValueError: no\n", True),
    (b"warning\nValueError: old\n", False),
    (b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nValueError: no", False),  # no \n yet
])
def test_the_wrapper_sees_a_whole_traceback(stderr: bytes, ended: bool) -> None:
    assert ends_traceback(stderr) is ended


def test_a_hang_is_its_own_failure_with_its_own_exit_code_and_names_the_suspect() -> None:
    v = Verdict()
    event = Hung(10.0, 10.2, ("rank 1 (node 0): SIGSTOPped",), ("rank 0 (node 0): work.wait <- all_reduce",), 0, 5.0)
    assert v.add(event) is Decision.FIRST and v.exit_code == exit_codes.HANG == 124
    assert v.failure is not None
    assert v.failure.what == ("the job hung: no rank showed progress for 10.2 s (--hang-timeout 10); "
                              "suspect: rank 1 (node 0): SIGSTOPped")
    stopped = RankStatus(1, 0, 137, signal=9, stopped=True, wall=6.0)
    assert v.add(RankEnded(stopped)) is Decision.IGNORED  # the ranks it stops are consequences
    lines = format_report(JobResult(v.exit_code, (stopped,), v.failure))
    assert lines[1:3] == ["detlaunch: every rank's stack when the job hung:",
                          "detlaunch:   rank 0 (node 0): work.wait <- all_reduce"]


def test_a_rank_stuck_after_its_traceback_is_the_root_cause_with_its_traceback_first() -> None:
    v = Verdict()
    tail = ("Traceback (most recent call last):", '  File "t.py", line 3, in <module>', "RuntimeError: broke")
    assert v.add(StuckAfterTraceback(1, 0, "127.0.0.1", tail, 5.0, 3.0)) is Decision.FIRST
    assert v.exit_code == 1 and v.failure is not None
    result = JobResult(1, (RankStatus(1, 0, 143, signal=15, stopped=True),), v.failure,
                       stacks=("rank 1 (node 0): time.sleep <- linger (t.py:9)",))
    lines = format_report(result)
    assert lines[:6] == [
        "detlaunch: job failed: rank 1 on node 0 (127.0.0.1) printed a traceback and had not exited 5 s later",
        "detlaunch: last stderr lines of rank 1:", "detlaunch:   | Traceback (most recent call last):",
        'detlaunch:   |   File "t.py", line 3, in <module>', "detlaunch:   | RuntimeError: broke",
        "detlaunch: the running ranks' stacks before they were stopped:"]
    assert lines[6] == "detlaunch:   rank 1 (node 0): time.sleep <- linger (t.py:9)"


@pytest.mark.timeout(30)
def test_stacks_are_collected_off_the_loop_and_handed_back_to_it(real_processes: None) -> None:
    loop = EventLoop()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\ndef nap():\n    time.sleep(60)\nnap()"])
    answers: list[dict[str, object]] = []
    try:
        time.sleep(0.5)  # the test's own process: let it reach nap()
        node_answer(StackCollector(loop), "here", [(0, sleeper.pid), (1, 2**22 + 7)], 5.0, answers.append)
        assert answers == []  # not on the loop's time: the answer comes through the loop
        loop.run_until(lambda: answers, 20, "the node's stacks answer")
    finally:
        sleeper.kill()
        sleeper.wait()
        loop.close()
    report = report_of({"nodes": [{"node": 0, **answers[0]}]})
    assert [g.ranks for g in report.groups] == [((0, 0),)] and isinstance(report.groups[0].stack, ProcessStack)
    assert [(u.ranks, u.kind) for u in report.unavailable] == [(((1, 0),), "gone")]


def policy(loop: EventLoop, asked: list[str], failed: list[object], answers: dict[str, dict[str, object]],
           **kw: object) -> HangPolicy:
    def ask_job(what: str, args: object, answer: object) -> None:
        asked.append(what)
        answer(answers[what])  # type: ignore[operator]

    opts: dict[str, object] = {"node": 0, "host": "h", "run_dir": "/nonexistent", "is_chief": True,
                               "hang_timeout": 0.05, "dump_budget": 1.0, "ask_job": ask_job, "fail": failed.append,
                               "say": lambda _line: None, "live_ranks": lambda: [(0, 10), (1, 11)],
                               "active": lambda: True, **kw}
    return HangPolicy(loop, **opts)  # type: ignore[arg-type]


STACK = {"pid": 10, "stopped": False, "threads": [{"name": "MainThread", "thread_id": 1, "active": False,
         "owns_gil": False, "os_thread_id": 1, "frames": [{"function": "sleep", "file": "t.py", "line": 3,
                                                           "code": "time.sleep(9)"}]}]}
STOPPED = {**STACK, "pid": 11, "stopped": True}
JOB_STACKS = {"nodes": [{"node": 0, "ranks": [{"rank": 0, "pid": 10, "stack": STACK}]},
                        {"node": 1, "ranks": [{"rank": 1, "pid": 11, "stack": STOPPED}]}], "missing": []}


@pytest.mark.timeout(10)
def test_the_chief_asks_for_progress_at_the_deadline_and_rearms_while_a_rank_moves() -> None:
    loop, asked, failed = EventLoop(), [], []  # type: ignore[var-annotated]
    moving = {"nodes": [{"node": 0, "ages": [[0, 0.0]]}]}
    answers: dict[str, dict[str, object]] = {"progress": moving, "stacks": JOB_STACKS}
    hangs = policy(loop, asked, failed, answers)
    hangs.started(0)
    for _ in range(3):  # each check: a rank moved just now, so the timer is set again
        loop.run_once(timeout=1)
    assert asked == ["progress"] * 3 and failed == []
    answers["progress"] = {"nodes": [{"node": 0, "ages": [[0, 5.0]]}, {"node": 1, "ages": [[1, 5.0]]}]}
    loop.run_until(lambda: failed, 5, "the hang report")
    assert asked[-2:] == ["progress", "stacks"]
    (hung,) = failed
    assert isinstance(hung, Hung) and hung.suspects == ("rank 1 (node 1): SIGSTOPped",)
    assert hung.stacks == ("rank 0 (node 0): time.sleep <- sleep (t.py:3)",
                           "rank 1 (node 1): [SIGSTOPped] time.sleep <- sleep (t.py:3)  [suspect: SIGSTOPped]")
    hangs.close()
    loop.close()


def test_no_hang_watch_on_a_worker_or_without_a_timeout() -> None:
    loop = EventLoop()
    for kw in ({"is_chief": False}, {"hang_timeout": 0.0}):
        hangs = policy(loop, [], [], {}, **kw)
        hangs.started(0)
        assert hangs.watch is None and loop.next_timeout() is None
    loop.close()


@pytest.mark.timeout(10)
def test_dump_before_kill_the_chief_takes_the_stacks_then_stops_a_worker_waits_for_the_chief() -> None:
    loop, asked, stops = EventLoop(), [], []  # type: ignore[var-annotated]
    failure = as_failure(RankEnded(RankStatus(3, 1, 3, wall=1.0)))
    assert failure is not None
    chief = policy(loop, asked, [], {"stacks": JOB_STACKS})
    assert chief.dump_before_stop(failure, lambda: stops.append("chief")) and stops == ["chief"]
    assert asked == ["stacks"] and chief.dumped[0] == "rank 0 (node 0): time.sleep <- sleep (t.py:3)"
    worker = policy(loop, asked, [], {}, is_chief=False, dump_budget=0.01)
    assert worker.dump_before_stop(failure, lambda: stops.append("worker")) and worker.dumping
    assert asked == ["stacks"]  # a worker asks nobody: the chief takes every node's stacks
    # no stop from the chief: it stops on its own after the budget
    loop.run_until(lambda: not worker.dumping, 5, "the worker's stop after its dump budget")
    assert stops == ["chief", "worker"]
    off = policy(loop, asked, [], {}, dump_budget=0.0)
    assert not off.dump_before_stop(failure, lambda: None) and off.hold_time() == 0 and chief.hold_time() == 3.5
    hang = as_failure(Hung(1, 1, (), (), 0, 1.0))
    assert hang is not None and not chief.dump_before_stop(hang, lambda: None)  # its stacks are taken already
    loop.close()


@pytest.mark.timeout(10)
def test_dump_before_kill_each_node_stops_once_its_own_stacks_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chief tells every node to stop right after asking for the stacks (32 nodes need not wait
    for the slowest node's dump): a node's stop waits for its own answer to that question only."""
    taking: list[object] = []  # the answers being taken on this node, answered when the test says
    monkeypatch.setattr(hangs_module, "node_answer", lambda *args: taking.append(args[4]))
    loop, stops, sent = EventLoop(), [], []  # type: ignore[var-annotated]
    worker = policy(loop, [], [], {}, is_chief=False)
    worker.answer_stacks({"budget": 1.0}, sent.append)  # `detlaunch stacks` from a shell: holds no stop
    worker.stop_after_own_dumps(lambda: stops.append("asked by a shell"))
    assert stops == ["asked by a shell"]
    worker.answer_stacks({"budget": 1.0, "before_stop": True}, sent.append)  # the chief's dump before kill
    worker.stop_after_own_dumps(lambda: stops.append("chief's verdict"))  # came right after the question
    assert stops == ["asked by a shell"]  # the ranks run until their stacks are taken
    taking[1]({"ranks": ["stack"]})  # type: ignore[operator]
    assert sent == [{"ranks": ["stack"]}] and stops == ["asked by a shell", "chief's verdict"]  # answer first

    gathered: list[object] = []

    def ask_job(what: str, args: dict[str, object], answer: object) -> None:  # the chief's own part first
        gathered.append(answer)
        chief.answer_stacks(args, lambda _part: None)

    chief = policy(loop, [], [], {}, ask_job=ask_job)
    failure = as_failure(RankEnded(RankStatus(3, 1, 3, wall=1.0)))
    assert failure is not None and chief.dump_before_stop(failure, lambda: stops.append("chief"))
    assert chief.dumping and stops[-1] == "chief's verdict"  # not before its own ranks' stacks
    taking[2]({"ranks": []})  # type: ignore[operator]
    assert stops[-1] == "chief" and not chief.dumping and gathered  # the others' answers may come later
    chief.answer_stacks({"before_stop": True}, sent.append)
    chief.new_attempt()  # an attempt's end forgets a stop still waiting
    chief.stop_after_own_dumps(lambda: stops.append("next attempt"))
    assert stops[-1] == "next attempt"
    loop.close()


def test_a_stop_waiting_for_this_nodes_stacks_comes_even_if_sending_them_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    taking: list[object] = []
    monkeypatch.setattr(hangs_module, "node_answer", lambda *args: taking.append(args[4]))
    loop, stops = EventLoop(), []  # type: ignore[var-annotated]
    worker = policy(loop, [], [], {}, is_chief=False)

    def broken_send(_answer: object) -> None:
        raise OSError("the link is gone")

    worker.answer_stacks({"budget": 1.0, "before_stop": True}, broken_send)
    worker.stop_after_own_dumps(lambda: stops.append("stop"))
    with pytest.raises(OSError):
        taking[0]({"ranks": []})  # type: ignore[operator]
    assert stops == ["stop"] and worker.own_dumps == 0
    loop.close()


def test_stacks_gathered_for_an_attempt_that_a_restart_ended_are_not_the_next_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hangs_module, "node_answer", lambda *args: None)
    answers: list[Callable[[dict[str, object]], None]] = []
    loop = EventLoop()
    chief = policy(loop, [], [], {}, ask_job=lambda what, args, answer: answers.append(answer))
    failure = as_failure(RankEnded(RankStatus(3, 1, 3, wall=1.0)))
    assert failure is not None and chief.dump_before_stop(failure, lambda: None)
    chief.new_attempt()  # the restart came before the gathering's answer
    answers[0](JOB_STACKS)  # the stacks of the attempt that ended
    assert chief.dumped == ()
    loop.close()


@pytest.mark.timeout(10)
def test_a_traceback_then_still_running_fails_after_the_delay(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setattr(hangs_module, "TRACEBACK_DELAY", 0.01)
    loop, failed = EventLoop(), []  # type: ignore[var-annotated]
    live = [(0, 10), (1, 11)]
    hangs = policy(loop, [], failed, {}, live_ranks=lambda: live, proc=str(tmp_path))  # no schedstat: wall time
    hangs.traceback(1, ["Traceback (most recent call last):", "ValueError: x"], 7.0)
    hangs.traceback(0, ["Traceback (most recent call last):", "ValueError: y"], 7.0)
    live.remove((0, 10))  # rank 0 exited in time: its own exit is the report
    loop.run_once(timeout=1)
    loop.run_once(timeout=1)
    assert failed == [StuckAfterTraceback(1, 0, "h", ("Traceback (most recent call last):", "ValueError: x"),
                                          0.01, 7.0)]
    loop.close()


@pytest.mark.timeout(10)
def test_the_time_a_rank_waited_for_a_cpu_after_its_traceback_is_not_its_own(monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    """A loaded machine: the rank spent most of the delay in the run queue, exiting. It gets the rest."""
    delay = 0.2
    monkeypatch.setattr(hangs_module, "TRACEBACK_DELAY", delay)
    schedstat = tmp_path / "11" / "schedstat"
    schedstat.parent.mkdir()
    schedstat.write_text("5000 1000000 3\n")  # ns on a CPU, ns waiting for one, time slices
    loop, failed = EventLoop(), []  # type: ignore[var-annotated]
    hangs = policy(loop, [], failed, {}, live_ranks=lambda: [(1, 11)], proc=str(tmp_path))
    start = loop.clock()
    hangs.traceback(1, ["Traceback (most recent call last):", "ValueError: x"], 7.0)
    schedstat.write_text(f"6000 {1000000 + int(0.75 * delay * 1e9)} 9\n")  # 3/4 of the delay in the run queue
    loop.run_until(lambda: failed, 5, "the report of the stuck rank")
    assert loop.clock() - start >= 1.75 * delay
    assert failed == [StuckAfterTraceback(1, 0, "h", ("Traceback (most recent call last):", "ValueError: x"),
                                          delay, 7.0)]
    loop.close()


def test_cpu_wait_reads_the_run_queue_time_of_a_task(tmp_path: Path) -> None:
    from detlaunch.system.procs import cpu_wait

    assert cpu_wait(os.getpid()) is not None  # this kernel says
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "schedstat").write_text("123 2500000000 4\n")
    assert cpu_wait(7, str(tmp_path)) == 2.5
    assert cpu_wait(8, str(tmp_path)) is None  # gone


@pytest.mark.timeout(10)
def test_a_traceback_the_rank_went_on_from_is_not_a_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """logging.exception, "Exception ignored in ...": a line after the traceback, and the rank lives on."""
    from detlaunch.progress import OutputMark, create_progress_file

    monkeypatch.setattr(hangs_module, "TRACEBACK_DELAY", 0.05)
    loop, failed = EventLoop(), []  # type: ignore[var-annotated]
    marks = {rank: OutputMark(create_progress_file(str(tmp_path), rank)) for rank in (0, 1)}
    hangs = policy(loop, [], failed, {}, run_dir=str(tmp_path))
    for rank, mark in marks.items():
        mark.touch()  # the traceback's own lines
        hangs.traceback(rank, ["Traceback (most recent call last):", f"ValueError: {rank}"], 7.0)
    marks[0].touch()  # rank 0 printed on after it; rank 1 is silent
    loop.run_until(lambda: failed, 5, "the report of the silent rank")
    loop.run_once(timeout=0.2)
    assert failed == [StuckAfterTraceback(1, 0, "h", ("Traceback (most recent call last):", "ValueError: 1"),
                                          0.05, 7.0)]
    loop.close()


def test_hang_timeout_and_dump_budget_from_flag_variable_and_file() -> None:
    from detlaunch.planning.config import apply_defaults, build_parser, parse

    def options(argv: list[str], env: dict[str, str], file: dict[str, object]) -> dict[str, object]:
        parser = build_parser([])
        apply_defaults(parser, env, {"detlaunch": file} if file else {}, {}, "detlaunch.toml")
        return vars(parse(parser, [*argv, "train.py"], env)[0])

    assert (options([], {}, {})["hang_timeout"], options([], {}, {})["dump_budget"]) == (None, 1.5)  # report at 10 min
    assert options(["--hang-timeout", "AUTO"], {}, {})["hang_timeout"] == "auto"
    assert options([], {}, {"hang_timeout": "auto"})["hang_timeout"] == "auto"
    assert options([], {"DETLAUNCH_HANG_TIMEOUT": "30"}, {"hang_timeout": 20})["hang_timeout"] == 30.0
    assert options(["--hang-timeout", "40"], {}, {"hang_timeout": 20})["hang_timeout"] == 40.0
    assert options([], {}, {"dump_budget": 0})["dump_budget"] == 0.0
    with pytest.raises(ConfigError) as e:
        options(["--hang-timeout", "-1"], {}, {})
    assert str(e.value) == ("argument --hang-timeout: '-1' is out of range; valid: 0..604800 s, or auto "
                            "(see detlaunch --help)")


# -- real jobs ------------------------------------------------------------------------------------


def torchrun(launcher: Launcher, job_id: str, *extra: str, nproc: int = 2) -> list[str]:
    return ["--layer", "torchrun", "--nproc-per-node", str(nproc), "--master-port", str(free_port()),
            "--job-id", job_id, *extra]


def ask(launcher: Launcher, what: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "detlaunch", what, *args], env=launcher.env,
                          capture_output=True, text=True, timeout=30)


def rank_pid(launcher: Launcher, job_id: str, rank: int) -> int:
    status = ask(launcher, "status", job_id, "--format", "json")
    assert status.returncode == 0, status.stderr
    return next(int(r["pid"]) for n in json.loads(status.stdout)["nodes"] if n["answered_here"]
                for r in n["ranks"] if r["rank"] == rank)


def host_pid(launcher: Launcher, rank: int, script: str = "hang.py") -> int:
    """This shell's pid of `rank` of the test's job, whichever node (PID namespace) runs it."""
    marker, rank_var = f"{MARKER_VAR}={launcher.marker_value}".encode(), f"RANK={rank}".encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in env and rank_var in env and script.encode() in cmdline and b"run_wrapper.py" not in cmdline:
            found.append(int(entry))
    assert len(found) == 1, found
    return found[0]


def job_id() -> str:
    return f"hang-{uuid.uuid4().hex[:8]}"


@pytest.mark.timeout(200)
def test_a_rank_sigstopped_inside_an_all_reduce_is_named_and_the_job_stops_with_124(launcher: Launcher) -> None:
    job = job_id()
    run = launcher.start(*torchrun(launcher, job, "--hang-timeout", "10"), HANG,
                         env={"HANG": "loop", "STEP_SLEEP": "0.2"})
    run.wait_for_output("[rank=1] rank 1 step 3", timeout=150)
    os.kill(rank_pid(launcher, job, 1), signal.SIGSTOP)
    stopped_at = time.monotonic()
    stacks = ask(launcher, "stacks", job)  # while it hangs: a stopped rank can be read too
    assert stacks.returncode == 0, stacks.stderr
    assert re.search(r"^rank 1 \(node 0\): \[SIGSTOPped\] .*\[suspect: SIGSTOPped\]$", stacks.stdout, re.M), stacks
    r = run.wait(120)
    assert r.returncode == 124, r.output
    assert report_line(r.stderr).startswith("detlaunch: job failed: the job hung: no rank showed progress for ")
    assert "--hang-timeout 10); suspect: rank 1 (node 0): SIGSTOPped" in r.stderr, r.stderr
    assert re.search(r"^detlaunch:   rank 0 \(node 0\): work\.wait <- all_reduce <- <module> \(hang\.py:\d+\)$",
                     r.stderr, re.M), r.stderr
    assert "detlaunch: exit code 124" in r.stderr
    assert time.monotonic() - stopped_at < 10 + 20  # detected and stopped soon after the timeout (loaded machine)


@pytest.mark.timeout(240)
def test_on_two_nodes_the_chief_finds_a_sigstopped_rank_of_the_worker_and_both_exit_124(launcher: Launcher) -> None:
    job, port = job_id(), str(free_port())
    common = ["--layer", "torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--master-port", port, "--job-id", job, "--hang-timeout", "10", "--no-warm-ranks"]  # host_pid: by its
    env = {"HANG": "loop", "STEP_SLEEP": "0.2"}  # command line, which a warm rank shares with its template
    nodes = [launcher.start(*common, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}", HANG, env=env)
             for n in (0, 1)]
    nodes[1].wait_for_output("[rank=1] rank 1 step 3", timeout=180)
    os.kill(host_pid(launcher, 1), signal.SIGSTOP)
    chief, worker = nodes[0].wait(120), nodes[1].wait(120)
    assert (chief.returncode, worker.returncode) == (124, 124), chief.output + worker.output
    assert "suspect: rank 1 (node 1): SIGSTOPped" in report_line(chief.stderr), chief.stderr
    assert re.search(r"^detlaunch:   rank 0 \(node 0\): work\.wait <- all_reduce", chief.stderr, re.M), chief.stderr
    assert re.search(r"^detlaunch:   rank 1 \(node 1\): \[SIGSTOPped\]", chief.stderr, re.M), chief.stderr
    assert "suspect: rank 1 (node 1): SIGSTOPped" in report_line(worker.stderr)  # the chief's verdict


@pytest.mark.timeout(200)
def test_a_rank_asleep_before_the_collective_is_the_suspect(launcher: Launcher, tmp_path: Path) -> None:
    """The stack rule, with torch's Flight Recorder off (with it on, its suspect wins: test_flight_job.py)."""
    events = tmp_path / "events.jsonl"
    r = launcher.start(*torchrun(launcher, job_id(), "--hang-timeout", "10", "--events", str(events)), HANG,
                       env={"HANG": "sleep", "DETLAUNCH_FLIGHT_RECORDER": "0"}).wait(150)
    assert r.returncode == 124, r.output
    [hang] = [e for e in map(json.loads, events.read_text().splitlines()) if e["kind"] == "hang_detected"]
    assert 10 <= hang["details"]["silent_for"] < 60 and hang["rank"] is None, hang
    assert "suspect: rank 1 (node 0): not in the collective the others wait in" in report_line(r.stderr)
    assert re.search(r"^detlaunch:   rank 1 \(node 0\): time\.sleep <- <module> \(hang\.py:\d+\)", r.stderr, re.M)
    assert r.rank_lines(0)[-1].startswith("rank 0 steady")  # what it printed last before the hang
    assert "flight recorder" not in r.stderr  # turned off: not a word of it


@pytest.mark.timeout(200)
def test_a_rank_that_raises_then_hangs_in_atexit_fails_the_job_with_its_traceback(launcher: Launcher) -> None:
    r = launcher.start(*torchrun(launcher, job_id()), HANG, env={"HANG": "raise"}).wait(150)
    assert r.returncode == 1, r.output
    assert report_line(r.stderr) == ("detlaunch: job failed: rank 1 on node 0 (127.0.0.1) printed a traceback "
                                     "and had not exited 5 s later")
    lines = r.stderr.splitlines()
    start = lines.index("detlaunch: last stderr lines of rank 1:")
    assert lines[start + 1].endswith("Traceback (most recent call last):") and "RuntimeError: rank 1 broke" in \
        lines[start + 4], r.stderr  # its traceback first
    dump = lines.index("detlaunch: the running ranks' stacks before they were stopped:")
    after = r"\[its script had ended with an uncaught exception, Python is shutting down\] "  # it hangs in atexit
    assert dump > start and re.search(rf"rank 1 \(node 0\): {after}time\.sleep <- linger \(hang\.py:\d+\)",
                                      "\n".join(lines[dump:])), r.stderr  # where it hangs
    assert "rank 1 (node 0): " in r.stderr and "(root cause)" in r.stderr


HANDLED_TRACEBACKS = """
import logging, sys, time
for i in range(2):
    try:
        raise ValueError(f"handled {i}")
    except ValueError:
        logging.exception("caught it, going on")  # a whole traceback on stderr
    for step in range(7):
        print(f"step {i}.{step}", flush=True)
        time.sleep(1)
print("done", flush=True)
"""


@pytest.mark.timeout(120)
def test_a_rank_that_handles_its_tracebacks_and_goes_on_is_not_failed(launcher: Launcher, tmp_path: Path) -> None:
    script = tmp_path / "handled.py"
    script.write_text(HANDLED_TRACEBACKS)
    r = launcher.run("--layer", "direct", "--nproc-per-node", "2", "--master-port", str(free_port()), str(script),
                     timeout=100)
    assert r.returncode == 0, r.output
    assert r.rank_lines(1)[-1] == "done" and r.stderr.count("ValueError: handled 1") == 2, r.output


@pytest.mark.timeout(200)
def test_heartbeats_from_one_rank_keep_a_silent_job_alive_and_only_they_count(launcher: Launcher) -> None:
    # 16 s with no output at all, rank 0 beating: not hung (timeout 10). Then rank 0 prints but stops
    # beating: hung 10 s after its last beat, although it still prints.
    job = job_id()
    run = launcher.start(*torchrun(launcher, job, "--hang-timeout", "10"), HANG,
                         env={"BEAT": "1", "STEPS": "80", "STEP_SLEEP": "0.2", "HANG": "beat", "BEAT_FOR": "2"})
    run.wait_for_output("[rank=1] rank 1 initialized", timeout=120)

    def rows() -> dict[int, dict[str, object]] | None:  # status reads the records the hang watch reads
        answer = ask(launcher, "status", job, "--format", "json")
        got = {int(r["rank"]): r for n in json.loads(answer.stdout)["nodes"] for r in n["ranks"]}
        return got if got.get(0, {}).get("last_heartbeat") else None

    seen = wait_until(rows, 60, "rank 0's heartbeat in detlaunch status")
    assert seen[0]["last_output"] and seen[1]["last_output"] and seen[1]["last_heartbeat"] is None, seen
    r = run.wait(150)
    assert r.returncode == 124, r.output
    assert r.rank_lines(0).count("rank 0 still printing") > 20, r.output  # it printed all along
    assert r.rank_lines(1) == ["rank 1 importing torch", "rank 1 initialized"], r.output  # silent after
    assert "the job hung" in report_line(r.stderr)


@pytest.mark.timeout(200)
def test_stacks_of_a_healthy_job_do_not_disturb_it(launcher: Launcher) -> None:
    job = job_id()
    run = launcher.start(*torchrun(launcher, job), HANG, env={"STEPS": "60", "STEP_SLEEP": "0.1"})
    run.wait_for_output("[rank=1] rank 1 step 2", timeout=150)
    for _ in range(3):
        answer = ask(launcher, "stacks", job, "--format", "json")
        assert answer.returncode == 0, answer.stderr
        data = json.loads(answer.stdout)
        assert sorted(r for g in data["groups"] for r in g["ranks"]) == [0, 1] and data["unavailable"] == [], data
    r = run.wait(120)
    assert r.returncode == 0, r.output
    for rank in (0, 1):
        steps = [line for line in r.rank_lines(rank) if line.startswith(f"rank {rank} step ")]
        assert steps == [f"rank {rank} step {i}" for i in range(60)], r.output  # every line, in order
        assert r.rank_lines(rank)[-1] == f"rank {rank} done"


@pytest.mark.timeout(120)
def test_a_rank_whose_stack_cannot_be_read_says_why(launcher: Launcher) -> None:
    job = job_id()
    run = launcher.start(*torchrun(launcher, job, nproc=1), "/bin/sh", "-c", "echo up; exec sleep 60")
    run.wait_for_output("[rank=0] up", timeout=60)
    text = ask(launcher, "stacks", job)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[1] == ("rank 0 (node 0): no stack: not a Python process (or an interpreter "
                                           "py-spy does not know); faulthandler: not registered in it (not Python, "
                                           "or Python run with -S, -E or -I, signal 41 taken, or "
                                           "DETLAUNCH_FAULTHANDLER=0)"), text.stdout
    run.send_signal(signal.SIGTERM)
    run.wait(60)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("layer", ["torchrun", "horovod"])
def test_dump_before_kill_on_two_nodes_shows_the_survivors_under_the_root_cause(launcher: Launcher, tmp_path: Path,
                                                                                 layer: str) -> None:
    from test_faults import TwoNodes

    job = TwoNodes(launcher, tmp_path, layer, RANKS, {"FAIL_RANK": "3", "FAIL_CODE": "3"})
    job.wait_until_every_rank_is_up()
    job.trigger()
    chief, worker = job.chief.wait(120), job.worker.wait(120)
    assert (chief.returncode, worker.returncode) == (3, 3), chief.output + worker.output
    lines = chief.stderr.splitlines()
    cause = lines.index("detlaunch: last stderr lines of rank 3:")  # the failing rank's own stderr first
    dump = lines.index("detlaunch: the running ranks' stacks before they were stopped:")
    assert cause < dump and lines[cause + 1] == "detlaunch:   | something broke in rank 3", chief.stderr
    assert re.match(r"detlaunch:   ranks 0-2 \(node 0, 1\): time\.sleep <- <module> \(ranks\.py:\d+\)$",
                    lines[dump + 1]), chief.stderr
    # detlaunch alone stops them (under horovod too: its horovodrun leaves the other ranks of a failed one to it)
    for rank in (0, 1, 2):
        assert f"rank {rank} (node {rank // 2}): killed by SIGTERM (stopped by detlaunch)" in chief.stderr, chief.stderr


@pytest.mark.timeout(200)
def test_a_survivor_that_dies_while_its_stack_is_taken_does_not_hold_the_stop(launcher: Launcher,
                                                                             tmp_path: Path) -> None:
    """Issue 23: a survivor on its way out (gloo's "Connection reset by peer", then SIGABRT) answered neither
    py-spy nor faulthandler, and the dump before kill waited its whole budget for it. Its exit ends the wait."""
    fifo = tmp_path / "peer"
    os.mkfifo(fifo)
    run = launcher.start(*torchrun(launcher, job_id(), "--dump-budget", "10"), "/bin/sh", "-c",
                         f"{sys.executable} {SCRIPTS / 'dies_with_peer.py'}", env={"PEER_FIFO": str(fifo)})
    run.wait_for_output("[rank=0] rank 0: its peer is gone", timeout=150)
    peer_gone = time.monotonic()
    r = run.wait(120)
    took = time.monotonic() - peer_gone
    assert r.returncode == 3 and took < 8, (took, r.output)  # before: the whole budget, 10 s, and then the stop
    assert report_line(r.stderr) == "detlaunch: job failed: rank 1 on node 0 (127.0.0.1) exited with code 3"
    assert ("detlaunch:   rank 0 (node 0): no stack: not a Python process (or an interpreter py-spy does not know); "
            "faulthandler: it exited before its faulthandler answered") in r.stderr.splitlines(), r.stderr


@pytest.mark.timeout(200)
def test_dump_budget_0_stops_at_once_without_stacks(launcher: Launcher, tmp_path: Path) -> None:
    fifo = tmp_path / "trigger"
    os.mkfifo(fifo)
    run = launcher.start(*torchrun(launcher, job_id(), "--dump-budget", "0", nproc=3), RANKS,
                         env={"FAIL_RANK": "1", "SLEEP": "300", "TRIGGER": str(fifo)})
    for rank in (0, 2):
        run.wait_for_output(f"[rank={rank}] rank {rank} sleeping", timeout=60)
    run.wait_for_output("[rank=1] rank 1 waiting", timeout=60)
    fifo.write_bytes(b"x")
    r = run.wait(60)
    assert r.returncode == 3 and "stacks" not in r.stderr, r.output
    assert report_line(r.stderr) == "detlaunch: job failed: rank 1 on node 0 (127.0.0.1) exited with code 3"


@pytest.mark.timeout(240)
class AsUser:
    """detlaunch as the throwaway user, in a home of its own. The venv's interpreter lives under /root
    (0700): the user runs Debian's python3 (3.11, like the venv's) with the venv's site-packages on its
    path; py-spy comes from the venv's bin on PATH."""

    python = ["/usr/bin/python3", "-m", "detlaunch"]

    def __init__(self, account: pwd.struct_passwd, home: Path) -> None:
        root = paths.ROOT
        site = next(Path(sys.prefix, "lib").glob("python3.*/site-packages"))
        self.account, self.home = account, home
        self.prefix = ["runuser", "-u", account.pw_name, "--"]
        self.env = {"PYTHONPATH": ":".join(map(str, [root / "core", root / "plugins" / "torchrun", site])),
                    "TMPDIR": str(home), "HOME": str(home),
                    "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"}


@pytest.fixture
def as_user(throwaway_user: pwd.struct_passwd) -> Iterator[AsUser]:
    home = Path(tempfile.mkdtemp(prefix="dlhang-"))  # pytest's own tmp dirs are root's only
    os.chown(home, throwaway_user.pw_uid, throwaway_user.pw_gid)
    try:
        yield AsUser(throwaway_user, home)
    finally:
        shutil.rmtree(home)


@pytest.mark.timeout(240)
def test_as_a_user_without_privileges_stacks_and_the_hang_report_work(as_user: AsUser, launcher: Launcher) -> None:
    # as_user first: its teardown (userdel) comes after the launcher's (which stops the job)
    env = {**as_user.env, "HANG": "loop", "STEP_SLEEP": "0.2"}
    user, python, home, throwaway_user = as_user.prefix, as_user.python, as_user.home, as_user.account
    job = job_id()
    # Cold ranks: the test finds rank 1 by its command line (host_pid), which a warm rank shares with its template.
    args = torchrun(launcher, job, "--hang-timeout", "20", "--no-warm-ranks")
    run = launcher.start(*args, HANG, env=env, prefix=user,
                         command=python, cwd=home)
    run.wait_for_output("[rank=1] rank 1 step 3", timeout=150)
    pid = host_pid(launcher, 1)
    assert os.stat(f"/proc/{pid}").st_uid == throwaway_user.pw_uid  # the ranks are that user's
    os.kill(pid, signal.SIGSTOP)
    stacks = subprocess.run([*user, *python, "stacks", job], env={**launcher.env, **env}, capture_output=True,
                            text=True, timeout=30, cwd=home)
    assert stacks.returncode == 0, stacks.stderr
    assert re.search(r"^rank 0 \(node 0\): .*(all_reduce|time\.sleep)", stacks.stdout, re.M), stacks.stdout
    assert re.search(r"^rank 1 \(node 0\): \[SIGSTOPped\] ", stacks.stdout, re.M), stacks.stdout
    r = run.wait(120)
    assert r.returncode == 124, r.output
    assert "suspect: rank 1 (node 0): SIGSTOPped" in report_line(r.stderr)


@pytest.mark.timeout(300)
def test_as_a_user_an_undumpable_rank_in_a_collective_is_read_with_faulthandler_and_the_job_goes_on(
        as_user: AsUser, launcher: Launcher) -> None:
    # Rank 0 made itself undumpable (no ptrace, so no py-spy, for an ordinary user) and waits in a
    # gloo all_reduce; rank 2 too, and it also took faulthandler off the signal: neither way works.
    trigger = as_user.home / "trigger"
    os.mkfifo(trigger, 0o600)
    os.chown(trigger, as_user.account.pw_uid, as_user.account.pw_gid)
    env = {**as_user.env, "HANG": "sleep", "HANG_UNTIL": str(trigger), "STEPS": "2", "UNDUMPABLE": "0,2",
           "NO_FAULTHANDLER": "2"}
    user, python, home = as_user.prefix, as_user.python, as_user.home
    job = job_id()
    run = launcher.start(*torchrun(launcher, job, nproc=3), HANG, env=env, prefix=user, command=python, cwd=home)
    run.wait_for_output("[rank=1] rank 1 waiting for the trigger", timeout=200)
    in_collective = re.compile(r"^rank 0 \(node 0\): work\.wait <- all_reduce <- <module> \(hang\.py:\d+\)$", re.M)
    deadline = time.monotonic() + 30
    while True:  # rank 0 may still be in its last step's sleep when rank 1 says it waits
        stacks = subprocess.run([*user, *python, "stacks", job], env={**launcher.env, **env}, capture_output=True,
                                text=True, timeout=30, cwd=home)
        assert stacks.returncode == 0, stacks.stderr
        if in_collective.search(stacks.stdout) or time.monotonic() > deadline:
            break
    found = in_collective.search(stacks.stdout)
    assert found, stacks.stdout
    lines = stacks.stdout.splitlines()
    assert re.match(r"    rank 0 \(node 0\): read with faulthandler \(py-spy: permission denied: py-spy may not "
                    r"ptrace it \(it is not dumpable \(prctl PR_SET_DUMPABLE 0\)\)\)$",
                    lines[lines.index(found.group(0)) + 1]), stacks.stdout
    assert re.search(r"^rank 1 \(node 0\): (open|read) <- <module> \(hang\.py:\d+\)", stacks.stdout, re.M), stacks
    assert re.search(r"^rank 2 \(node 0\): no stack: permission denied: py-spy may not ptrace it \(it is not "
                     r"dumpable \(prctl PR_SET_DUMPABLE 0\)\); "
                     r"faulthandler: it no longer catches signal 41 \(the script replaced or removed detlaunch's "
                     r"handler\)$", stacks.stdout, re.M), stacks.stdout
    with open(trigger, "wb") as f:  # rank 1 goes on: the job ends as it would have
        f.write(b"x")
    r = run.wait(120)
    assert r.returncode == 0, r.output
    for rank in (0, 1, 2):
        assert r.rank_lines(rank)[-1] == f"rank {rank} done", r.output


@pytest.mark.timeout(240)
@pytest.mark.parametrize("layer", ["horovod", "deepspeed"])
def test_a_silent_job_over_sshd_shows_its_stacks_then_hangs_on_both_nodes_from_the_variable(
        launcher: Launcher, tmp_path: Path, layer: str) -> None:
    """Ranks started over sshd (the chief's launcher reaches node 1): `detlaunch stacks` reads every rank of both
    nodes while the job runs; then, silent, it hangs from DETLAUNCH_HANG_TIMEOUT, with the same stacks."""
    from test_faults import TwoNodes

    job_id = f"sshd-{uuid.uuid4().hex[:8]}"
    job = TwoNodes(launcher, tmp_path, layer, RANKS, {"DETLAUNCH_HANG_TIMEOUT": "15", "DETLAUNCH_JOB_ID": job_id})
    job.wait_until_every_rank_is_up()
    for fmt in ("json", "text"):
        answer = ask(launcher, "stacks", job_id, "--format", fmt)
        assert answer.returncode == 0, answer.stderr
        if fmt == "json":
            data = json.loads(answer.stdout)
            assert data["missing"] == [] and data["unavailable"] == [], data
            assert [(g["ranks"], g["nodes"]) for g in data["groups"]] == [([0, 1, 2, 3], [0, 1])], data
        else:
            assert re.match(r"ranks 0-3 \(node 0, 1\): time\.sleep <- <module> \(ranks\.py:\d+\)$",
                            answer.stdout.splitlines()[1]), answer.stdout
    chief, worker = job.chief.wait(120), job.worker.wait(120)
    assert (chief.returncode, worker.returncode) == (124, 124), chief.output + worker.output
    for r in (chief, worker):  # the worker reports the chief's verdict, stacks included
        assert report_line(r.stderr).startswith("detlaunch: job failed: the job hung: no rank showed progress")
        assert re.search(r"^detlaunch:   ranks 0-3 \(node 0, 1\): time\.sleep <- <module> \(ranks\.py:\d+\)$",
                         r.stderr, re.M), r.stderr
