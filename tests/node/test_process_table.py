"""The process table with real short-lived processes, driven by a real event loop, in-process."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from detlaunch.errors import LaunchError
from detlaunch.node.process_table import Child, ProcessTable
from detlaunch.outcome import ProcessEnd
from detlaunch.planning.stage import Command
from detlaunch.system.eventloop import EventLoop
from support.helpers import small_tmpfs

pytestmark = pytest.mark.timeout(30)


class Table:
    def __init__(self, log_dir: Path | None) -> None:
        self.loop = EventLoop()
        self.output: list[bytes] = []
        self.exited: list[Child] = []
        self.table = ProcessTable(self.loop, log_dir=str(log_dir) if log_dir else None, node_rank=1,
                                  on_output=lambda _c, data: self.output.append(data), on_exit=self.exited.append)
        self.loop.catch_signals([signal.SIGCHLD], lambda _s: self.table.reap())


@pytest.fixture
def t(tmp_path: Path) -> Iterator[Table]:
    table = Table(tmp_path / "logs")
    yield table
    table.table.kill_all()
    table.table.reap()
    table.table.close()
    table.loop.close()


def test_a_child_output_and_exit_code_are_seen(real_processes: None, t: Table, tmp_path: Path) -> None:
    child = t.table.start(Command(("sh", "-c", "echo one; echo two >&2; exit 3"), name="launcher"), os.environ)
    t.loop.run_until(lambda: t.exited and child.output_fd is None, 20, "its exit and the end of its output")
    assert t.exited == [child] and child.exit == ProcessEnd(3) and not child.running
    assert b"".join(t.output) == b"one\ntwo\n" and child.tail == b"one\ntwo\n"
    assert (tmp_path / "logs" / "launcher-node1.log").read_bytes() == b"one\ntwo\n"


def test_a_signal_death_reads_as_128_plus_the_signal(real_processes: None, t: Table) -> None:
    child = t.table.start(Command(("sleep", "30"), stop_signal=signal.SIGINT), os.environ)
    assert [c.pid for c in t.table.live()] == [child.pid]
    t.table.stop(child, with_sessions=False)
    t.loop.run_until(lambda: t.exited, 20, "its exit")
    assert child.exit == ProcessEnd(130, signal.SIGINT) and t.table.live() == []
    assert child.exit.describe() == "killed by SIGINT"


def test_the_command_env_is_added_to_the_job_env(real_processes: None, t: Table) -> None:
    t.table.start(Command(("sh", "-c", 'echo "$A $B"'), env={"B": "command"}), {"PATH": os.environ["PATH"], "A": "job"})
    t.loop.run_until(lambda: t.exited and b"".join(t.output).endswith(b"\n"), 20, "its exit and its line")
    assert b"".join(t.output) == b"job command\n"


def test_an_orphan_is_a_leftover_until_killed(real_processes: None, t: Table) -> None:
    t.table.adopt_orphans()
    t.table.start(Command(("sh", "-c", "setsid sleep 30 & echo started")), os.environ)
    t.loop.run_until(lambda: t.exited and t.table.leftovers(), 20, "the exit of sh, its orphan left")
    assert len(t.table.leftovers()) == 1
    assert t.table.kill_all() >= 1
    t.loop.run_until(lambda: not t.table.leftovers(), 20, "the orphan's end")


def test_a_program_that_is_not_there_is_one_line(t: Table) -> None:
    with pytest.raises(LaunchError, match="cannot start no-such-launcher: not found on PATH"):
        t.table.start(Command(("no-such-launcher",)), os.environ)


def test_a_failing_setup_step_says_which_and_why(real_processes: None, t: Table) -> None:
    with pytest.raises(LaunchError, match=r"sh failed \(sh -c echo bad key >&2; exit 1\): bad key"):
        t.table.run_step(("sh", "-c", "echo bad key >&2; exit 1"), os.environ, timeout=10)
    with pytest.raises(LaunchError, match="setup command not found: no-such-step"):
        t.table.run_step(("no-such-step",), os.environ, timeout=10)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of two pages (8 KiB), of the test's own: a disk that fills within one chunk of output."""
    if os.getuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    with small_tmpfs(tmp_path / "disk", "8k") as mount:
        yield mount


def test_a_disk_that_fills_within_the_last_chunk_is_said(real_processes: None, tiny_disk: Path) -> None:
    """The last chunk a launcher writes only partly fits: the short write is no silent loss."""
    t = Table(tiny_disk / "logs")
    said: list[str] = []
    t.table.on_log_error = said.append
    out_r, out_w = os.pipe()
    try:
        child = Child(Command(("launcher",), name="launcher"), pid=0, output_fd=out_r)
        os.makedirs(tiny_disk / "logs")
        child.log_fd = os.open(t.table.log_path(child), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(out_w, b"x" * 20000)  # one read of it all (the pipe holds 64 KiB); only 8 KiB fit
        t.table._read_output(child)
        log = tiny_disk / "logs" / "launcher-node1.log"
        assert said == [f"{log} is incomplete: no space left on device after 8192 bytes"]
        assert log.stat().st_size == 8192 and child.log_fd is None
        assert b"".join(t.output) == b"x" * 20000  # the console still gets all of it
    finally:
        os.close(out_w)
        t.table._close_output(child)
        t.loop.close()

