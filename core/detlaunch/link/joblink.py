"""Node supervisors form one job: each worker node's supervisor holds a TCP link to the chief's.

Over the link, a worker reports its ranks' exits and its own failures; the chief, the one
authority on the job's outcome, answers any failure anywhere by telling every node to stop,
with the root cause and the exit code every node then exits with. Both sides send a heartbeat;
a peer silent for HEARTBEAT_MISSES intervals is lost, and a lost peer stops the job.

A lost worker node can join again, for the job's next attempt (restart.py decides whether there
is one): the chief forgets it and listens again, and the node's new detlaunch joins through the
same authenticated admission as a first join. The welcome says which attempt the node joins and
whether it waits for the chief's "go" (every node is back). A node that is still connected is
never displaced: a second join for it is refused, whatever its credentials.

Authentication: an HMAC-SHA256 challenge-response in both directions over a per-job secret,
which never appears on a command line: it comes from DETLAUNCH_JOB_SECRET when the scheduler
sets one on every node, else from a 0600 file in the job directory shared by the nodes (the
chief writes it before it starts listening, so a worker that reaches the listener reads the
current secret, never a stale one).
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from detlaunch.errors import LaunchError
from detlaunch.link.dial import Dialer
from detlaunch.link.fdlimit import chief_needs, ensure_open_files
from detlaunch.outcome import Failure, RankStatus
from detlaunch.system.eventloop import EventLoop, Priority, Timer

if TYPE_CHECKING:
    from detlaunch.planning.plan import LaunchPlan
from detlaunch.system.jobdir import SECRET_ENV, SECRET_FILE, create_secret, read_secret
from detlaunch.system.safefs import random_hex

HEARTBEAT_MISSES = 5
MAX_UNAUTHENTICATED = 4096  # bytes a peer may send before it has proven it is a node of the job
# Bytes a peer may leave unread (beyond what the kernel buffers) before it counts as lost: sends
# never block the loop, so a stalled or stopped node cannot delay the verdict for the others.
MAX_UNSENT = 1 << 20
HEARTBEAT = b'{"t": "hb"}'  # the one message sent every heartbeat: sent and recognised without (de)coding
# Work the chief takes on for connections that have not authenticated yet: a flood on the control
# port must not slow the verdict path (rank reports and the nodes' links come first).
ACCEPTS_PER_SECOND = 200
MAX_PENDING, MAX_PENDING_PER_PEER = 64, 8
def mac(secret: str, *parts: object) -> str:
    import hmac  # here: only a job with a link between nodes signs

    return hmac.new(secret.encode(), "\0".join(map(str, parts)).encode(), hashlib.sha256).hexdigest()


def mac_matches(given: object, expected: str) -> bool:
    """Constant-time, for anything a peer sent (compare_digest raises on a non-ASCII str)."""
    import hmac

    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


class ChiefEvents(Protocol):
    """What the chief's link tells its supervisor."""

    def trace(self, message: str) -> None: ...
    def joined(self) -> None: ...  # every node has joined
    def remote_rank_exit(self, status: RankStatus) -> None: ...
    def remote_failure(self, failure: Failure) -> None: ...
    def node_lost(self, node: int, addr: str, why: str) -> None: ...
    def node_joined(self, node: int, addr: str) -> None: ...
    def remote_ask(self, node: int, key: int, what: str, args: dict[str, Any]) -> None: ...
    def remote_reply(self, node: int, key: int, data: Any) -> None: ...


class WorkerEvents(Protocol):
    """What a worker's link tells its supervisor."""

    def trace(self, message: str) -> None: ...
    def joined(self) -> None: ...  # this node joined the chief (WorkerLink.attempt, .hold: what it joined)
    def link_failed_to_start(self, what: str) -> None: ...
    def chief_verdict(self, failure: Failure | None) -> None: ...
    def chief_restart(self, attempt: int, delay: float | None) -> None: ...  # None: wait for chief_go
    def chief_go(self, attempt: int) -> None: ...  # every node is back: start `attempt` now
    def chief_lost(self, why: str) -> None: ...
    def chief_request(self, key: int, what: str, args: dict[str, Any]) -> None: ...
    def chief_answer(self, key: int, data: dict[str, Any]) -> None: ...


