"""--spawn's side: every node's launch run here, in parallel; their output relayed; one exit code.

Each launch (``ssh HOST 'detlaunch ...'``, a local detlaunch for node 0, one ``srun``) runs in a session
of its own, its stdin a pipe from here. That pipe is how every node is told to stop: its detlaunch
(started with ``--spawned ...,stdin``) takes a line on its stdin, or its end, as SIGHUP and stops its
job, its ranks given their grace period, while its output still flows back; the end after a line is a
second SIGHUP: every process of its job killed at once. So Ctrl-C (or SIGTERM, SIGHUP) here writes a
line to every pipe, a second Ctrl-C closes them (every node kills its job and says so), a third kills
the launches (the ssh sessions); a node that ended in error has the others stopped with a line. A
SIGKILL of this process closes the pipes (the kernel closes its end): each ssh client passes the end of
its stdin on, and the node stops as on Ctrl-C. A launch whose node does not watch its stdin (srun) gets
SIGTERM instead of the line (srun then ends its step on every node), is killed at the second Ctrl-C, and dies
with this process (PR_SET_PDEATHSIG).

Output is relayed whole lines at a time (``\\n`` or ``\\r`` ends one), so nodes never cut into each
other's lines; a node's own ``detlaunch:`` lines name it. A launch that ends before its node's
detlaunch said anything (ssh cannot reach the host: 255; nothing to run there: 127; another Python's
"No module named detlaunch") is one line naming the host and the reason, and the other nodes are stopped.
A node whose detlaunch ends in error first (another version there: its one line, exit code 2) stops the
others too; the chief then ends as stopped (SIGHUP's 129), so the job's code is that node's.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import BinaryIO

import detlaunch.exit_codes as exit_codes
from detlaunch.planning.spawn import NodeLaunch

SSH_FAILED = 255  # ssh's own exit code: the host was not reached, or refused us
NOT_FOUND = 127  # the remote shell found no such command
HELD_LINES = 4  # stderr lines kept back until the node is up: ssh's own complaint is said once, as one line
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class _Launch:
    def __init__(self, launch: NodeLaunch, first_line: bytes, first_env: Mapping[str, str]) -> None:
        self.launch = launch
        # A launch whose node watches its stdin is told through it; it starts without a preexec_fn, which would
        # fork this Python (not vfork) and run Python in the child: ~8 ms a launch, one after the other. What
        # the others learn on their stdin's first line is in their environment instead (srun hands its stdin to
        # its first task only): in theirs alone, never in this process's.
        env = None if launch.watches_stdin else {**os.environ, **launch.env, **first_env}
        self.proc = subprocess.Popen(launch.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, env=env,
                                     preexec_fn=None if launch.watches_stdin else _die_with_parent)
        self.partial: dict[int, bytes] = {}
        self.held: list[bytes] | None = []  # None once the node is up
        self.code: int | None = None
        self.asked = False  # a line went to its stdin
        if launch.watches_stdin:  # the job secret (spawning.py), before anything else
            self._write(first_line)

    def ask(self) -> None:
        """A line on its stdin, once: the node's detlaunch stops its job. Only to a node that watches it (another
        launch may pass its stdin on to a rank's): another launch gets SIGTERM, on which srun ends its step on
        every node (no terminal's Ctrl-C reaches it: it runs in a session of its own)."""
        if self.asked:
            return
        self.asked = True
        if not self.launch.watches_stdin:
            self.stop()
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            return
        self._write(b"\n")

    def _write(self, line: bytes) -> None:
        if self.proc.stdin is None or self.proc.stdin.closed:
            return
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except OSError:  # it has ended
            pass

    def stop(self) -> None:
        """Close its stdin: the node's detlaunch stops its job, or kills it at once when asked before."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass


class Fanout:
    """Runs the launches until every one has ended; ``run()`` returns the job's exit code."""

    def __init__(self, launches: Sequence[NodeLaunch], first_line: bytes, first_env: Mapping[str, str] | None = None,
                 out: BinaryIO | None = None, err: BinaryIO | None = None) -> None:
        self.specs = list(launches)
        self.first_line = first_line  # to every launch that reads its stdin, at its start: the job secret
        self.first_env = dict(first_env or {})  # the same, in the environment of a launch that does not
        self.out = out or sys.stdout.buffer
        self.err = err or sys.stderr.buffer
        self.signals: list[int] = []
        self.failed_start: list[str] = []
        self.stopping = False
        self.cause: _Launch | None = None  # the first launch that ended in error before any stop from here

    def run(self) -> int:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        old = {s: signal.signal(s, lambda n, f: None) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        sel = selectors.DefaultSelector()
        sel.register(wake_r, selectors.EVENT_READ)
        launches: list[_Launch] = []
        try:
            for spec in self.specs:
                launch = _Launch(spec, self.first_line, self.first_env)
                launches.append(launch)
                for stream in (launch.proc.stdout, launch.proc.stderr):
                    assert stream is not None
                    sel.register(stream.fileno(), selectors.EVENT_READ, (launch, stream is launch.proc.stdout))
            open_fds = 2 * len(launches)
            while open_fds:
                for key, _ in sel.select():
                    if key.fd == wake_r:
                        self._on_signals(os.read(wake_r, 64), launches)
                        continue
                    launch, is_out = key.data
                    data = os.read(key.fd, 65536)
                    if data:
                        self._relay(launch, key.fd, is_out, data)
                        continue
                    sel.unregister(key.fd)
                    open_fds -= 1
                    self._relay(launch, key.fd, is_out, b"", end=True)
                    if not any(k.data and k.data[0] is launch for k in sel.get_map().values()):
                        self._ended(launch, launches)
        finally:
            for launch in launches:  # only on an error of our own: every node still running is stopped
                if launch.proc.poll() is None:
                    launch.stop()
                    os.killpg(launch.proc.pid, signal.SIGKILL)
                    launch.proc.wait()
                for stream in (launch.proc.stdin, launch.proc.stdout, launch.proc.stderr):
                    if stream is not None:
                        try:
                            stream.close()
                        except OSError:
                            pass
            signal.set_wakeup_fd(old_wakeup)
            for s, handler in old.items():
                signal.signal(s, handler)
            sel.close()
            os.close(wake_r)
            os.close(wake_w)
        return self._exit_code(launches)

    def _on_signals(self, got: bytes, launches: list[_Launch]) -> None:
        for signum in got:
            ctrl_cs = self.signals.count(signal.SIGINT) if signum == signal.SIGINT else 0
            self.signals.append(signum)
            self.stopping = True
            for launch in launches:
                if ctrl_cs == 0:  # every node stops its job
                    launch.ask()
                elif ctrl_cs == 1 and launch.launch.watches_stdin:  # a second Ctrl-C: every node kills its job now
                    launch.stop()
                elif launch.proc.poll() is None:  # a third (srun: a second): the launches themselves, now
                    try:
                        os.killpg(launch.proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def _relay(self, launch: _Launch, fd: int, is_out: bool, data: bytes, end: bool = False) -> None:
        data = launch.partial.pop(fd, b"") + data
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1 if not end else len(data)
        if cut < len(data):
            launch.partial[fd] = data[cut:]
        if not data[:cut]:
            return
        if is_out:
            self._up(launch)
            self.out.write(data[:cut])
            self.out.flush()
            return
        lines = data[:cut].splitlines(keepends=True)
        label = f"detlaunch: [{launch.launch.label}] ".encode()
        lines = [label + line[len(b"detlaunch: "):] if line.startswith(b"detlaunch: ") else line for line in lines]
        if launch.held is not None:
            if any(line.startswith(label) for line in lines) or len(launch.held) + len(lines) > HELD_LINES:
                self._up(launch)
            else:
                launch.held.extend(lines)
                return
        self.err.write(b"".join(lines))
        self.err.flush()

    def _up(self, launch: _Launch) -> None:
        if launch.held:
            self.err.write(b"".join(launch.held))
            self.err.flush()
        launch.held = None

    def _ended(self, launch: _Launch, launches: list[_Launch]) -> None:
        launch.code = launch.proc.wait()
        reason = launch.held[-1].decode(errors="replace").strip() if launch.held else ""
        # It ended before its detlaunch said anything (not a node this command had already stopped, silently).
        if launch.held is not None and launch.code != 0 and (launch.held or not self.stopping):
            what = {SSH_FAILED: "ssh failed", NOT_FOUND: "detlaunch not found there"}.get(
                launch.code, "detlaunch did not start there")
            line = (f"detlaunch: error: {launch.launch.label}: {what}: {reason or 'nothing said'} "
                    f"(exit code {launch.code})")
            self.failed_start.append(line)
            self.err.write(line.encode() + b"\n")
            self.err.flush()
        else:
            self._up(launch)
        if launch.code != 0:  # the job is over: the other nodes learn it from the chief, or from here
            if not self.stopping:
                self.cause = launch
            self.stopping = True
            for other in launches:
                other.ask()

    def _exit_code(self, launches: list[_Launch]) -> int:
        if self.signals:
            return exit_codes.by_signal(signal.Signals(self.signals[0]))
        if self.failed_start:
            return 1
        codes = [launch.code or 0 for launch in launches]
        chief = next((launch.code for launch in launches if launch.launch.node in (0, None)), None)
        if chief == exit_codes.by_signal(signal.SIGHUP) and self.cause is not None:  # stopped from here, for it
            return self.cause.code or chief
        return chief if chief else next((c for c in codes if c), 0)
