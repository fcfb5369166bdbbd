"""The wait between attempts (node/release_wait.py), in-process on a real event loop, with real processes:
a zombie leader whose thread is stuck in a (FUSE) driver, and a stub nvidia-smi on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from detlaunch.node.release_wait import ReleaseWait
from detlaunch.system import procs
from detlaunch.system.eventloop import EventLoop
from support.helpers import wait_until
from support.nvidia_smi import FakeNvidiaSmi
from support.stuck_fs import needs_fuse, stuck_file

pytestmark = pytest.mark.timeout(60)

# A rank whose thread is stuck in a driver and whose main thread has ended: the thread reads a file of
# tests/support/stuck_fs.py; once the read is in, the main thread leaves with the raw exit system call
# (only that thread ends: os._exit would end them all), leaving a zombie leader and a live thread.
STUCK_RANK = """
import ctypes, os, platform, sys, threading, time
stuck, arrived = sys.argv[1:3]
threading.Thread(target=lambda: open(stuck, "rb").read(), daemon=True).start()
while not os.path.exists(arrived):
    time.sleep(0.01)
ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)  # SYS_exit: this thread only
"""


def zombie_leader_with_a_thread(pid: int) -> dict[int, bytes] | None:
    states = procs.task_states(pid)
    return states if states.get(pid) == b"Z" and len(states) == 2 else None


class Waiting:
    """A ReleaseWait on its own loop; what it says; the children it reaps."""

    def __init__(self, timeout: float = 30.0, path: str | None = None) -> None:
        self.loop = EventLoop()
        self.said: list[str] = []
        self.traced: list[str] = []
        self.children: list[subprocess.Popen[bytes]] = []
        self.began: float | None = None
        self.wait = ReleaseWait(self.loop, timeout=timeout, env={"PATH": path or os.environ["PATH"]},
                                say=self.said.append, trace=self.traced.append, reap=self.reap)

    def reap(self) -> None:
        for child in self.children:
            child.poll()

    def start(self, *argv: str) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(argv)
        self.children.append(child)
        return child

    def begin(self, attempt: int, pids: list[int]) -> None:
        self.began = time.monotonic()  # the wait's bound counts from here, whatever a loaded machine delays
        self.wait.begin(attempt, pids)

    def run(self, budget: float = 30) -> float:
        """Until the wait is over: how long it took since begin()."""
        started = self.began if self.began is not None else time.monotonic()
        self.loop.run_until(lambda: self.wait.done, budget, "the end of the wait")
        return time.monotonic() - started


@pytest.fixture
def waiting() -> Iterator[Waiting]:
    w = Waiting()
    yield w
    w.wait.cancel()
    for child in w.children:
        if child.poll() is None:
            child.kill()
            child.wait()
    w.loop.close()


@pytest.fixture
def smi(tmp_path: Path) -> Iterator[FakeNvidiaSmi]:
    stub = FakeNvidiaSmi(tmp_path / "bin")
    yield stub
    for _, pid, _ in stub.calls():  # the stub's runs: children of this process, reaped by nobody else
        try:
            procs.signal_pid(pid, 9)
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


@needs_fuse
def test_a_zombie_leader_whose_thread_is_stuck_is_waited_for_until_the_thread_ends(
        real_processes: None, waiting: Waiting, tmp_path: Path) -> None:
    with stuck_file(tmp_path / "fs", hold=2.5) as fs:
        rank = waiting.start(sys.executable, "-c", STUCK_RANK, str(fs.path), str(fs.arrived))
        states = wait_until(lambda: zombie_leader_with_a_thread(rank.pid), 10, "a zombie leader with a live thread")
        assert procs.is_zombie(rank.pid) and procs.alive(rank.pid), states  # what the sweep sees, and the truth
        waiting.begin(2, [rank.pid])  # SIGKILLs it: the thread stays, inside the file system's read
        assert not waiting.wait.done
        assert waiting.said == [f"waiting for every thread of the last attempt's process(es) {rank.pid} to end "
                                "(up to 30 s)"]
        assert procs.task_states(rank.pid)[rank.pid] == b"Z"
        waiting.run()
        assert fs.answered_at is not None and time.time() >= fs.answered_at
        assert rank.returncode == -9  # it was reaped (the wait's reap)
    assert len(waiting.said) == 1


def test_a_zombie_alone_is_not_waited_for_only_reaped(real_processes: None, waiting: Waiting) -> None:
    dead = waiting.start(sys.executable, "-c", "pass")
    wait_until(lambda: procs.task_states(dead.pid) == {dead.pid: b"Z"}, 10, "a zombie")
    waiting.begin(2, [dead.pid])
    assert waiting.wait.done and waiting.said == [] and dead.returncode == 0


def test_nothing_left_and_no_nvidia_smi_is_no_wait_at_all(waiting: Waiting) -> None:
    ran: list[bool] = []
    waiting.begin(2, [])
    waiting.wait.then_run(lambda: ran.append(True))
    assert waiting.wait.done and ran == [True] and waiting.said == []


def test_the_last_attempts_pid_holding_gpu_memory_is_waited_for_until_it_is_freed(
        real_processes: None, smi: FakeNvidiaSmi) -> None:
    w = Waiting(path=smi.path)
    try:
        rank = w.start("sleep", "30")
        w.wait.remember(rank.pid)  # as the supervisor does when a rank starts
        rank.kill()
        rank.wait()
        smi.hold({rank.pid: 80000, 99999: 1000})  # 99999: another job's process, never ours
        w.begin(2, [])
        freed: list[float] = []
        w.loop.call_later(1.2, lambda: (smi.free(), freed.append(time.time())))
        took = w.run()
        assert w.said == [f"waiting for GPU memory of the last attempt's pids {rank.pid} to be freed (up to 30 s)"]
        calls = smi.calls()
        assert freed and 1.2 <= took < 5, (took, calls)  # freed 1.2 s after the start: not before
        assert {args for _, _, args in calls} == {"--query-compute-apps=pid,used_memory --format=csv,noheader,nounits"}
        gaps = [b[0] - a[0] for a, b in zip(calls, calls[1:], strict=False)]
        assert len(calls) >= 3 and gaps[-1] > gaps[0], gaps  # polled, less often as it goes on
    finally:
        w.loop.close()


def test_past_the_bound_one_line_and_the_attempt_starts_anyway(real_processes: None, smi: FakeNvidiaSmi) -> None:
    w = Waiting(timeout=1.0, path=smi.path)
    try:
        w.wait.remember(os.getpid())  # a pid of ours that nvidia-smi keeps listing
        smi.hold({os.getpid(): 512})
        w.begin(3, [])
        took = w.run()
        assert 0.9 < took < 3, took
        assert w.said == [f"waiting for GPU memory of the last attempt's pids {os.getpid()} to be freed (up to 1 s)",
                          f"GPU memory of the last attempt's pids {os.getpid()} is still not freed after 1 s "
                          "(--release-timeout): attempt 3 starts anyway"]
    finally:
        w.loop.close()


def test_only_other_processes_on_the_gpu_is_no_wait(real_processes: None, smi: FakeNvidiaSmi) -> None:
    w = Waiting(path=smi.path)
    try:
        w.wait.remember(os.getpid())
        smi.hold({99999: 1000})
        w.begin(2, [])
        w.run()
        assert w.said == [] and len(smi.calls()) == 1
    finally:
        w.loop.close()


def test_a_failing_nvidia_smi_is_not_waited_on(real_processes: None, smi: FakeNvidiaSmi) -> None:
    w = Waiting(path=smi.path)
    try:
        w.wait.remember(os.getpid())
        smi.fail()
        w.begin(2, [])
        w.run()
        assert w.said == [] and len(smi.calls()) == 1
        assert w.traced == ["nvidia-smi: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                            "driver.: not waiting for GPU memory"]
    finally:
        w.loop.close()


def test_a_hung_nvidia_smi_is_killed_at_the_bound(real_processes: None, smi: FakeNvidiaSmi) -> None:
    w = Waiting(timeout=1.0, path=smi.path)
    try:
        w.wait.remember(os.getpid())
        smi.hang()
        w.begin(2, [])
        assert 0.9 < w.run() < 3
        assert w.said == ["nvidia-smi did not answer after 1 s (--release-timeout): attempt 2 starts anyway"]
        (_, pid, _), = smi.calls()
        wait_until(lambda: procs.task_states(pid) in ({}, {pid: b"Z"}), 10, "the hung nvidia-smi killed")
    finally:
        w.loop.close()


def test_no_wait_when_off_even_with_nvidia_smi(smi: FakeNvidiaSmi) -> None:
    w = Waiting(timeout=0, path=smi.path)
    try:
        w.wait.remember(os.getpid())
        w.begin(2, [])
        assert w.wait.done and w.wait.nvidia_smi is None and smi.calls() == []
    finally:
        w.loop.close()


def test_a_cancelled_wait_starts_nothing(real_processes: None, smi: FakeNvidiaSmi) -> None:
    w = Waiting(path=smi.path)
    try:
        ran: list[bool] = []
        w.wait.remember(os.getpid())
        smi.hold({os.getpid(): 1})
        w.begin(2, [])
        w.wait.then_run(lambda: ran.append(True))
        w.loop.run_until(lambda: w.said, 10, "the waiting line")
        w.wait.cancel()
        assert w.wait.done and ran == [] and w.wait.query_fd is None and w.wait.next_query is None
    finally:
        w.loop.close()
