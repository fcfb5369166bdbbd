"""The processes a node's supervisor started (launchers and daemons): start, output, reap, stop, kill.

It owns processes and knows nothing of ranks or verdicts (torch elastic's PContext role). Each
child's output (its own chatter, not its ranks', which reach the console directly) comes through
a pipe on the event loop: kept in ``--log-dir``, passed to `on_output` (shown with ``--debug``),
and its tail kept for the report when that child is the root cause.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping

from detlaunch.errors import LaunchError
from detlaunch.node.standby import Standby
from detlaunch.outcome import ProcessEnd
from detlaunch.planning.stage import Command
from detlaunch.rank import log_files
from detlaunch.rank.protocol import TAIL_BYTES
from detlaunch.system import procs
from detlaunch.system.eventloop import EventLoop, Priority


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data`. A disk that fills mid-chunk takes part of it (a short write, no error): the
    rest is written again, so the loss raises (ENOSPC) and is said, never silently cut off."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@dataclasses.dataclass
class Child:
    """A process the supervisor started, and what it has said so far."""

    command: Command
    pid: int
    output_fd: int | None
    exit: ProcessEnd | None = None  # None: still running
    tail: bytes = b""
    log_fd: int | None = None

    @property
    def running(self) -> bool:
        return self.exit is None


class ProcessTable:
    """Every child of this supervisor, and every process below them (it is their subreaper)."""

    def __init__(self, loop: EventLoop, *, log_dir: str | None, node_rank: int,
                 on_output: Callable[[Child, bytes], None], on_exit: Callable[[Child], None],
                 on_log_error: Callable[[str], None] = lambda _why: None,
                 on_orphan: Callable[[int, ProcessEnd], None] = lambda _pid, _end: None) -> None:
        self.loop = loop
        self.log_dir = log_dir
        self.node_rank = node_rank
        self.on_output, self.on_exit, self.on_log_error = on_output, on_exit, on_log_error
        self.on_orphan = on_orphan  # a process it did not start (a warm rank, the rank template) was reaped
        self.children: dict[int, Child] = {}
        self.spared: set[int] = set()  # an idle standby launcher (standby.py): not this attempt's, kept
        self.log_errors: list[str] = []  # a launcher's log that could not be written: never fatal

    def adopt_orphans(self) -> None:
        """Become the child subreaper: whatever a child orphans is re-parented here, found, and stopped."""
        procs.become_subreaper()

    # -- starting -----------------------------------------------------------------------------
    def run_step(self, argv: tuple[str, ...], env: Mapping[str, str], timeout: float) -> None:
        """Run a setup command to completion; LaunchError (one line) when it fails."""
        import subprocess  # only a layer with setup steps needs it: not at start-up

        try:
            done = subprocess.run(argv, env=dict(env), stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout, check=False)
        except FileNotFoundError:
            raise LaunchError(f"setup command not found: {argv[0]}") from None
        except subprocess.TimeoutExpired:
            raise LaunchError(f"setup command timed out: {' '.join(argv)}") from None
        if done.returncode != 0:
            why = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()
            raise LaunchError(f"{os.path.basename(argv[0])} failed ({' '.join(argv)}): "
                              f"{why[-1] if why else ProcessEnd.from_returncode(done.returncode).describe()}")

    def drop_standby(self, standby: Standby) -> None:
        """A standby not used after all: stopped, and its pid spared no longer (it may be reused)."""
        self.spared.discard(standby.pid)
        standby.stop()

    def start(self, command: Command, env: Mapping[str, str], standby: Standby | None = None) -> Child:
        """Start `command`: in `standby` (started for it ahead of time) if it still waits, else afresh."""
        if standby is not None and standby.go():
            self.spared.discard(standby.pid)
            pid, out_r = standby.pid, standby.output_fd
        else:
            if standby is not None:  # it died idle: start afresh
                self.drop_standby(standby)
            pid, out_r = self._spawn(command, env)
        child = Child(command, pid, out_r)
        if self.log_dir:
            path = self.log_path(child)
            try:
                log_files.make_log_dir(self.log_dir)
                child.log_fd = log_files.open_log(path)
            except OSError as e:
                self._log_failed(f"{path} could not be opened: {log_files.reason(e)}")
        os.set_blocking(out_r, False)
        self.loop.add_reader(out_r, Priority.CHILD_OUTPUT, lambda: self._read_output(child))
        self.children[pid] = child
        return child

    @staticmethod
    def _spawn(command: Command, env: Mapping[str, str]) -> tuple[int, int]:
        """A new process for `command`: its pid and the read end of its output pipe."""
        out_r, out_w = os.pipe()
        try:
            pid = procs.spawn(command.argv, {**env, **command.env}, output_fd=out_w)
        except BaseException:
            os.close(out_r)
            raise
        finally:
            os.close(out_w)
        return pid, out_r

    def _read_output(self, child: Child) -> None:
        assert child.output_fd is not None
        try:
            data = os.read(child.output_fd, 65536)
        except BlockingIOError:
            return
        if not data:
            self._close_output(child)
            return
        child.tail = (child.tail + data)[-TAIL_BYTES:]
        if child.log_fd is not None:
            try:
                write_all(child.log_fd, data)
            except OSError as e:
                size = os.fstat(child.log_fd).st_size
                os.close(child.log_fd)
                child.log_fd = None
                self._log_failed(f"{self.log_path(child)} is incomplete: {os.strerror(e.errno or 0).lower()} "
                                 f"after {size} bytes")
        self.on_output(child, data)

    def log_path(self, child: Child) -> str:
        assert self.log_dir
        return os.path.join(self.log_dir, f"{child.command.name}-node{self.node_rank}.log")

    def _log_failed(self, why: str) -> None:
        self.log_errors.append(why)
        self.on_log_error(why)

    def _close_output(self, child: Child) -> None:
        if child.output_fd is not None:
            self.loop.remove(child.output_fd)
            os.close(child.output_fd)
            child.output_fd = None
        if child.log_fd is not None:
            os.close(child.log_fd)
            child.log_fd = None

    # -- ending -------------------------------------------------------------------------------
    def reap(self) -> None:
        """Collect every exited process; `on_exit` for ours, `on_orphan` for the others."""
        for pid, end in procs.reap():
            self.spared.discard(pid)  # a standby that died idle: its pid may be reused
            child = self.children.get(pid)
            if child is not None:
                child.exit = end
                self.on_exit(child)
            else:
                self.on_orphan(pid, end)

    def live(self) -> list[Child]:
        return [c for c in self.children.values() if c.running]

    def launchers(self) -> list[Child]:
        return [c for c in self.children.values() if not c.command.daemon]

    def stop(self, child: Child, *, with_sessions: bool) -> None:
        """Ask `child` to stop with its own stop signal (a daemon: its sessions too, when asked)."""
        if not child.running:
            return
        if with_sessions:
            procs.signal_tree(child.pid, child.command.stop_signal)
        else:
            procs.signal_pid(child.pid, child.command.stop_signal)

    def kill_all(self) -> int:
        """SIGKILL every process below the supervisor (but an idle standby); how many there were."""
        return procs.kill_descendants(spare=self.spared)

    def leftovers(self) -> list[int]:
        """Live (not zombie) processes still below the supervisor (but an idle standby).

        A process whose leader has exited is not one, though another of its threads may still run: after
        a failure it was SIGKILLed with the rest, and one whose thread is stuck in a driver cannot be killed
        harder. Before a restart, release_wait.py waits for every thread of what `remaining` lists; at the
        job's end the kernel does (the init of a PID namespace, the supervisor, exits only once every task
        in it has ended)."""
        return [pid for pid in procs.descendants() if not procs.is_zombie(pid) and pid not in self.spared]

    def remaining(self) -> list[int]:
        """Every process still below the supervisor, a zombie or a zombie leader with live threads too
        (but an idle standby)."""
        return [pid for pid in procs.descendants() if pid not in self.spared]

    def close(self) -> None:
        for child in self.children.values():
            self._close_output(child)

