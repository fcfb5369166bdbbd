"""Node supervisors form one job: each worker node's supervisor holds a TCP link to the chief's.

Over the link, a worker reports its ranks' exits and its own failures; the chief, the one
authority on the job's outcome, answers any failure anywhere by telling every node to stop,
with the root cause and the exit code every node then exits with. Both sides send a heartbeat;
a peer silent for HEARTBEAT_MISSES intervals is lost, and a lost peer stops the job.

Authentication: an HMAC-SHA256 challenge-response in both directions over a per-job secret,
which never appears on a command line: it comes from DETLAUNCH_JOB_SECRET when the scheduler
sets one on every node, else from a 0600 file in the job directory shared by the nodes (the
chief writes it before it starts listening, so a worker that reaches the listener reads the
current secret, never a stale one).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import selectors
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .dial import Dialer
from .errors import LaunchError
from .report import RankStatus
from .safefs import ensure_private_dir, read_private_file, write_private_file

if TYPE_CHECKING:
    from .supervisor import NodeSupervisor

HEARTBEAT_MISSES = 5
MAX_UNAUTHENTICATED = 4096  # bytes a peer may send before it has proven it is a node of the job
SECRET_ENV = "DETLAUNCH_JOB_SECRET"
SECRET_FILE = "secret"


def create_secret(env: Mapping[str, str], shared_dir: str) -> str:
    """Chief: the job secret from the environment, else a new one in the shared job dir (0600)."""
    if env.get(SECRET_ENV):
        return str(env[SECRET_ENV])
    ensure_private_dir(shared_dir)
    secret = secrets.token_hex(32)
    write_private_file(os.path.join(shared_dir, SECRET_FILE), secret)
    return secret


def read_secret(env: Mapping[str, str], shared_dir: str) -> str:
    """Worker: the job secret from the environment, else the chief's file (once its listener answers)."""
    return env.get(SECRET_ENV) or read_private_file(os.path.join(shared_dir, SECRET_FILE))


def mac(secret: str, *parts: object) -> str:
    return hmac.new(secret.encode(), "\0".join(map(str, parts)).encode(), hashlib.sha256).hexdigest()


def status_to_json(s: RankStatus) -> dict[str, Any]:
    return {"rank": s.rank, "node": s.node_rank, "code": s.exit_code, "signal": s.signal,
            "tail": list(s.tail), "lost": s.lost, "host": s.host, "wall": s.wall, "stopped": s.stopped}


def status_from_json(d: dict[str, Any]) -> RankStatus:
    return RankStatus(rank=int(d["rank"]), node_rank=int(d["node"]), exit_code=d.get("code"),
                      signal=d.get("signal"), tail=tuple(d.get("tail") or ()), lost=bool(d.get("lost")),
                      host=str(d.get("host") or ""), wall=float(d.get("wall") or 0.0),
                      stopped=bool(d.get("stopped")))


