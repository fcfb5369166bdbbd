"""Stacks with py-spy, for real: processes busy in Python, sleeping, SIGSTOPped, blocked in a gloo
all_reduce under torchrun, owned by another user; and every reason a stack cannot be had."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from detlaunch.progress import create_progress_file, read_progress
from detlaunch.rank.faultdump import dying
from detlaunch.rank.progress import ENDED_RAISED, ENDED_RECORD
from detlaunch.stacks.groups import format_text, group_stacks
from detlaunch.stacks.pyspy import (
    ProcessStack,
    Unavailable,
    classify_failure,
    collect_stacks,
    dump_argv,
    find_py_spy,
    from_json,
    parse_dump,
    parse_faulthandler,
    to_json,
)
from detlaunch.stacks.query import with_end
from support import paths
from support.helpers import free_port, wait_until

CORE = str(paths.CORE)
PY_SPY = find_py_spy()
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed")

SLEEPER = """\
import time
def inner():
    print("ready", flush=True)
    time.sleep(300)
def outer():
    inner()
outer()
"""
SPINNER = """\
def spin():
    print("ready", flush=True)
    while True:
        sum(range(100))
spin()
"""
DUMP = json.dumps([
    {"pid": 7, "thread_id": 11, "thread_name": "helper", "os_thread_id": 8, "active": False, "owns_gil": False,
     "frames": [{"name": "run", "filename": "/usr/lib/python3.11/threading.py", "line": 982}]},
    {"pid": 7, "thread_id": 12, "thread_name": "MainThread", "os_thread_id": 7, "active": True, "owns_gil": True,
     "frames": [{"name": "inner", "filename": "/w/t.py", "line": 3, "short_filename": "t.py"},
                {"name": "<module>", "filename": "/w/t.py", "line": 7}]},
])


@pytest.fixture
def start() -> Iterator[object]:
    """Start a Python script as a process of its own; every one is killed by PID at the end.
    The scripts live in a fresh world-readable folder, for the other user's processes."""
    procs: list[subprocess.Popen[str]] = []
    folder = Path(tempfile.mkdtemp(prefix="stacks-"))
    folder.chmod(0o755)

    def _start(code: str, argv0: str = sys.executable, **kw: object) -> subprocess.Popen[str]:
        script = folder / f"s{len(procs)}.py"
        script.write_text(code)
        script.chmod(0o644)
        p = subprocess.Popen([argv0, str(script)], stdout=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]
        procs.append(p)
        assert p.stdout and p.stdout.readline() == "ready\n"
        return p

    yield _start
    for p in procs:
        p.kill()
        p.wait()
    shutil.rmtree(folder)


# ---- parsing and reasons: no processes -------------------------------------------------------


def live_children() -> list[psutil.Process]:
    """This process's children still running (a zombie an earlier test of the session left is not one)."""
    alive = []
    for c in psutil.Process().children():
        try:
            if c.status() != psutil.STATUS_ZOMBIE:
                alive.append(c)
        except psutil.NoSuchProcess:
            continue
    return alive

def test_the_dump_command_reads_a_stopped_process_without_pausing_it() -> None:
    assert dump_argv("py-spy", 5) == ["py-spy", "dump", "--pid", "5", "--json"]
    assert dump_argv("py-spy", 5, stopped=True)[-1] == "--nonblocking"


def test_py_spy_json_parses_into_threads_with_frames_innermost_first() -> None:
    stack = parse_dump(7, DUMP)
    assert [t.name for t in stack.threads] == ["helper", "MainThread"]
    assert stack.main and stack.main.active and stack.main.owns_gil
    assert [(f.function, f.line) for f in stack.main.frames] == [("inner", 3), ("<module>", 7)]
    assert from_json(json.loads(json.dumps(to_json(stack)))) == stack
    ended = dataclasses.replace(stack, ended="raised")
    assert from_json(json.loads(json.dumps(to_json(ended)))) == ended
    gone = Unavailable(3, "gone", "the process has exited")
    assert from_json(to_json(gone)) == gone
    with pytest.raises(ValueError, match="not JSON"):
        parse_dump(7, "Error: nope")
    with pytest.raises(ValueError, match="lacks"):
        parse_dump(7, '[{"thread_id": 1}]')


