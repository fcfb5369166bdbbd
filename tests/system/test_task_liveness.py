"""Whether a process still runs, thread by thread, and its pids in every namespace (milliseconds: fake /proc
trees, and this test's own process through a pidfd; real zombie leaders: tests/node/test_release_wait.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from detlaunch.system import procs

pytestmark = pytest.mark.timeout(10)


def fake_proc(root: Path, pid: int, tasks: dict[int, str]) -> str:
    """A /proc with process `pid` whose tasks have the given states (a comm with a ') ' in it, as a rank may)."""
    for tid, state in tasks.items():
        task = root / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "stat").write_text(f"{tid} (python (x) y) {state} 1 {pid} {pid} 0 -1 4194560 0 0\n")
    return str(root)


def test_a_zombie_leader_whose_thread_lives_is_alive(tmp_path: Path) -> None:
    """A rank killed while a thread was stuck in the GPU driver: the leader exited, the thread holds the device."""
    proc = fake_proc(tmp_path, 100, {100: "Z", 101: "D"})
    assert procs.task_states(100, proc) == {100: b"Z", 101: b"D"}
    assert procs.alive(100, proc)


def test_a_zombie_with_no_other_task_is_gone_it_only_waits_to_be_reaped(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 100, {100: "Z"})
    assert not procs.alive(100, proc)


def test_a_process_that_has_gone_is_not_alive(tmp_path: Path) -> None:
    assert procs.task_states(100, str(tmp_path)) == {}
    assert not procs.alive(100, str(tmp_path))


def test_a_running_or_sleeping_process_is_alive(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 100, {100: "S", 101: "R"})
    assert procs.alive(100, proc)
    assert procs.alive(os.getpid())


def test_a_thread_gone_between_listing_and_reading_is_skipped(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 100, {100: "Z"})
    (tmp_path / "100" / "task" / "101").mkdir()  # listed, its stat gone
    assert procs.task_states(100, proc) == {100: b"Z"}


def test_nspid_lines_are_read_outermost_first() -> None:
    assert procs.parse_nspid("Name:\tpython\nNSpid:\t48213\t7\nNSpgid:\t48213\t7\n") == (48213, 7)
    assert procs.parse_nspid("Pid:\t12\nNSpid:\t12\n") == (12,)
    assert procs.parse_nspid("Pid:\t-1\nNSpid:\t-1\n") == ()  # a pidfd whose process has gone
    assert procs.parse_nspid("Pid:\t12\n") == ()  # a kernel without pid namespaces


def test_a_pidfd_gives_this_processs_pids() -> None:
    fd = os.pidfd_open(os.getpid())
    try:
        assert procs.nspids(fd)[-1] == os.getpid()
        proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY)
        try:
            assert procs.nspids(fd, proc)[-1] == os.getpid()
        finally:
            os.close(proc)
    finally:
        os.close(fd)