class Line:
    """One TCP connection carrying JSON lines, driven by the supervisor's selector."""

    def __init__(self, sup: NodeSupervisor, sock: socket.socket, on_message: Callable[[Line, dict[str, Any]], None],
                 on_close: Callable[[Line], None]):
        self.sup, self.sock = sup, sock
        self.on_message, self.on_close = on_message, on_close
        self.buffer = b""
        self.closed = False
        self.opened = time.monotonic()
        self.last_heard = time.monotonic()
        self.node: int | None = None
        self.authed = False
        self.nonce = secrets.token_hex(16)
        sock.setblocking(False)
        sup.sel.register(sock, selectors.EVENT_READ, (0, self.on_readable))

    def send(self, message: dict[str, Any]) -> None:
        if self.closed:
            return
        try:
            self.sock.setblocking(True)
            self.sock.settimeout(5)
            self.sock.sendall(json.dumps(message).encode() + b"\n")
            self.sock.setblocking(False)
        except OSError:
            self.close(notify=True)

    def on_readable(self, _mask: int) -> None:
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close(notify=True)
                return
            self.last_heard = time.monotonic()
            self.buffer += data
            if not self.authed and len(self.buffer) > MAX_UNAUTHENTICATED:
                self.close()  # not a node of this job: an auth message is a few hundred bytes
                return
            while b"\n" in self.buffer and not self.closed:
                raw, self.buffer = self.buffer.split(b"\n", 1)
                try:
                    message = json.loads(raw)
                except ValueError:
                    self.close(notify=True)
                    return
                if isinstance(message, dict) and message.get("t") != "hb":
                    self.on_message(self, message)

    def close(self, notify: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.sup.sel.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        self.sock.close()
        if notify:
            self.on_close(self)

    def silent_for(self) -> float:
        return time.monotonic() - self.last_heard


class ChiefLink:
    """The chief's side: accepts every worker node's supervisor, and decides for the job."""

    def __init__(self, sup: NodeSupervisor):
        self.sup = sup
        plan = sup.plan
        self.job_id = plan.cluster.job_id
        self.heartbeat = plan.heartbeat
        self.secret = create_secret(plan.context.env, plan.shared_dir)
        self.expected = set(range(1, plan.cluster.num_nodes))
        self.nodes: dict[int, Line] = {}
        self.pending: set[Line] = set()  # accepted, not authenticated yet
        self.finished: set[int] = set()  # said goodbye, or were lost
        self.remote_ranks: dict[int, RankStatus] = {}
        self.stop_message: dict[str, Any] | None = None
        self.addrs = {n: a for n, a in enumerate(plan.cluster.node_addrs) if a}  # + peers as they join
        host = plan.cluster.chief_addr
        try:
            family, _, _, _, addr = socket.getaddrinfo(host, plan.control_port, type=socket.SOCK_STREAM)[0]
            self.listener = socket.socket(family, socket.SOCK_STREAM)
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind(addr)
        except OSError as e:
            raise LaunchError(f"cannot listen on {host}:{plan.control_port} for the other nodes "
                              f"({e.strerror}): choose a free port with --control-port") from None
        self.listener.listen(64)
        self.listener.setblocking(False)
        sup.sel.register(self.listener, selectors.EVENT_READ, (1, self.on_accept))
        sup.timers.at(time.monotonic() + self.heartbeat, self.tick)

    def on_accept(self, _mask: int) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            line = Line(self.sup, sock, self.on_message, self.on_close)
            self.pending.add(line)
            line.send({"t": "challenge", "job": self.job_id, "nonce": line.nonce})

    def on_message(self, line: Line, m: dict[str, Any]) -> None:
        kind = m.get("t")
        if not line.authed:
            self._authenticate(line, m)
        elif kind == "rank_exit":
            status = status_from_json(m["status"])
            self.remote_ranks[status.rank] = status
            self.sup.remote_rank_exit(status)
        elif kind == "failed":
            self.sup.remote_failure(str(m.get("what")), int(m.get("code") or 1), line.node)
        elif kind == "bye":
            for d in m.get("ranks") or ():
                status = status_from_json(d)
                self.remote_ranks[status.rank] = status
            assert line.node is not None
            self.finished.add(line.node)  # the line stays open for the final verdict

    def _authenticate(self, line: Line, m: dict[str, Any]) -> None:
        self.pending.discard(line)
        node = m.get("node")
        ok = (m.get("t") == "auth" and isinstance(node, int) and node in self.expected and self.secret
              and hmac.compare_digest(str(m.get("mac")), mac(self.secret, "worker", self.job_id, node, line.nonce)))
        if not ok or node in self.nodes:
            self.sup.trace(f"refused a control connection (node {node!r}): bad credentials or duplicate")
            line.close()
            return
        assert isinstance(node, int) and self.secret
        line.authed, line.node = True, node
        self.nodes[node] = line
        self.addrs[node] = str(m.get("addr") or line.sock.getpeername()[0])
        line.send({"t": "welcome", "mac": mac(self.secret, "chief", self.job_id, node, m.get("nonce"))})
        if self.stop_message is not None:  # joined after the job was stopped
            line.send(self.stop_message)
        self.sup.trace(f"node {node} joined the job")

    def on_close(self, line: Line) -> None:
        self.pending.discard(line)
        node = line.node
        if node is None or node in self.finished:
            return
        self.finished.add(node)
        self.sup.node_lost(node, "its detlaunch closed the connection without saying goodbye")

    def tick(self) -> None:
        if self.sup.phase == "done":
            return
        for line in [p for p in self.pending if time.monotonic() - p.opened > HEARTBEAT_MISSES * self.heartbeat]:
            self.sup.trace("closed a control connection that never authenticated")
            self.pending.discard(line)
            line.close()
        for node, line in list(self.nodes.items()):
            if line.closed:
                continue
            if line.silent_for() > HEARTBEAT_MISSES * self.heartbeat:
                line.close()
                self.finished.add(node)
                self.sup.node_lost(node, f"no heartbeat for {HEARTBEAT_MISSES * self.heartbeat:g} s")
            else:
                line.send({"t": "hb"})
        self.sup.timers.at(time.monotonic() + self.heartbeat, self.tick)

    def missing_nodes(self) -> list[int]:
        return sorted(self.expected - set(self.nodes))

    def rank_exited(self, status: RankStatus) -> None:
        pass  # the chief's own ranks are in its own report

    def _verdict(self, kind: str, what: str, code: int) -> dict[str, Any]:
        f = self.sup.failure
        rank = f.rank if f is not None and f.what == what else None
        return {"t": kind, "what": what, "code": code, "rank": status_to_json(rank) if rank else None}

    def failed(self, what: str, code: int) -> None:
        """The job failed (here or anywhere): every node stops, with this verdict (so far)."""
        self.stop_message = self._verdict("stop", what, code)
        for line in self.nodes.values():
            line.send(self.stop_message)

    def ready_to_finish(self) -> bool:
        """Every node that joined has said goodbye or was lost (one that never joined: nothing to wait for)."""
        return set(self.nodes) <= self.finished

    def finish(self, code: int, ranks: list[RankStatus]) -> None:
        """Every node has finished: tell each the final verdict (the earliest failure of all)."""
        f = self.sup.failure
        end = self._verdict("end", f.what, f.exit_code) if f is not None else {"t": "end", "code": code}
        for line in self.nodes.values():
            line.send(end)
            line.close()
        self.listener.close()

    @property
    def closed(self) -> bool:
        return True

    def close(self) -> None:
        for line in [*self.nodes.values(), *self.pending]:
            line.close()
        try:
            self.listener.close()
        except OSError:
            pass
        if not self.sup.plan.context.env.get(SECRET_ENV):
            try:
                os.unlink(os.path.join(self.sup.plan.shared_dir, SECRET_FILE))
            except OSError:
                pass


class WorkerLink:
    """A worker node's side: reaches the chief (retrying until the start timeout) and obeys it."""

    def __init__(self, sup: NodeSupervisor):
        self.sup = sup
        plan = sup.plan
        self.node = plan.cluster.node_rank
        self.job_id = plan.cluster.job_id
        self.heartbeat = plan.heartbeat
        self.chief = (plan.cluster.chief_addr, plan.control_port)
        self.shared_dir = plan.shared_dir
        self.env = plan.context.env
        self.line: Line | None = None
        self.joined = False
        self.chief_ended = False
        self.stopped_by_chief = False
        self.secret: str | None = None
        self.dialer = Dialer(sup, *self.chief, self._on_connected, source=plan.cluster.node_addr)
        sup.timers.at(time.monotonic() + self.heartbeat, self.tick)

    def _on_connected(self, sock: socket.socket) -> None:
        self.line = Line(self.sup, sock, self.on_message, self.on_close)

    def on_message(self, line: Line, m: dict[str, Any]) -> None:
        kind = m.get("t")
        if kind == "challenge":
            self._answer(line, m)
        elif kind == "welcome":
            assert self.secret is not None
            expected = mac(self.secret, "chief", self.job_id, self.node, line.nonce)
            if not hmac.compare_digest(str(m.get("mac")), expected):
                self.sup.fail_to_start(f"the chief at {self.chief[0]}:{self.chief[1]} failed authentication")
                line.close()
                return
            line.authed = self.joined = True
            self.sup.trace("joined the chief")
        elif kind == "stop":
            self.stopped_by_chief = True
            rank = status_from_json(m["rank"]) if m.get("rank") else None
            self.sup.stop_from_chief(str(m.get("what")), int(m.get("code") or 1), rank)
        elif kind == "end":
            self.chief_ended = True
            if m.get("code") and m.get("what"):  # the final verdict, all nodes' reports considered
                rank = status_from_json(m["rank"]) if m.get("rank") else None
                self.sup.stop_from_chief(str(m["what"]), int(m["code"]), rank)
            line.close()
            self.line = None

    def _answer(self, line: Line, m: dict[str, Any]) -> None:
        if m.get("job") != self.job_id:
            self.sup.fail_to_start(f"the detlaunch listening on {self.chief[0]}:{self.chief[1]} runs job "
                                   f"{m.get('job')!r}, not {self.job_id!r}: give every node the same --job-id")
            line.close()
            return
        try:
            self.secret = read_secret(self.env, self.shared_dir)
        except OSError as e:
            self.sup.fail_to_start(f"cannot read the job secret in {self.shared_dir} ({e.strerror}): the job "
                                   f"directory must be shared by all nodes (--job-dir), or set {SECRET_ENV}")
            line.close()
            return
        line.send({"t": "auth", "node": self.node, "nonce": line.nonce, "addr": self.dialer.source,
                   "mac": mac(self.secret, "worker", self.job_id, self.node, m.get("nonce"))})

    def on_close(self, line: Line) -> None:
        self.line = None
        if self.chief_ended or self.sup.phase == "done":
            return
        if not line.authed:
            self.sup.fail_to_start(f"the chief at {self.chief[0]}:{self.chief[1]} refused this node "
                                   "(wrong job secret?)")
            return
        self.sup.chief_lost("the chief's detlaunch closed the connection")

    def tick(self) -> None:
        if self.sup.phase == "done":
            return
        line = self.line
        if line is not None and line.authed:
            if line.silent_for() > HEARTBEAT_MISSES * self.heartbeat:
                line.close()
                self.line = None
                self.sup.chief_lost(f"no heartbeat from the chief for {HEARTBEAT_MISSES * self.heartbeat:g} s")
                return
            line.send({"t": "hb"})
        self.sup.timers.at(time.monotonic() + self.heartbeat, self.tick)

    def missing_nodes(self) -> list[int]:
        return [] if self.joined else [0]

    def rank_exited(self, status: RankStatus) -> None:
        if self.line is not None:
            self.line.send({"t": "rank_exit", "status": status_to_json(status)})

    def failed(self, what: str, code: int) -> None:
        if self.line is not None and not self.stopped_by_chief:
            self.line.send({"t": "failed", "what": what, "code": code})

    def ready_to_finish(self) -> bool:
        return True

    def finish(self, code: int, ranks: list[RankStatus]) -> None:
        """Say goodbye with this node's ranks, then wait (a few heartbeats at most) for the verdict."""
        if self.line is not None:
            self.line.send({"t": "bye", "code": code, "ranks": [status_to_json(r) for r in ranks]})
            self.sup.timers.at(time.monotonic() + HEARTBEAT_MISSES * self.heartbeat, self._give_up_waiting)

    def _give_up_waiting(self) -> None:
        if self.line is not None:
            self.line.close()
            self.line = None

    @property
    def closed(self) -> bool:
        return self.line is None

    def close(self) -> None:
        self.dialer.stop()
        if self.line is not None:
            self.line.close()