def test_a_ranks_stack_carries_the_end_of_its_script_from_its_progress_file(tmp_path: Path) -> None:
    stack = parse_dump(7, DUMP)
    path = create_progress_file(str(tmp_path), 2)
    assert with_end(stack, 2, str(tmp_path)) == stack  # its script runs: no mark
    fd = os.open(path, os.O_WRONLY)
    try:  # as faultsite/sitecustomize.py writes it once the script has ended with an uncaught exception
        os.pwrite(fd, struct.pack("@qqddq", 1, ENDED_RAISED | 1, 1.0, 2.0, 1), ENDED_RECORD)
    finally:
        os.close(fd)
    assert with_end(stack, 2, str(tmp_path)).ended == "raised"  # type: ignore[union-attr]
    assert with_end(stack, 2, None) == stack and with_end(stack, 3, str(tmp_path)) == stack  # no such file
    gone = Unavailable(7, "gone", "the process has exited")
    assert with_end(gone, 2, str(tmp_path)) == gone


def test_failures_read_as_one_line_reasons() -> None:
    me = os.getpid()  # alive, so not 'gone'
    denied = classify_failure(me, 1, "Permission Denied: Try running again with elevated permissions by going 'sudo")
    assert denied.kind == "permission" and "ptrace" in denied.reason
    assert classify_failure(me, 1, "Error: Failed to find python version from target process").kind == "not-python"
    other = classify_failure(me, 1, "Error: Something odd\n\nCaused by:\n    0: deeper\n")
    assert (other.kind, other.reason) == ("error", "py-spy exited 1: Error: Something odd")
    assert classify_failure(2**22 + 12345, 1, "whatever").kind == "gone"


# ---- real processes ----------------------------------------------------------------------------

def main_functions(result: object) -> list[str]:
    assert isinstance(result, ProcessStack), result
    assert result.main
    return [f.function for f in result.main.frames]


@needs_py_spy
def test_busy_sleeping_and_sigstopped_processes_all_give_their_stacks(real_processes: None,
                                                                      start) -> None:  # type: ignore[no-untyped-def]
    busy, sleeping, stopped = start(SPINNER), start(SLEEPER), start(SLEEPER)
    os.kill(stopped.pid, signal.SIGSTOP)
    wait_until(lambda: psutil.Process(stopped.pid).status() == psutil.STATUS_STOPPED, 10, "the stop")
    got = collect_stacks([busy.pid, sleeping.pid, stopped.pid], budget=10)
    assert collect_stacks([sleeping.pid, stopped.pid], budget=10, max_parallel=1) == \
        {sleeping.pid: got[sleeping.pid], stopped.pid: got[stopped.pid]}  # in batches: the same answers
    assert main_functions(got[busy.pid])[-2:] == ["spin", "<module>"]
    assert main_functions(got[sleeping.pid]) == ["inner", "outer", "<module>"]
    assert main_functions(got[stopped.pid]) == ["inner", "outer", "<module>"]
    assert got[stopped.pid].stopped and not got[sleeping.pid].stopped  # type: ignore[union-attr]
    assert got[sleeping.pid].main.frames[0].code == "time.sleep(300)"  # type: ignore[union-attr]
    assert psutil.Process(busy.pid).status() != psutil.STATUS_STOPPED  # py-spy let it go on
    ours = {busy.pid, sleeping.pid, stopped.pid}
    assert not [c for c in live_children() if c.pid not in ours], "a py-spy was left behind"


