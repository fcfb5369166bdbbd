"""The ranks of this node: the Unix socket their wrappers register on, and what each reported.

A wrapper connects (the peer's uid is checked with SO_PEERCRED: the job's user only), says
hello with its job id and rank, gets the node's console fds and settings, says when its rank
started, and reports the rank's exit. A connection that closes without a report means the
wrapper was killed: the rank counts as SIGKILLed, and its process group is killed too.
Messages are defined in rank/protocol.py, which the wrapper shares.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import detlaunch.exit_codes as exit_codes
from detlaunch.outcome import RankStatus
from detlaunch.rank import protocol as rank_protocol
from detlaunch.system import procs
from detlaunch.system.eventloop import EventLoop, Priority


@dataclasses.dataclass
class RankEntry:
    """One wrapper's connection: its registration, then its rank's report."""

    sock: socket.socket
    peer_pid: int
    buffer: bytes = b""
    rank: int | None = None
    rank_pid: int | None = None
    status: RankStatus | None = None
    stopped: bool = False  # detlaunch asked it to stop
    stopped_at: float = 0.0  # when (wall clock): a rank that ended before that was not stopped by detlaunch
    killed: bool = False  # detlaunch SIGKILLed it
    warm: bool = False  # its rank was forked from the rank template: this supervisor reaps it (rank_template.py)
    asked: bool = False  # a control client (control.py) that has sent its one question
    outbox: bytes = b""  # the answer still to send it


@dataclasses.dataclass(frozen=True)
class RankRules:
    """Which registrations this node accepts."""

    job_id: str
    node_rank: int
    first_rank: int
    local_slots: int
    check_range: bool  # the ranks are this node's slots (False: a layer said how many come)


class RankRegistry:
    """Accepts wrappers, answers them, and turns their messages into RankStatus reports."""

    def __init__(self, loop: EventLoop, rules: RankRules, host: str, *,
                 accepting: Callable[[], bool], welcome: Callable[[], dict[str, Any]],
                 console_fds: tuple[int, int], on_registered: Callable[[RankEntry], None],
                 on_exit: Callable[[RankStatus], None], trace: Callable[[str], None],
                 on_request: Callable[[RankEntry, dict[str, Any]], None] = lambda _e, _m: None,
                 on_started: Callable[[RankEntry], None] = lambda _e: None,
                 on_traceback: Callable[[RankEntry, dict[str, Any]], None] = lambda _e, _m: None) -> None:
        self.loop, self.rules, self.host = loop, rules, host
        self.accepting, self.welcome = accepting, welcome
        self.console_fds = console_fds
        self.on_registered, self.on_exit, self.trace = on_registered, on_exit, trace
        self.on_request = on_request  # a question from another shell (control.py), not a wrapper
        self.on_started = on_started  # the wrapper started its rank's process
        self.on_traceback = on_traceback  # a rank printed a whole traceback and still runs
        self.conns: dict[socket.socket, RankEntry] = {}
        self.ranks: dict[int, RankEntry] = {}
        self.listener: socket.socket | None = None
        self.early_ends: dict[int, tuple[int, int | None]] = {}  # orphans reaped before a wrapper named them
        self.releasing = False  # the job stops: a wrapper whose rank's end comes in now is let go at once

    def listen(self, path: str) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(256)
        listener.setblocking(False)
        self.listener = listener
        self.loop.add_reader(listener, Priority.CHILD_OUTPUT, self._accept)

    # -- queries ------------------------------------------------------------------------------
    def all_reported(self) -> bool:
        return all(e.status for e in self.ranks.values())

    def live(self) -> list[RankEntry]:
        return [e for e in self.ranks.values() if e.status is None]

    def statuses(self) -> dict[int, RankStatus]:
        """Every registered rank's status; one that has not reported yet as 'still running'."""
        return {r: e.status or RankStatus(rank=r, node_rank=self.rules.node_rank, exit_code=None,
                                          stopped=e.stopped, killed=e.killed, host=self.host)
                for r, e in self.ranks.items()}

    # -- stopping -----------------------------------------------------------------------------
    def signal_live(self, signum: int) -> int:
        """Ask every rank still running to stop, through its wrapper; how many were asked."""
        live = self.live()
        now = time.time()
        for entry in live:
            entry.stopped, entry.stopped_at = True, entry.stopped_at or now
            procs.signal_pid(entry.peer_pid, signum)
        return len(live)

    def kill_live(self) -> None:
        """SIGKILL every rank still running, and its wrapper."""
        for entry in self.live():
            entry.killed = True
            procs.signal_pid(entry.peer_pid, signal.SIGKILL)
            if entry.rank_pid:
                procs.signal_group(entry.rank_pid, signal.SIGKILL)

    def release(self) -> None:
        """Let the wrappers of ranks that ended go (one whose rank failed waits to be told: rank.wrapper.hold_exit),
        and from now on each one whose rank's end is reported later (it died while the job was being stopped)."""
        self.releasing = True
        for entry in self.ranks.values():
            if entry.status is not None:
                self._release(entry)

    def _release(self, entry: RankEntry) -> None:
        if entry.sock in self.conns:
            try:
                entry.sock.send(rank_protocol.encode({"t": rank_protocol.RELEASE}))
            except OSError:
                pass

    def reaped(self, pid: int, code: int, signum: int | None) -> None:
        """An orphan this supervisor reaped: when it is a warm rank, its wrapper learns how it ended (it is
        not the wrapper's child); one not named yet is kept until its wrapper names it (a bounded few)."""
        for entry in self.ranks.values():
            if entry.warm and entry.rank_pid == pid:
                self._tell_reaped(entry, code, signum)
                return
        if len(self.early_ends) >= 4096:
            self.early_ends.pop(next(iter(self.early_ends)))
        self.early_ends[pid] = (code, signum)

    def _tell_reaped(self, entry: RankEntry, code: int, signum: int | None) -> None:
        if entry.sock in self.conns:
            try:
                entry.sock.send(rank_protocol.encode({"t": rank_protocol.REAPED, "code": code, "signal": signum}))
            except OSError:
                pass

    def wrappers_connected(self) -> bool:
        """Whether a registered wrapper's connection is still open (its last report may be on the way).
        A control client (`detlaunch status`) or a connection that never said hello does not count:
        one left idle must not keep the job from ending."""
        return any(entry.rank is not None for entry in self.conns.values())

    def drain(self) -> None:
        """Read whatever the wrappers have sent (a rank's report beats its launcher's exit)."""
        for entry in list(self.conns.values()):
            self._read(entry)

    def close(self) -> None:
        for entry in list(self.conns.values()):
            self._close(entry)
        if self.listener is not None:
            self.loop.remove(self.listener)
            self.listener.close()
            self.listener = None

    # -- the socket ---------------------------------------------------------------------------
    def _accept(self) -> None:
        assert self.listener is not None
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
            entry = RankEntry(sock, pid)
            self.conns[sock] = entry
            self.loop.add_reader(sock, Priority.RANK_REPORT, functools.partial(self._read, entry))

    def _read(self, entry: RankEntry) -> None:
        while entry.sock in self.conns:
            try:
                data = entry.sock.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._closed(entry)
                return
            entry.buffer += data
            while b"\n" in entry.buffer and entry.sock in self.conns:
                line, entry.buffer = entry.buffer.split(b"\n", 1)
                try:
                    self._on_message(entry, rank_protocol.decode(line))
                except (ValueError, KeyError, TypeError):
                    self._close(entry)  # not a wrapper speaking the protocol
                    return

    def _on_message(self, entry: RankEntry, message: dict[str, Any]) -> None:
        kind = message.get("t")
        if kind == rank_protocol.HELLO:
            self._on_hello(entry, message)
        elif kind == rank_protocol.STARTED and entry.rank is not None:
            entry.rank_pid = int(message["pid"])
            entry.warm = bool(message.get("warm"))
            self.on_started(entry)
            if entry.warm and entry.rank_pid in self.early_ends:  # it ended before its wrapper said its pid
                self._tell_reaped(entry, *self.early_ends.pop(entry.rank_pid))
        elif kind == rank_protocol.REQUEST and entry.rank is None and not entry.asked:
            entry.asked = True
            self.on_request(entry, message)
        elif kind == rank_protocol.TRACEBACK and entry.rank is not None and entry.status is None:
            self.on_traceback(entry, message)
        elif kind == rank_protocol.EXIT and entry.rank is not None and entry.status is None:
            wall = float(message.get("wall") or time.time())
            entry.status = RankStatus(
                rank=entry.rank, node_rank=self.rules.node_rank, exit_code=int(message["code"]),
                signal=message.get("signal"), tail=tuple(message.get("tail") or ()), wall=wall, host=self.host,
                stopped=entry.stopped and wall >= entry.stopped_at,  # it may have died on its own just before
                log_error=str(message.get("log_error") or ""), ended=str(message.get("ended") or ""),
                teardown_signal=message.get("teardown_signal"))
            if self.releasing:  # its wrapper may hold its exit for a failure of its own: the stop is on already
                self._release(entry)
            self.on_exit(entry.status)

    def _on_hello(self, entry: RankEntry, message: dict[str, Any]) -> None:
        why = self._refusal(message)
        if why:
            self._send(entry, {"t": rank_protocol.REJECT, "why": why})
            self._close(entry)
            return
        entry.rank = int(message["rank"])
        self.ranks[entry.rank] = entry
        self._send(entry, {"t": rank_protocol.OK, **self.welcome()}, fds=self.console_fds)
        self.on_registered(entry)

    def _refusal(self, message: dict[str, Any]) -> str | None:
        r = self.rules
        if message.get("job") != r.job_id:
            return f"it belongs to job {message.get('job')!r}, this node runs job {r.job_id!r}"
        if not self.accepting():
            return "the job is stopping"
        rank = message.get("rank")
        if not isinstance(rank, int):
            return "no rank given"
        if rank in self.ranks:
            return f"rank {rank} is already registered on this node"
        if r.check_range and not r.first_rank <= rank < r.first_rank + r.local_slots:
            return (f"rank {rank} does not belong to node {r.node_rank} "
                    f"(its ranks are {r.first_rank}..{r.first_rank + r.local_slots - 1})")
        return None

    def _send(self, entry: RankEntry, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        data = rank_protocol.encode(message)
        try:
            entry.sock.setblocking(True)
            sent = socket.send_fds(entry.sock, [data], list(fds)) if fds else 0
            entry.sock.sendall(data[sent:])
            entry.sock.setblocking(False)
        except OSError:
            pass

    def answer(self, entry: RankEntry, data: Any) -> None:
        """Answer a control client without ever blocking the loop: a reader that stalls only stalls itself."""
        if entry.sock not in self.conns:
            return
        entry.outbox = rank_protocol.encode({"t": rank_protocol.REPLY, "data": data})
        self.loop.remove(entry.sock)
        self.loop.add_writer(entry.sock, Priority.PROBE, functools.partial(self._write_answer, entry))

    def _write_answer(self, entry: RankEntry) -> None:
        try:
            sent = entry.sock.send(entry.outbox)
        except BlockingIOError:
            return
        except OSError:
            sent = len(entry.outbox)
        entry.outbox = entry.outbox[sent:]
        if not entry.outbox:
            self._close(entry)

    def _closed(self, entry: RankEntry) -> None:
        self._close(entry)
        if entry.rank is not None and entry.status is None:
            entry.status = RankStatus(rank=entry.rank, node_rank=self.rules.node_rank,
                                      exit_code=exit_codes.by_signal(signal.SIGKILL), signal=signal.SIGKILL, lost=True,
                                      wall=time.time(), host=self.host, stopped=entry.stopped,
                                      killed=entry.killed)
            if entry.rank_pid:
                procs.signal_group(entry.rank_pid, signal.SIGKILL)  # the rank must not outlive it
            self.on_exit(entry.status)

    def _close(self, entry: RankEntry) -> None:
        if entry.sock in self.conns:
            del self.conns[entry.sock]
            self.loop.remove(entry.sock)
            entry.sock.close()