class PeerConnection:
    """One TCP connection to another node's supervisor, carrying JSON lines, driven by the event loop."""

    def __init__(self, loop: EventLoop, sock: socket.socket,
                 on_message: Callable[[PeerConnection, dict[str, Any]], None],
                 on_close: Callable[[PeerConnection], None]):
        self.loop, self.sock = loop, sock
        self.on_message, self.on_close = on_message, on_close
        self.buffer = b""
        self.closed = False
        self.opened = time.monotonic()
        self.last_heard = time.monotonic()
        self.node: int | None = None
        self.peer = ""  # the remote address
        self.authed = False
        self.nonce = random_hex(16)
        self.unsent = bytearray()
        self.writing = False  # the loop calls flush when the socket takes more
        self.why = ""  # why the link closed, when this side closed it for a reason
        self.closing = False  # close once everything queued is sent (close_when_sent)
        sock.setblocking(False)
        # Unproven peers are served after everything else; a node of the job is raised on joining.
        loop.add_reader(sock, Priority.PROBE, self.on_readable)

    def trusted(self) -> None:
        self.authed = True
        self.loop.remove(self.sock)
        self.loop.add_reader(self.sock, Priority.RANK_REPORT, self.on_readable)
        if self.writing:
            self.loop.on_writable(self.sock, self.flush)

    def send(self, message: dict[str, Any]) -> None:
        self.send_line(encode(message))

    def send_line(self, line: bytes) -> None:
        """Queue one encoded message and send what the socket takes now; never blocks."""
        if self.closed:
            return
        self.unsent += line + b"\n"
        if len(self.unsent) > MAX_UNSENT:
            self.why = f"it left {len(self.unsent)} bytes of the link unread (stopped, or hung)"
            self.close(notify=True)
        elif not self.writing:
            self.flush()

    def flush(self) -> None:
        try:
            while self.unsent:
                del self.unsent[: self.sock.send(self.unsent)]
        except BlockingIOError:
            pass
        except OSError:
            self.close(notify=True)
            return
        if self.closing and not self.unsent:
            self.close()
            return
        if self.writing != bool(self.unsent):
            self.writing = bool(self.unsent)
            self.loop.on_writable(self.sock, self.flush if self.writing else None)

    def close_when_sent(self) -> None:
        """Close once the last queued message is out (the socket's own buffer then delivers it):
        closing at once would drop what the socket has not taken yet."""
        self.closing = True
        self.flush()

    def on_readable(self) -> None:
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
                if raw == HEARTBEAT:
                    continue
                try:
                    message = json.loads(raw)
                except (ValueError, RecursionError):  # RecursionError: "[[[[...", before any auth
                    self.close(notify=True)
                    return
                if isinstance(message, dict) and message.get("t") != "hb":
                    self.on_message(self, message)

    def close(self, notify: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove(self.sock)
        self.sock.close()
        if notify:
            self.on_close(self)

    def silent_for(self) -> float:
        return time.monotonic() - self.last_heard


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


def _message_failure(m: dict[str, Any]) -> Failure | None:
    """The failure a stop/end/failed message carries (None when it carries none, or a bad one)."""
    try:
        return Failure.from_json(m["failure"]) if m.get("failure") else None
    except (KeyError, TypeError, ValueError):
        return None


class Admission:
    """How many unauthenticated connections the chief takes on: at most `max_pending` at once
    (`max_per_peer` from one address), and `per_second` new ones a second (a token bucket)."""

    def __init__(self, per_second: float, max_pending: int, max_per_peer: int) -> None:
        self.per_second, self.max_pending, self.max_per_peer = per_second, max_pending, max_per_peer
        self.tokens = float(max_pending)
        self.updated: float | None = None

    def wait(self, pending: int, now: float) -> float:
        """0 when one more connection may be accepted now (and take its token), else how long to wait."""
        if self.updated is not None:
            self.tokens = min(float(self.max_pending), self.tokens + (now - self.updated) * self.per_second)
        self.updated = now
        if pending >= self.max_pending:
            return 0.1  # until a pending connection authenticates, is refused, or times out
        if self.tokens < 1:
            return (1 - self.tokens) / self.per_second
        self.tokens -= 1
        return 0.0


class ChiefLink:
    """The chief's side: accepts every worker node's supervisor, and decides for the job."""

    def __init__(self, loop: EventLoop, plan: LaunchPlan, events: ChiefEvents):
        self.loop, self.events = loop, events
        self.job_id = plan.cluster.job_id
        self.heartbeat = plan.heartbeat
        self.shared_dir = plan.shared_dir
        self.secret_from_env = bool(plan.environ.get(SECRET_ENV))
        self.secret = create_secret(plan.environ, plan.shared_dir)
        self.expected = set(range(1, plan.cluster.num_nodes))
        ensure_open_files(chief_needs(plan.cluster))
        self.nodes: dict[int, PeerConnection] = {}
        self.pending: set[PeerConnection] = set()  # accepted, not authenticated yet
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
        except UnicodeError as e:  # a name IDNA cannot encode
            raise LaunchError(f"cannot resolve {host!r}: {e}") from None
        except OSError as e:
            raise LaunchError(f"cannot listen on {host}:{plan.control_port} for the other nodes "
                              f"({e.strerror}): choose a free port with --control-port") from None
        self.listener.listen(max(64, len(self.expected)))  # every node may dial at once (capped by somaxconn)
        self.listener.setblocking(False)
        # A job of N nodes may see N legitimate connections at once: admit at least N a second.
        self.admission = Admission(max(ACCEPTS_PER_SECOND, len(self.expected)), MAX_PENDING, MAX_PENDING_PER_PEER)
        self.listening = False
        self.paused: Timer | None = None
        # What a node joining now is told: the attempt it joins, and whether it waits for "go" (a restart
        # waiting for lost nodes to come back) or starts at once (the first attempt).
        self.attempt = 1
        self.holding = False
        self.end_in_sight: float | None = None  # when ready_to_finish was first asked, this attempt
        self._listen()
        self.timer: Timer | None = loop.call_later(self.heartbeat, self.tick)

    def _listen(self) -> None:
        self.paused = None
        if not self.listening and self.expected - set(self.nodes) and self.listener.fileno() >= 0:
            self.loop.add_reader(self.listener, Priority.CHILD_OUTPUT, self.on_accept)
            self.listening = True

    def _stop_listening(self, for_seconds: float | None) -> None:
        """Leave new connections in the kernel's backlog (none at all once every node has joined)."""
        if self.listening:
            self.loop.remove(self.listener)
            self.listening = False
        if for_seconds is not None and self.paused is None:
            self.paused = self.loop.call_later(for_seconds, self._listen)

    def on_accept(self) -> None:
        while True:
            wait = self.admission.wait(len(self.pending), self.loop.clock())
            if wait:
                self._stop_listening(for_seconds=wait)
                return
            try:
                sock, addr = self.listener.accept()
            except BlockingIOError:
                return
            except OSError:  # the listener was closed under us
                return
            peer = str(addr[0])
            if sum(1 for p in self.pending if p.peer == peer) >= self.admission.max_per_peer:
                sock.close()  # one address cannot hold every pending slot
                continue
            line = PeerConnection(self.loop, sock, self.on_message, self.on_close)
            line.peer = peer
            self.pending.add(line)
            line.send({"t": "challenge", "job": self.job_id, "nonce": line.nonce})

    def on_message(self, line: PeerConnection, m: dict[str, Any]) -> None:
        kind = m.get("t")
        if not line.authed:
            self._authenticate(line, m)
        elif kind == "rank_exit":
            status = RankStatus.from_json(m["status"])
            self.remote_ranks[status.rank] = status
            self.events.remote_rank_exit(status)
        elif kind == "failed":
            failure = _message_failure(m)
            if failure is not None:
                self.events.remote_failure(failure)
        elif kind == "ask" and line.node is not None:  # a client asked that node (control.py)
            self.events.remote_ask(line.node, int(m["id"]), str(m.get("what")), dict(m.get("args") or {}))
        elif kind == "reply" and line.node is not None:
            self.events.remote_reply(line.node, int(m["id"]), m.get("data"))
        elif kind == "bye":
            for d in m.get("ranks") or ():
                status = RankStatus.from_json(d)
                self.remote_ranks[status.rank] = status
            assert line.node is not None
            self.finished.add(line.node)  # the line stays open for the final verdict

    def _authenticate(self, line: PeerConnection, m: dict[str, Any]) -> None:
        self.pending.discard(line)
        node = m.get("node")
        ok = (m.get("t") == "auth" and isinstance(node, int) and node in self.expected and self.secret
              and mac_matches(m.get("mac"), mac(self.secret, "worker", self.job_id, node, line.nonce)))
        if not ok or node in self.nodes:
            self.events.trace(f"refused a control connection (node {node!r}): bad credentials or duplicate")
            line.close()
            return
        assert isinstance(node, int) and self.secret
        line.trusted()
        line.node = node
        self.nodes[node] = line
        if not self.expected - set(self.nodes):
            self._stop_listening(for_seconds=None)  # every node is here: nobody else has a reason to connect
        self.addrs[node] = str(m.get("addr") or line.sock.getpeername()[0])
        line.send({"t": "welcome", "mac": mac(self.secret, "chief", self.job_id, node, m.get("nonce")),
                   "attempt": self.attempt, "hold": self.holding})
        if self.stop_message is not None:  # joined after the job was stopped
            line.send(self.stop_message)
        self.events.trace(f"node {node} joined the job")
        self.events.node_joined(node, self.addrs[node])
        if not self.missing_nodes():
            self.events.joined()

    def on_close(self, line: PeerConnection) -> None:
        self.pending.discard(line)
        if self.paused is None:
            self._listen()  # a pending slot is free again
        node = line.node
        if node is None or node in self.finished:
            return
        self.finished.add(node)
        self.events.node_lost(node, self.addr_of(node),
                              line.why or "its detlaunch closed the connection without saying goodbye")

    def addr_of(self, node: int) -> str:
        return self.addrs.get(node, "address unknown")

    def tick(self) -> None:
        now = time.monotonic()
        for line in [p for p in self.pending if now - p.opened > HEARTBEAT_MISSES * self.heartbeat]:
            self.events.trace("closed a control connection that never authenticated")
            self.pending.discard(line)
            line.close()
        for node, line in list(self.nodes.items()):
            if line.closed:
                continue
            if line.silent_for() > HEARTBEAT_MISSES * self.heartbeat:
                line.close()
                self.finished.add(node)
                self.events.node_lost(node, self.addr_of(node),
                                      f"no heartbeat for {HEARTBEAT_MISSES * self.heartbeat:g} s")
            else:
                line.send_line(HEARTBEAT)
        self.timer = self.loop.call_later(self.heartbeat, self.tick)

    def missing_nodes(self) -> list[int]:
        return sorted(self.expected - set(self.nodes))

    def rank_exited(self, status: RankStatus) -> None:
        pass  # the chief's own ranks are in its own report

    def failed(self, failure: Failure) -> None:
        """The job failed (here or anywhere): every node stops, with this verdict (so far)."""
        self.stop_message = {"t": "stop", "failure": failure.to_json()}
        encoded = encode(self.stop_message)  # once, for every node
        for line in self.nodes.values():
            line.send_line(encoded)

    def live_nodes(self) -> set[int]:
        """The worker nodes that joined and are still connected."""
        return {n for n, line in self.nodes.items() if not line.closed}

    def request(self, node: int, key: int, what: str, args: dict[str, Any]) -> None:
        self.nodes[node].send({"t": "request", "id": key, "what": what, "args": args})

    def answer(self, node: int, key: int, data: dict[str, Any]) -> None:
        line = self.nodes.get(node)
        if line is not None:
            line.send({"t": "answer", "id": key, "data": data})

    def ready_to_finish(self) -> bool:
        """Every node that joined has said goodbye or was lost, and no node is halfway through joining
        (it would find the secret gone). A handshake in progress is waited for only while a node of the
        job has not joined yet (once every node is here, an unauthenticated connection can be nobody's:
        a flood of them never delays the end), and only one begun before the attempt's end was first in
        sight (the tick closes one that never ends). A node that never dialed: nothing to wait for."""
        if self.end_in_sight is None:
            self.end_in_sight = time.monotonic()
        cutoff = self.end_in_sight
        joining = self.missing_nodes() and any(p.opened <= cutoff for p in self.pending)
        return set(self.nodes) <= self.finished and not joining

    def lost_nodes(self) -> list[int]:
        """Nodes whose link is gone: their new detlaunch must join again before another attempt starts."""
        return sorted(n for n, line in self.nodes.items() if line.closed)

    def restart(self, attempt: int, delay: float) -> None:
        """Every node said goodbye to the last attempt: each starts `attempt` after `delay` seconds.

        With lost nodes, they are forgotten and the chief listens for them again; the others (and
        each node as it joins) wait for go(): the attempt starts only once every node is back.
        """
        lost = self.lost_nodes()
        for node in lost:
            del self.nodes[node]
        self.attempt, self.holding = attempt, bool(lost)
        self.end_in_sight = None
        restart = encode({"t": "restart", "attempt": attempt, "delay": None if lost else delay})
        for line in self.nodes.values():
            line.send_line(restart)
        self.finished = set()
        self.remote_ranks = {}
        self.stop_message = None
        if lost:
            self._listen()

    def forget_lost(self) -> list[int]:
        """Between attempts, nodes were lost (returned): forget them and listen for them again, as restart()
        does; the nodes waiting for the next attempt are told to hold, so that it starts only on go()."""
        lost = self.lost_nodes()
        for node in lost:
            del self.nodes[node]
            self.finished.discard(node)  # its next detlaunch's goodbye, or loss, counts again
        self.end_in_sight = None
        if lost and not self.holding:
            self.holding = True
            hold = encode({"t": "restart", "attempt": self.attempt, "delay": None})
            for line in self.nodes.values():
                line.send_line(hold)
        if lost:
            self._listen()
        return lost

    def go(self) -> None:
        """Every node is back after a lost one: the attempt the nodes wait for starts now."""
        if self.holding:
            self.holding = False
            go = encode({"t": "go", "attempt": self.attempt})
            for line in self.nodes.values():
                line.send_line(go)

    def finish(self, failure: Failure | None, ranks: list[RankStatus]) -> None:
        """Every node has finished: tell each the final verdict (the earliest failure of all)."""
        end = encode({"t": "end", "failure": failure.to_json() if failure else None})
        for line in self.nodes.values():
            line.send_line(end)
            line.close_when_sent()
        self.loop.remove(self.listener)
        self.listener.close()
        # A worker that does not read (stopped, hung) gets the heartbeat window, then is let go.
        self.loop.call_later(HEARTBEAT_MISSES * self.heartbeat, self._let_go)

    def _let_go(self) -> None:
        for line in self.nodes.values():
            line.close()

    @property
    def closed(self) -> bool:
        """Every worker has its final verdict (or was let go)."""
        return all(line.closed for line in self.nodes.values())

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for line in [*self.nodes.values(), *self.pending]:
            line.close()
        self.loop.remove(self.listener)
        try:
            self.listener.close()
        except OSError:
            pass
        if not self.secret_from_env:
            try:
                os.unlink(os.path.join(self.shared_dir, SECRET_FILE))
            except OSError:
                pass


class LinkState(enum.Enum):
    """Where a worker node's link to the chief is. Every change goes through WorkerLink._to (traced
    under --debug)::

        DIALING --welcome--> JOINED --stop--> STOPPED
                               ^                 |
                               +----restart------+
        JOINED or STOPPED --end--> ENDED       (the chief's last word: the job is over)
        any --close()--> CLOSED                (this node is done with the link)

    A line that closes in DIALING is a failed start; in JOINED or STOPPED, a lost chief; in ENDED or
    CLOSED, expected.
    """

    DIALING = "dialing"  # reaching the chief, and proving to each other who we are
    JOINED = "joined"  # welcomed: this node runs the attempts the chief starts, and reports to it
    STOPPED = "stopped"  # the chief stopped this attempt (its verdict): nothing more to report on it
    ENDED = "ended"
    CLOSED = "closed"


class WorkerLink:
    """A worker node's side: reaches the chief (retrying until the start timeout) and obeys it."""

    def __init__(self, loop: EventLoop, plan: LaunchPlan, events: WorkerEvents):
        self.loop, self.events = loop, events
        self.node = plan.cluster.node_rank
        self.job_id = plan.cluster.job_id
        self.heartbeat = plan.heartbeat
        self.chief = (plan.cluster.chief_addr, plan.control_port)
        self.shared_dir = plan.shared_dir
        self.env = plan.environ
        self.line: PeerConnection | None = None
        self.state = LinkState.DIALING
        self.secret: str | None = None
        self.unsent: list[dict[str, Any]] = []  # said before the welcome: the chief takes anything else for auth
        self.attempt = 1  # the attempt the chief's welcome said this node joins
        self.hold = False  # and whether it waits for the chief's "go" first
        self.dialer = Dialer(loop, *self.chief, self._on_connected, events.link_failed_to_start,
                             source=plan.cluster.node_addr)
        self.timer: Timer | None = loop.call_later(self.heartbeat, self.tick)

    def _on_connected(self, sock: socket.socket) -> None:
        self.line = PeerConnection(self.loop, sock, self.on_message, self.on_close)

    def _to(self, state: LinkState) -> None:
        if state is not self.state:
            self.events.trace(f"link to the chief: {self.state.value} -> {state.value}")
            self.state = state

    @property
    def joined(self) -> bool:
        """The chief has welcomed this node (whatever happened since)."""
        return self.state in (LinkState.JOINED, LinkState.STOPPED, LinkState.ENDED)

    def on_message(self, line: PeerConnection, m: dict[str, Any]) -> None:
        kind = m.get("t")
        if kind == "challenge":
            self._answer(line, m)
        elif kind == "welcome":
            assert self.secret is not None
            expected = mac(self.secret, "chief", self.job_id, self.node, line.nonce)
            if not mac_matches(m.get("mac"), expected):
                self._give_up(line, f"the chief at {self.chief[0]}:{self.chief[1]} failed authentication")
                return
            line.trusted()
            self._to(LinkState.JOINED)
            for message in self.unsent:
                line.send(message)
            self.unsent.clear()
            self.attempt, self.hold = int(m.get("attempt") or 1), bool(m.get("hold"))
            self.events.trace(f"joined the chief (attempt {self.attempt}{', waiting for go' if self.hold else ''})")
            self.events.joined()
        elif not line.authed:
            return  # nothing but the handshake counts before the chief has proven who it is
        elif kind == "stop":
            self._to(LinkState.STOPPED)
            self.events.chief_verdict(_message_failure(m))
        elif kind == "request":  # the chief gathers every node's answer to a client's question
            self.events.chief_request(int(m["id"]), str(m.get("what")), dict(m.get("args") or {}))
        elif kind == "answer":
            self.events.chief_answer(int(m["id"]), dict(m.get("data") or {}))
        elif kind == "restart":
            self._next_attempt()
            delay = m.get("delay")
            self.events.chief_restart(int(m["attempt"]), None if delay is None else float(delay))
        elif kind == "go":
            self.events.chief_go(int(m["attempt"]))
        elif kind == "end":
            self._to(LinkState.ENDED)
            failure = _message_failure(m)
            if failure is not None:  # the final verdict, all nodes' reports considered
                self.events.chief_verdict(failure)
            line.close()
            self.line = None

    def _answer(self, line: PeerConnection, m: dict[str, Any]) -> None:
        if m.get("job") != self.job_id:
            self._give_up(line, f"the detlaunch listening on {self.chief[0]}:{self.chief[1]} runs job "
                                f"{m.get('job')!r}, not {self.job_id!r}: give every node the same --job-id")
            return
        try:
            self.secret = read_secret(self.env, self.shared_dir)
        except OSError as e:
            self._give_up(line, f"cannot read the job secret in {self.shared_dir} ({e.strerror}): the job "
                                f"directory must be shared by all nodes (--job-dir), or set {SECRET_ENV}")
            return
        line.send({"t": "auth", "node": self.node, "nonce": line.nonce, "addr": self.dialer.source,
                   "mac": mac(self.secret, "worker", self.job_id, self.node, m.get("nonce"))})

    def _give_up(self, line: PeerConnection, why: str) -> None:
        """The handshake failed on this side: drop the line (a node whose part is over may end) and say why."""
        self.line = None
        line.close()
        self.events.link_failed_to_start(why)

    def _send(self, message: dict[str, Any]) -> None:
        """To the chief once it has welcomed this node; kept until then."""
        if self.line is not None and self.line.authed:
            self.line.send(message)
        elif self.line is not None or self.state is LinkState.DIALING:
            self.unsent.append(message)

    def on_close(self, line: PeerConnection) -> None:
        self.line = None
        if self.state in (LinkState.ENDED, LinkState.CLOSED):
            return
        if not line.authed:
            self.events.link_failed_to_start(f"the chief at {self.chief[0]}:{self.chief[1]} refused this node "
                                             "(wrong job secret?)")
            return
        self.events.chief_lost(line.why or "the chief's detlaunch closed the connection")

    def tick(self) -> None:
        self.timer = None
        line = self.line
        if line is not None and line.authed:
            if line.silent_for() > HEARTBEAT_MISSES * self.heartbeat:
                line.close()
                self.line = None
                self.events.chief_lost(f"no heartbeat from the chief for {HEARTBEAT_MISSES * self.heartbeat:g} s")
                return
            line.send_line(HEARTBEAT)
        self.timer = self.loop.call_later(self.heartbeat, self.tick)

    def missing_nodes(self) -> list[int]:
        return [] if self.joined else [0]

    def rank_exited(self, status: RankStatus) -> None:
        self._send({"t": "rank_exit", "status": status.to_json()})

    def ask(self, key: int, what: str, args: dict[str, Any]) -> bool:
        """Pass a client's question to the chief; False when there is no chief to ask."""
        if self.line is None or not self.line.authed:
            return False
        self.line.send({"t": "ask", "id": key, "what": what, "args": args})
        return True

    def reply(self, key: int, data: Any) -> None:
        if self.line is not None:  # a request came: the line is trusted
            self.line.send({"t": "reply", "id": key, "data": data})

    def failed(self, failure: Failure) -> None:
        if self.state is not LinkState.STOPPED:
            self._send({"t": "failed", "failure": failure.to_json()})

    def ready_to_finish(self) -> bool:
        return True

    def finish(self, failure: Failure | None, ranks: list[RankStatus]) -> None:
        """Say goodbye with this node's ranks, then wait for the verdict (or a restart): as long as the
        chief's heartbeats come, however long its own ranks take to stop (--grace-period, a
        checkpoint on SIGTERM); a chief that is gone is found by the heartbeat watch (tick)."""
        self._send({"t": "bye", "ranks": [r.to_json() for r in ranks]})

    def _next_attempt(self) -> None:
        """The chief answered the goodbye with a restart: the link serves the next attempt."""
        self._to(LinkState.JOINED)

    @property
    def closed(self) -> bool:
        return self.line is None

    def close(self) -> None:
        self._to(LinkState.CLOSED)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.dialer.stop()
        if self.line is not None:
            self.line.close()