@needs_py_spy
def test_what_cannot_be_read_says_why(real_processes: None, start,
                                      tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    native = subprocess.Popen(["sleep", "300"])
    try:
        got = collect_stacks([gone.pid, native.pid], budget=10)
    finally:
        native.kill()
        native.wait()
    assert got[gone.pid] == Unavailable(gone.pid, "gone", "the process has exited")
    assert got[native.pid].kind == "not-python", got[native.pid]  # type: ignore[union-attr]
    sleeping = start(SLEEPER)
    late = collect_stacks([sleeping.pid], budget=0.001)[sleeping.pid]
    assert late == Unavailable(sleeping.pid, "timeout", "py-spy did not answer within 0.001 s")
    assert not [c for c in live_children() if c.pid != sleeping.pid], "py-spy was not killed"
    missing = collect_stacks([sleeping.pid], py_spy=str(tmp_path / "py-spy"))[sleeping.pid]
    assert missing.kind == "missing" and "cannot run" in missing.reason  # type: ignore[union-attr]


@pytest.mark.timeout(30)
def test_a_process_that_exits_while_py_spy_reads_it_ends_the_wait_at_once(real_processes: None, start,
                                                                         tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A survivor that dies by itself (gloo's "Connection reset by peer", then SIGABRT) must not hold a dump
    before kill for the budget: its exit (a pidfd) ends the wait for its stack, whatever py-spy does."""
    stuck = tmp_path / "py-spy"  # a py-spy that never answers
    stuck.write_text("#!/bin/sh\nexec sleep 300\n")
    stuck.chmod(0o755)
    dying = start("import time\nprint('ready', flush=True)\ntime.sleep(0.5)\n")
    began = time.monotonic()
    got = collect_stacks([dying.pid], budget=20, py_spy=str(stuck))[dying.pid]
    took = time.monotonic() - began
    assert got == Unavailable(dying.pid, "gone", "it exited while its stack was being taken") and took < 10, (got, took)
    assert not [c for c in live_children() if c.pid != dying.pid], "the stuck py-spy was not killed"


def test_a_process_on_its_way_out_is_not_read(real_processes: None) -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_until(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 20, "the child's exit")
    try:
        assert dying(zombie.pid) == "it has exited" and dying(os.getpid()) == ""
        assert collect_stacks([zombie.pid], budget=5) == {zombie.pid: Unavailable(zombie.pid, "gone",
                                                                                  "the process has exited")}
    finally:
        zombie.wait()


# ---- a real 2-rank torchrun job: one rank in a gloo all_reduce, one that never joins it ---------

TRAIN = """\
import os, sys, time
import torch
import torch.distributed as dist

def load_batch():
    time.sleep(300)

def step(t):
    dist.all_reduce(t)

def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(os.path.join(sys.argv[1], f"pid-{rank}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(sys.argv[1], f"pid-{rank}.tmp"), os.path.join(sys.argv[1], f"pid-{rank}"))
    if rank == 1:
        load_batch()
    step(torch.ones(1))

main()
"""


@needs_py_spy
@pytest.mark.timeout(180)
def test_a_torchrun_rank_blocked_in_all_reduce_and_the_one_that_never_came(real_processes: None,
                                                                           tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), str(script),
                            str(tmp_path)], env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids: dict[int, int] = {}
    try:
        for rank in (0, 1):
            pids[rank] = int(wait_until(lambda r=rank: (tmp_path / f"pid-{r}").exists() and  # type: ignore[misc]
                                        (tmp_path / f"pid-{r}").read_text(), 120, f"rank {rank} to start"))

        def both_in_place() -> dict[tuple[int, int], object] | None:
            got = collect_stacks(pids.values(), budget=10)
            r0, r1 = got[pids[0]], got[pids[1]]
            ok = "all_reduce" in main_functions(r0) and "load_batch" in main_functions(r1)
            return {(0, 0): r0, (1, 0): r1} if ok else None

        lines = format_text(group_stacks(wait_until(both_in_place, 30, "rank 0 in all_reduce")))  # type: ignore[arg-type]
        assert len(lines) == 2, lines
        assert any(line.startswith("rank 0 (node 0): ") and "all_reduce <- step (train.py:9)" in line
                   and "suspect" not in line for line in lines), lines
        assert "rank 1 (node 0): time.sleep <- load_batch (train.py:6)  [suspect: not in the collective the others " \
               "wait in]" in lines, lines
        os.kill(pids[1], signal.SIGSTOP)  # and now one that is stopped
        wait_until(lambda: psutil.Process(pids[1]).status() == psutil.STATUS_STOPPED, 10, "the stop")
        got = collect_stacks(pids.values(), budget=10)
        lines = format_text(group_stacks({(0, 0): got[pids[0]], (1, 0): got[pids[1]]}))
        assert "rank 1 (node 0): [SIGSTOPped] time.sleep <- load_batch (train.py:6)  [suspect: SIGSTOPped]" in lines
    finally:
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


HEALTHY = """\
import os, sys, time
import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
os.environ["DETLAUNCH_PROGRESS_FILE"] = os.path.join(sys.argv[1], f"progress-{rank}")  # the wrapper's part
import detlaunch

dist.init_process_group("gloo")
with open(os.path.join(sys.argv[1], f"pid-{rank}.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(sys.argv[1], f"pid-{rank}.tmp"), os.path.join(sys.argv[1], f"pid-{rank}"))
t = torch.ones(1)
for step in range(STEPS):
    dist.all_reduce(t)
    assert t.item() == 2.0, t
    t.fill_(1.0)
    detlaunch.progress(step)
    time.sleep(0.005)
print(f"rank {rank} done", flush=True)
"""


@needs_py_spy
@pytest.mark.timeout(180)
def test_stacks_taken_while_a_job_runs_collectives_do_not_disturb_it_and_its_heartbeats_move(real_processes: None,
                                                                                             tmp_path: Path) -> None:
    steps = 400
    script = tmp_path / "train.py"
    script.write_text(HEALTHY.replace("STEPS", str(steps)))
    files = {rank: create_progress_file(str(tmp_path), rank) for rank in (0, 1)}
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1", "PYTHONPATH": CORE}
    job = subprocess.Popen([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), str(script),
                            str(tmp_path)], env=env, start_new_session=True, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    try:
        pids = [int(wait_until(lambda r=rank: (tmp_path / f"pid-{r}").exists() and  # type: ignore[misc]
                               (tmp_path / f"pid-{r}").read_text(), 120, f"rank {rank} to start")) for rank in (0, 1)]
        counts = []
        for _ in range(5):
            got = collect_stacks(pids, budget=10)
            if any(isinstance(r, Unavailable) and r.kind == "gone" for r in got.values()):
                break  # the job is over
            assert all(isinstance(r, ProcessStack) for r in got.values()), got
            beat = read_progress(files[0])
            counts.append(beat.count if beat else 0)
        out, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == 0
    # the two ranks share one pipe and print a line in two writes: compare the words, not the lines
    assert sorted(re.findall(r"rank \d done", out)) == ["rank 0 done", "rank 1 done"], out
    assert counts == sorted(counts) and len(set(counts)) > 1, counts  # the heartbeats moved meanwhile
    for path in files.values():
        beat = read_progress(path)
        assert beat is not None and (beat.count, beat.step) == (steps, steps - 1)


# ---- another user, with the kernel's ptrace policy of this machine --------------------------------

@needs_py_spy
@pytest.mark.timeout(60)
def test_a_user_without_privileges_reads_its_own_ranks_and_is_told_why_not_others(
        throwaway_user: pwd.struct_passwd, start) -> None:  # type: ignore[no-untyped-def]  # user first: it goes last
    uid, gid = throwaway_user.pw_uid, throwaway_user.pw_gid
    theirs = start(SLEEPER, "/usr/bin/python3", user=uid, group=gid, extra_groups=[])  # the venv lives under /root
    stopped = start(SLEEPER, "/usr/bin/python3", user=uid, group=gid, extra_groups=[])
    os.kill(stopped.pid, signal.SIGSTOP)
    wait_until(lambda: psutil.Process(stopped.pid).status() == psutil.STATUS_STOPPED, 10, "the stop")
    root_owned = start(SLEEPER)
    code = (f"import json, sys; sys.path.insert(0, {CORE!r})\n"
            "from detlaunch.stacks.pyspy import collect_stacks, to_json\n"
            f"got = collect_stacks([{theirs.pid}, {stopped.pid}, {root_owned.pid}], 10, {PY_SPY!r})\n"
            "print(json.dumps({str(p): to_json(r) for p, r in got.items()}))")
    r = subprocess.run(["/usr/bin/python3", "-c", code], user=uid, group=gid, extra_groups=[],
                       capture_output=True, text=True, timeout=30, cwd="/")
    assert r.returncode == 0, r.stderr
    got = {int(p): from_json(v) for p, v in json.loads(r.stdout).items()}
    assert main_functions(got[theirs.pid]) == ["inner", "outer", "<module>"]
    assert main_functions(got[stopped.pid]) == ["inner", "outer", "<module>"]
    denied = got[root_owned.pid]
    assert isinstance(denied, Unavailable) and denied.kind == "permission", denied


# ---- the faulthandler fallback: a real dump, from a rank started with PYTHONFAULTHANDLER --------

def test_a_faulthandler_dump_on_sigabrt_parses_like_a_py_spy_stack(real_processes: None,
                                                                   start) -> None:  # type: ignore[no-untyped-def]
    threaded = ("import threading, time\nt = threading.Thread(target=time.sleep, args=(300,), daemon=True)\n"
                f"t.start()\n{SLEEPER}")
    proc = start(threaded, stderr=subprocess.PIPE, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    os.kill(proc.pid, signal.SIGABRT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGABRT
    stack = parse_faulthandler(proc.pid, err)
    assert stack is not None and len(stack.threads) == 2, err
    assert main_functions(stack) == ["inner", "outer", "<module>"]
    assert stack.main and stack.main.frames[0].line in (6, 7)  # print('ready') or time.sleep(300)
    assert parse_faulthandler(1, "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n") is None
