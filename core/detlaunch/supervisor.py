"""The node supervisor (the seed's pid_server role): one per node, owning every process it starts.

It runs one event loop (no polling, no fixed sleeps) over:
- a Unix socket in the node's private 0700 run directory, where each rank's wrapper
  registers, says its rank started, and reports its exit status;
- the self-pipe of signals: SIGCHLD (a child or an orphan ended), SIGINT/SIGTERM/SIGHUP
  (the user: forwarded to the whole job; a second one kills at once);
- probes of peers' sshd greetings, and timers (grace period, start timeout).

When any rank fails, it stops every other process at once (the ranks through their
wrappers, the launcher with its stop signal), SIGKILLs whatever is left after the
grace period, and exits with the first failing rank's own exit code.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import psutil

from . import procs
from .dial import SshdProbe
from .errors import LaunchError
from .joblink import ChiefLink, WorkerLink
from .plan import LaunchPlan
from .report import Failure, JobResult, RankStatus, describe_exit
from .safefs import ensure_private_dir, write_private_file
from .stage import Command

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code_of(code: int) -> int:
    """waitstatus_to_exitcode gives -N for a signal; a shell reports 128+N."""
    return 128 - code if code < 0 else code


TAIL_BYTES, TAIL_LINES = 16384, 20


def last_lines(data: bytes, count: int = TAIL_LINES) -> tuple[str, ...]:
    lines = data.replace(b"\r", b"\n").decode("utf-8", "replace").splitlines()
    return tuple(line for line in lines if line.strip())[-count:]


@dataclasses.dataclass
class Child:
    """A process the supervisor started. Its own output (not the ranks') comes through a pipe:
    shown with --debug, kept in --log-dir, and its tail reported when it is the root cause."""

    command: Command
    pid: int
    output_fd: int
    exit: int | None = None  # exit code, or -signal
    tail: bytes = b""
    log_fd: int | None = None


@dataclasses.dataclass
class RankConn:
    """One wrapper's connection: the registration, then the rank's report."""

    sock: socket.socket
    peer_pid: int
    buffer: bytes = b""
    rank: int | None = None
    rank_pid: int | None = None
    status: RankStatus | None = None
    stopped_by_us: bool = False


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, when: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), callback))

    def timeout(self) -> float | None:
        return max(0.0, self._heap[0][0] - time.monotonic()) if self._heap else None

    def run_due(self) -> None:
        now = time.monotonic()
        while self._heap and self._heap[0][0] <= now:
            _, _, callback = heapq.heappop(self._heap)
            callback()


class NodeSupervisor:
    def __init__(self, plan: LaunchPlan, *, err: TextIO | None = None, debug: bool = False):
        self.plan = plan
        self.err = err or sys.stderr
        self.debug = debug
        self.sel = selectors.DefaultSelector()
        self.timers = Timers()
        self.children: dict[int, Child] = {}
        self.conns: dict[socket.socket, RankConn] = {}
        self.ranks: dict[int, RankConn] = {}
        self.probes: list[SshdProbe] = []
        self.phase = "starting"  # starting -> running -> stopping -> sweeping -> local_done -> closing -> done
        self.failure: Failure | None = None
        self.interrupted_by: int | None = None
        self.started_at = time.monotonic()
        self.env = self._base_env()
        self.failed_child: Child | None = None
        self.console_out, self.console_err = 1, 2
        self.link: ChiefLink | WorkerLink | None = None
        self.launchers_deferred = False  # interrupted: the launchers are stopped once the ranks are
        self.killed = False  # everything left has been SIGKILLed
        self.stopped_by_chief = False  # worker: the chief's verdict decides this node's exit

    # -- output ------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        print(f"detlaunch: {message}", file=self.err, flush=True)

    def trace(self, message: str) -> None:
        if self.debug:
            self.say(f"[node {self.plan.cluster.node_rank}] {message}")

    # -- setup -------------------------------------------------------------------------------
    def _base_env(self) -> dict[str, str]:
        env = dict(self.plan.context.env)
        for name in self.plan.unset_env:
            env.pop(name, None)
        env.update(self.plan.env)
        return env

    def _prepare(self) -> None:
        try:
            self._make_run_dir()
        except OSError as e:
            raise LaunchError(f"cannot set up {self.plan.run_dir}: {e.strerror or e}") from None
        self._install_signal_handlers()

    def _make_run_dir(self) -> None:
        os.mkdir(self.plan.run_dir, 0o700)  # fails if anything already sits at this random path
        os.mkdir(os.path.join(self.plan.run_dir, "tmp"), 0o700)  # a private TMPDIR for the job
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.plan.socket_path)
        os.chmod(self.plan.socket_path, 0o600)
        self.listener.listen(256)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, (1, self._on_accept))

    def _install_signal_handlers(self) -> None:
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, (3, self._on_wakeup))
        self._old_wakeup = signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        self._old_handlers = {s: signal.signal(s, lambda *_: None) for s in (*STOP_SIGNALS, signal.SIGCHLD)}
        procs.become_subreaper()

    def _path(self, rel: str) -> str:
        return rel if os.path.isabs(rel) else os.path.join(self.plan.run_dir, rel)

    def _write_files(self) -> None:
        stage = self.plan.stage
        for d in stage.dirs:
            _remove_tree(self._path(d))
            ensure_private_dir(self._path(d))
        for files, mode in ((stage.files, 0o600), (stage.executables, 0o700)):
            for rel, content in files.items():
                path = self._path(rel)
                ensure_private_dir(os.path.dirname(path))
                write_private_file(path, content, mode)

    def _run_steps(self, steps: tuple[tuple[str, ...], ...]) -> None:
        for argv in steps:
            self.trace(f"running {' '.join(argv)}")
            try:
                done = subprocess.run(argv, env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
                                      timeout=self.plan.start_timeout, check=False)
            except FileNotFoundError:
                raise LaunchError(f"setup command not found: {argv[0]}") from None
            except subprocess.TimeoutExpired:
                raise LaunchError(f"setup command timed out: {' '.join(argv)}") from None
            if done.returncode != 0:
                why = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()
                raise LaunchError(f"{os.path.basename(argv[0])} failed ({' '.join(argv)}): "
                                  f"{why[-1] if why else f'exit {done.returncode}'}")

    def _start(self, command: Command) -> None:
        env = {**self.env, **command.env}
        out_r, out_w = os.pipe()
        try:
            pid = procs.spawn(command.argv, env, output_fd=out_w)
        finally:
            os.close(out_w)
        child = Child(command, pid, out_r)
        if self.plan.log_dir:
            os.makedirs(self.plan.log_dir, exist_ok=True)
            name = f"{command.name}-node{self.plan.cluster.node_rank}.log"
            child.log_fd = os.open(os.path.join(self.plan.log_dir, name),
                                   os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        os.set_blocking(out_r, False)
        self.sel.register(out_r, selectors.EVENT_READ, (1, functools.partial(self._on_child_output, child)))
        self.children[pid] = child
        self.trace(f"started {command.name} (pid {pid})")

    def _on_child_output(self, child: Child, _mask: int) -> None:
        try:
            data = os.read(child.output_fd, 65536)
        except BlockingIOError:
            return
        if not data:
            self.sel.unregister(child.output_fd)
            os.close(child.output_fd)
            if child.log_fd is not None:
                os.close(child.log_fd)
            return
        child.tail = (child.tail + data)[-TAIL_BYTES:]
        if child.log_fd is not None:
            os.write(child.log_fd, data)
        if self.debug:
            for line in last_lines(data, 10**9):
                self.say(f"[{child.command.name}] {line}")

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> JobResult:
        try:
            self._prepare()
            if self.plan.cluster.num_nodes > 1:
                self.link = ChiefLink(self) if self.plan.cluster.is_chief else WorkerLink(self)
            self._write_files()
            self._run_steps(self.plan.stage.setup)
            for cmd in self.plan.stage.commands:
                if cmd.daemon:
                    self._start(cmd)
            self.timers.at(self.started_at + self.plan.start_timeout, self._on_start_timeout)
            self.probes = [SshdProbe(self, h, p) for h, p in self.plan.stage.wait_for_sshd]
            if not self.probes:
                self._start_launchers()
            self._loop()
        except LaunchError as e:
            self.fail_to_start(str(e))
            if hasattr(self, "wake_r"):
                self._loop()
        finally:
            self._cleanup()
        return self._result()

    def _loop(self) -> None:
        while self.phase != "done":
            events = self.sel.select(self.timers.timeout())
            # Rank reports before child exits, so a launcher's exit never hides its rank's cause.
            for key, mask in sorted(events, key=lambda e: e[0].data[0]):
                key.data[1](mask)
            self.timers.run_due()
            self._progress()

    def _start_launchers(self) -> None:
        if self.phase != "starting":
            return
        self.phase = "running"
        try:
            self._run_steps(self.plan.stage.prelaunch)
            for cmd in self.plan.stage.commands:
                if not cmd.daemon:
                    self._start(cmd)
        except LaunchError as e:
            self.fail_to_start(str(e))

    def peer_ready(self, probe: SshdProbe) -> None:
        self.trace(f"sshd {probe.host}:{probe.port} answered")
        if all(p.ready for p in self.probes):
            self._start_launchers()

    # -- events ----------------------------------------------------------------------------------
    def _on_wakeup(self, _mask: int) -> None:
        try:
            data = self.wake_r.recv(4096)
        except BlockingIOError:
            return
        for signum in data:
            if signum == signal.SIGCHLD:
                self._on_children()
            else:
                self._on_signal(signum)
        self._on_children()  # a SIGCHLD coalesced into another wakeup is still reaped

    def _on_signal(self, signum: int) -> None:
        if self.phase in ("local_done", "closing"):  # the chief, waiting for the other nodes to finish
            self.say(f"{signal.Signals(signum).name} received: not waiting for the other nodes")
            if self.link is not None and self.failure is None:
                self.link.failed(f"node 0 was interrupted by {signal.Signals(signum).name}", 128 + signum)
            self.interrupted_by = self.interrupted_by or signum
            self.phase = "done"
            return
        if self.phase == "sweeping":  # the ranks are gone; only leftovers remain
            self.say(f"{signal.Signals(signum).name} received: not waiting for what is left of the job")
            self._sweep_deadline()
            return
        if self.phase in ("stopping", "done") or self.interrupted_by is not None:
            self.say(f"{signal.Signals(signum).name} again: killing every process of the job now")
            self._kill_all()
            return
        self.interrupted_by = signum
        name = signal.Signals(signum).name
        self.say(f"{name} received: stopping the job (again to kill at once; SIGKILL in "
                 f"{self.plan.grace_period:g} s)")
        if self.link is not None:
            self.link.failed(f"node {self.plan.cluster.node_rank} was interrupted by {name}", 128 + signum)
        self._stop(signum, interrupt=True)

    def _on_children(self) -> None:
        for pid, code in procs.reap():
            child = self.children.get(pid)
            if child is None:
                continue  # an orphan re-parented to us, now reaped
            child.exit = code
            self.trace(f"{child.command.name} (pid {pid}) ended: {describe_exit(*_split(code))}")
            self._on_child_exit(child)

    def _on_child_exit(self, child: Child) -> None:
        if self.phase not in ("starting", "running"):
            return
        name, code = child.command.name, child.exit or 0
        if child.command.daemon:
            self._fail(f"{name} (pid {child.pid}) ended before the job did: "
                       f"{describe_exit(*_split(code))}", exit_code_of(code) or 1, child=child)
        elif code != 0:
            self._drain_connections()  # a rank's report already sent wins over its launcher's exit
            if self.failure is None:
                self._fail(f"{name} exited: {describe_exit(*_split(code))} "
                           "(no rank on this node reported a failure first)", exit_code_of(code), child=child)

    def _on_accept(self, _mask: int) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            pid, uid, _gid = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if uid != os.getuid():
                self.trace(f"refused a connection from uid {uid} (pid {pid})")
                sock.close()
                continue
            sock.setblocking(False)
            conn = RankConn(sock, pid)
            self.conns[sock] = conn
            self.sel.register(sock, selectors.EVENT_READ, (0, functools.partial(self._on_conn, conn)))

    def _on_conn(self, conn: RankConn, _mask: int) -> None:
        self._read_conn(conn)

    def _read_conn(self, conn: RankConn) -> None:
        while True:
            try:
                data = conn.sock.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._on_conn_closed(conn)
                return
            conn.buffer += data
            while b"\n" in conn.buffer:
                line, conn.buffer = conn.buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except ValueError:
                    self._close_conn(conn)
                    return
                self._on_message(conn, message)

    def _drain_connections(self) -> None:
        for conn in list(self.conns.values()):
            self._read_conn(conn)

    def _on_message(self, conn: RankConn, message: dict[str, Any]) -> None:
        kind = message.get("t")
        if kind == "hello":
            self._on_hello(conn, message)
        elif kind == "started" and conn.rank is not None:
            conn.rank_pid = int(message["pid"])
        elif kind == "exit" and conn.rank is not None and conn.status is None:
            conn.status = RankStatus(
                rank=conn.rank, node_rank=self.plan.cluster.node_rank, exit_code=int(message["code"]),
                signal=message.get("signal"), tail=tuple(message.get("tail") or ()),
                wall=float(message.get("wall") or time.time()), host=self._host(), stopped=conn.stopped_by_us)
            self._on_rank_exit(conn.status)

    def _on_hello(self, conn: RankConn, message: dict[str, Any]) -> None:
        why = self._refusal(message)
        if why:
            self._send(conn, {"t": "reject", "why": why})
            self._close_conn(conn)
            return
        conn.rank = int(message["rank"])
        self.ranks[conn.rank] = conn
        ranks = self.plan.context.config.options.get("ranks")
        log_dir = os.path.abspath(self.plan.log_dir) if self.plan.log_dir else None
        self._send(conn, {"t": "ok", "log_dir": log_dir, "console_ranks": list(ranks) if ranks else None},
                   fds=(self.console_out, self.console_err))
        self.trace(f"rank {conn.rank} registered (wrapper pid {conn.peer_pid})")

    def _refusal(self, message: dict[str, Any]) -> str | None:
        job = self.plan.cluster.job_id
        if message.get("job") != job:
            return f"it belongs to job {message.get('job')!r}, this node runs job {job!r}"
        if self.phase not in ("starting", "running"):
            return "the job is stopping"
        rank = message.get("rank")
        if not isinstance(rank, int):
            return "no rank given"
        if rank in self.ranks:
            return f"rank {rank} is already registered on this node"
        c = self.plan.cluster
        if self.plan.stage.expected_ranks is None and not c.first_rank <= rank < c.first_rank + c.local_slots:
            return (f"rank {rank} does not belong to node {c.node_rank} "
                    f"(its ranks are {c.first_rank}..{c.first_rank + c.local_slots - 1})")
        return None

    def _send(self, conn: RankConn, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        data = json.dumps(message).encode() + b"\n"
        try:
            conn.sock.setblocking(True)
            sent = socket.send_fds(conn.sock, [data], list(fds)) if fds else 0
            conn.sock.sendall(data[sent:])
            conn.sock.setblocking(False)
        except OSError:
            pass

    def _on_conn_closed(self, conn: RankConn) -> None:
        self._close_conn(conn)
        if conn.rank is not None and conn.status is None:
            conn.status = RankStatus(rank=conn.rank, node_rank=self.plan.cluster.node_rank,
                                     exit_code=128 + signal.SIGKILL, signal=signal.SIGKILL,
                                     lost=True, wall=time.time(), host=self._host(),
                                     stopped=conn.stopped_by_us)
            if conn.rank_pid:
                procs.signal_group(conn.rank_pid, signal.SIGKILL)  # the rank must not outlive it
            self._on_rank_exit(conn.status)

    def _close_conn(self, conn: RankConn) -> None:
        if conn.sock in self.conns:
            del self.conns[conn.sock]
            self.sel.unregister(conn.sock)
            conn.sock.close()

    def _on_rank_exit(self, status: RankStatus) -> None:
        self.trace(f"rank {status.rank} ended: {status.describe()}")
        if self.link is not None:
            self.link.rank_exited(status)
        self._rank_failed(status)

    def _rank_failed(self, status: RankStatus) -> None:
        """A failed rank, here or (chief) on another node, is a candidate for the root cause."""
        if status.failed and not status.stopped:
            how = f"exited with code {status.exit_code}" if not status.signal else status.describe()
            self._fail(f"rank {status.rank} on node {status.node_rank} ({status.host}) {how}",
                       status.exit_code or 1, status, at=status.wall)

    def _on_start_timeout(self) -> None:
        missing = self.link.missing_nodes() if self.link is not None else []
        if missing and self.phase in ("starting", "running"):
            if self.plan.cluster.is_chief:
                self.fail_to_start(f"node(s) {', '.join(map(str, missing))} never joined the job within "
                                   f"{self.plan.start_timeout:g} s (--start-timeout): is detlaunch running "
                                   "there, with the same host list and --control-port?")
            else:
                host = self.plan.cluster.chief_addr
                self.fail_to_start(f"never reached the chief at {host}:{self.plan.control_port} within "
                                   f"{self.plan.start_timeout:g} s (--start-timeout): is detlaunch running there?")
        elif self.phase == "starting":
            waiting = ", ".join(f"{p.host}:{p.port}" for p in self.probes if not p.ready)
            self.fail_to_start(f"sshd on {waiting} did not answer within {self.plan.start_timeout:g} s "
                               "(is detlaunch running on that node, with the same --ssh-port?)")
        elif isinstance(self.link, WorkerLink):
            return  # joined: the chief, waiting for the whole job, decides when to give up
        elif self.phase == "running" and len(self.ranks) < self.plan.expected_ranks:
            self._fail(f"only {len(self.ranks)} of {self.plan.expected_ranks} rank(s) started on node "
                       f"{self.plan.cluster.node_rank} within {self.plan.start_timeout:g} s "
                       "(--start-timeout): are the other nodes up?", 1)

    # -- progress and stopping ---------------------------------------------------------------------
    def _progress(self) -> None:
        live_children = [c for c in self.children.values() if c.exit is None]
        if self.phase == "running":
            launchers = [c for c in self.children.values() if not c.command.daemon]
            if launchers:
                over = all(c.exit is not None for c in launchers)
            else:  # daemons only (sshd): over when every expected rank came and went
                statuses = [c.status for c in self.ranks.values()]
                over = len(statuses) >= self.plan.expected_ranks and all(statuses)
            if over:
                registered = len(self.ranks)
                if registered < self.plan.expected_ranks and self.failure is None:
                    self._fail(f"the launcher ended, but only {registered} of {self.plan.expected_ranks} "
                               f"rank(s) ever started on node {self.plan.cluster.node_rank}", 1)
                else:
                    self._stop(signal.SIGTERM)
        ranks_done = all(c.status for c in self.ranks.values())
        if self.phase == "stopping" and self.launchers_deferred and ranks_done:
            self._stop_children()
        if (self.phase == "stopping" and not self.killed and ranks_done and self.ranks
                and (self.failure is not None or self.interrupted_by is not None)):
            # No rank of this node runs any more: a launcher's own shutdown (torchrun takes a
            # second) is not worth waiting for, and it has nothing left to clean up.
            self._kill_all()
        if self.phase == "stopping" and not live_children and not self.conns:
            self.phase = "sweeping"
            self.timers.at(time.monotonic() + max(self.plan.grace_period, 1.0), self._sweep_deadline)
        if self.phase == "sweeping":
            self._sweep()
        if self.phase == "local_done" and (self.link is None or self.link.ready_to_finish()):
            if self.link is not None:
                self.link.finish(self._exit_code(), [c.status for c in self.ranks.values() if c.status])
            self.phase = "closing"
        if self.phase == "closing" and (self.link is None or self.link.closed):
            self.phase = "done"

    def _fail(self, what: str, exit_code: int, rank: RankStatus | None = None,
              child: Child | None = None, at: float | None = None) -> None:
        """Record a failure and stop the job; the earliest failure is the root cause.

        The first failure stops the job at once. Another one reported while stopping, by a
        rank detlaunch had not yet asked to stop, may still be the cause: on two nodes, a
        survivor's collective error can arrive before the report of the rank whose death
        caused it. So the verdict is the failure that happened first, by its wall-clock time.
        """
        at = time.time() if at is None else at
        failure = Failure(what=what, exit_code=exit_code, rank=rank, at=at,
                          tail=rank.tail if rank else (), tail_of=f"rank {rank.rank}" if rank else "")
        if self.interrupted_by is not None or self.stopped_by_chief:
            pass  # the user's interruption, or the chief's verdict, stands
        elif self.failure is None:
            self.failure, self.failed_child = failure, child
            self.say(f"{what}: stopping the job")
            if self.link is not None:
                self.link.failed(what, exit_code)
        elif at < self.failure.at:
            self.trace(f"an earlier failure came in: {what}")
            self.failure, self.failed_child = failure, child
            if self.link is not None:
                self.link.failed(what, exit_code)
        self._stop(signal.SIGTERM)

    def fail_to_start(self, what: str) -> None:
        if self.failure is None:
            self.failure = Failure(what=what, exit_code=1, at=time.time())
            self.say(what)
            if self.link is not None:
                self.link.failed(what, 1)
        for probe in self.probes:
            probe.close()
        self._stop(signal.SIGTERM)

    def _stop(self, rank_signal: int, interrupt: bool = False) -> None:
        """Stop this node's part of the job: ranks through their wrappers, then the launchers.

        On a failure, everything is signalled at once. On the user's signal, the ranks get that
        signal first and the launchers are left alone until the ranks are gone, so no launcher's
        own SIGTERM races the SIGINT a rank was about to handle. Either way, whatever is left
        after the grace period is SIGKILLed.
        """
        if self.phase in ("stopping", "sweeping", "local_done", "closing", "done"):
            return
        self.phase = "stopping"
        live = [c for c in self.ranks.values() if c.status is None]
        for conn in live:
            conn.stopped_by_us = True
            procs.signal_pid(conn.peer_pid, rank_signal)
        self.launchers_deferred = interrupt and bool(live)
        if not self.launchers_deferred:
            self._stop_children()
        self.timers.at(time.monotonic() + self.plan.grace_period, self._kill_all)

    def _stop_children(self) -> None:
        self.launchers_deferred = False
        clean = self.failure is None and self.interrupted_by is None
        for child in self.children.values():
            if child.exit is None:
                if child.command.daemon and not clean:  # sshd: its sessions too
                    procs.signal_tree(child.pid, child.command.stop_signal)
                else:  # after a clean end, sshd sessions finish delivering exit statuses
                    procs.signal_pid(child.pid, child.command.stop_signal)

    def _kill_all(self) -> None:
        if self.phase in ("sweeping", "local_done", "closing", "done"):
            return  # sweeping: the sweep's own deadline kills what is left, and says so
        self.phase = "stopping"
        self.killed = True
        count = procs.kill_descendants()
        for conn in self.ranks.values():
            if conn.status is None:
                procs.signal_pid(conn.peer_pid, signal.SIGKILL)
                if conn.rank_pid:
                    procs.signal_group(conn.rank_pid, signal.SIGKILL)
        if count:
            self.trace(f"grace period over: SIGKILLed {count} process(es)")

    def _sweep(self) -> None:
        """The job is over on this node (phase "sweeping"): nothing it started may outlive it.

        After a clean end, leftovers (an sshd session delivering its rank's exit status) get
        the grace period to finish on their own; after a failure they are killed now. Orphans
        are re-parented to this subreaper, so each exit wakes the loop and this runs again;
        whatever is still there at the deadline is SIGKILLed (see _sweep_deadline).
        """
        leftovers = [p for p in procs.descendants() if _alive(p)]
        if not leftovers:
            self.phase = "local_done"
        elif self.failure is not None or self.interrupted_by is not None:
            self.trace(f"killing {len(leftovers)} leftover process(es): {[p.pid for p in leftovers]}")
            procs.kill_descendants()

    def _sweep_deadline(self) -> None:
        if self.phase != "sweeping":
            return
        leftovers = [p for p in procs.descendants() if _alive(p)]
        if leftovers:
            self.say(f"killing process(es) that outlived the job: {[p.pid for p in leftovers]}")
            procs.kill_descendants()
            procs.reap()
        self.phase = "local_done"

    # -- the other nodes (see joblink) ---------------------------------------------------------
    def remote_rank_exit(self, status: RankStatus) -> None:
        """Chief: a worker node's rank ended."""
        self._rank_failed(status)

    def remote_failure(self, what: str, code: int, node: int | None) -> None:
        """Chief: a worker node failed for another reason (its sshd died, it was interrupted...)."""
        self._fail(what if what.startswith("node ") else f"node {node}: {what}", code)

    def node_lost(self, node: int, why: str) -> None:
        """Chief: a worker node's supervisor vanished."""
        if self.phase in ("starting", "running"):
            addr = self.link.addrs.get(node, "address unknown") if isinstance(self.link, ChiefLink) else "?"
            self._fail(f"lost node {node} ({addr}): {why}", 1)

    def stop_from_chief(self, what: str, code: int, rank: RankStatus | None) -> None:
        """Worker: the chief decided the job is over; its verdict is this node's too."""
        self.failure = Failure(what=what, exit_code=code, rank=rank, tail=rank.tail if rank else (),
                               tail_of=f"rank {rank.rank}" if rank else "")
        self.failed_child = None
        self.stopped_by_chief = True
        if self.phase in ("starting", "running"):
            self.say(f"the chief stopped the job: {what}")
        self._stop(signal.SIGTERM)

    def chief_lost(self, why: str) -> None:
        """Worker: the chief's supervisor vanished before the job ended."""
        if self.phase in ("starting", "running"):
            self._fail(f"lost the chief ({self.plan.cluster.chief_addr}): {why}", 1)

    # -- the end ----------------------------------------------------------------------------------
    def _exit_code(self) -> int:
        if self.failure:
            return self.failure.exit_code
        if self.interrupted_by:
            return 128 + self.interrupted_by
        return 0

    def _cleanup(self) -> None:
        if self.link is not None:
            self.link.close()
        if self.phase not in ("local_done", "closing", "done"):
            procs.kill_descendants()
        procs.reap()
        for probe in self.probes:
            probe.close()
        if hasattr(self, "_old_handlers"):
            signal.set_wakeup_fd(self._old_wakeup)
            for s, h in self._old_handlers.items():
                signal.signal(s, h)
        try:
            os.unlink(self.plan.socket_path)
        except OSError:
            pass
        stage = self.plan.stage
        for rel in [*stage.files, *stage.executables]:
            try:
                os.unlink(self._path(rel))
            except OSError:
                pass
        for d in [*stage.dirs, self.plan.run_dir]:
            _remove_tree(self._path(d))
        # The shared job dir and its folders go when the last node leaves them empty.
        for d in sorted({os.path.dirname(self._path(d)) for d in stage.dirs}, key=len, reverse=True):
            _remove_empty_dirs(d, stop_at=os.path.dirname(self.plan.shared_dir))
        _remove_empty_dirs(self.plan.shared_dir, stop_at=os.path.dirname(self.plan.shared_dir))

    def _result(self) -> JobResult:
        local = {r: c.status or RankStatus(rank=r, node_rank=self.plan.cluster.node_rank, exit_code=None,
                                           stopped=c.stopped_by_us)
                 for r, c in self.ranks.items()}
        remote = self.link.remote_ranks if isinstance(self.link, ChiefLink) else {}
        ranks = tuple(status for _, status in sorted({**remote, **local}.items()))
        if self.failure and self.failed_child is not None:
            child = self.failed_child
            self.failure = dataclasses.replace(self.failure, tail=last_lines(child.tail),
                                               tail_of=child.command.name)
        return JobResult(exit_code=self._exit_code(), ranks=ranks, failure=self.failure,
                         interrupted_by=self.interrupted_by,
                         duration=time.monotonic() - self.started_at,
                         node_rank=self.plan.cluster.node_rank)

    def _host(self) -> str:
        return self.plan.cluster.node_addr or socket.gethostname()


def _split(code: int) -> tuple[int | None, int | None]:
    return (None, -code) if code < 0 else (code, None)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _remove_empty_dirs(path: str, stop_at: str) -> None:
    """rmdir `path` and its parents while they are empty, up to (not including) `stop_at`."""
    while path.startswith(stop_at + os.sep):
        try:
            os.rmdir(path)
        except OSError:
            return
        path = os.path.dirname(path)


def _remove_tree(path: str) -> None:
    if not os.path.isdir(path) or os.path.islink(path):
        return
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    os.rmdir(path)
