"""The chief's side of the job link: it admits every worker node's supervisor, and decides for the job.

Over the link, a worker reports its ranks' exits and its own failures; the chief, the one authority
on the job's outcome, answers any failure anywhere by telling every node to stop, with the root
cause and the exit code every node then exits with. Both sides send a heartbeat; a peer silent for
HEARTBEAT_MISSES intervals is lost, and a lost node stops the job (its supervisor decides).

A lost worker node can join again, for the job's next attempt (the restart policy decides whether
there is one): the chief forgets it and listens again, and the node's new detlaunch joins through
the same authenticated admission as a first join (auth.py). The welcome says which attempt the
node joins and whether it waits for the chief's "go" (every node is back).

The messages are in messages.py; the connections in wire.py.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Any, Protocol

from detlaunch.errors import LaunchError
from detlaunch.link import auth, places
from detlaunch.link.membership import Membership
from detlaunch.link.messages import (
    WORKER,
    Answer,
    Ask,
    Auth,
    Bye,
    Challenge,
    End,
    Failed,
    Go,
    Message,
    RankExit,
    Reply,
    Request,
    Restart,
    Stop,
    Welcome,
    encode,
    statuses_in,
)
from detlaunch.link.settings import LinkSettings
from detlaunch.link.sharing import MembershipSharing
from detlaunch.link.spares import SparePool
from detlaunch.link.wire import HEARTBEAT, HEARTBEAT_MISSES, PeerConnection, message_bound, together
from detlaunch.outcome import Failure, RankStatus
from detlaunch.planning.addresses import bind_host
from detlaunch.system.eventloop import EventLoop, Priority, Timer
from detlaunch.system.jobdir import SECRET_ENV, SECRET_FILE, create_secret


class ChiefEvents(Protocol):
    """What the chief's link tells its node's supervisor."""

    def trace(self, message: str) -> None: ...
    def joined(self) -> None: ...  # every node has joined
    def node_joined(self, node: int, addr: str) -> None: ...
    def remote_rank_exit(self, status: RankStatus) -> None: ...
    def remote_failure(self, failure: Failure) -> None: ...
    def node_lost(self, node: int, addr: str, why: str) -> None: ...
    def spare_joined(self, node: int, addr: str) -> None: ...
    def spare_lost(self, node: int, addr: str, why: str) -> None: ...


class ChiefQuestions(Protocol):
    """Where the chief's link delivers the questions of the workers' clients and the workers' parts of the
    answers the chief gathers (control.ControlRequests)."""

    def remote_ask(self, node: int, key: int, what: str, args: dict[str, Any]) -> None: ...
    def part(self, key: int, node: int, data: Any) -> None: ...
    def node_gone(self, node: int) -> None: ...  # it will answer nothing more


class ChiefLink:
    """The chief's side: accepts every worker node's supervisor, and decides for the job."""

    def __init__(self, loop: EventLoop, settings: LinkSettings, events: ChiefEvents, questions: ChiefQuestions):
        self.loop, self.events, self.questions = loop, events, questions
        self.job_id = settings.job_id
        self.heartbeat = settings.heartbeat
        self.shared_dir = settings.shared_dir
        self.secret_from_env = bool(settings.environ.get(SECRET_ENV))
        self.secret = create_secret(settings.environ, settings.shared_dir, settings.secret)
        self.keep_secret = False  # a chief that steps down leaves it to its successor (node/succession.py)
        self.expected = set(range(1, settings.num_nodes))  # the places whose nodes run the next attempt
        self.places = frozenset(range(1, settings.num_nodes))  # every worker place (--nnodes MAX; link/places.py)
        self.spares = SparePool(settings.num_nodes, settings.spares, events)  # link/spares.py
        self.nodes: dict[int, PeerConnection] = {}
        self.pending: set[PeerConnection] = set()  # accepted, not authenticated yet
        self.finished: set[int] = set()  # said goodbye, or were lost
        self.remote_ranks: dict[int, RankStatus] = {}
        self.stop_message: Stop | None = None
        self.addrs = {n: a for n, a in enumerate(settings.node_addrs) if a}  # + peers as they join
        host, port = bind_host(settings.chief_addr, settings.bind_any), settings.port
        try:
            family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            self.listener = socket.socket(family, socket.SOCK_STREAM)
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind(addr)
        except UnicodeError as e:  # a name IDNA cannot encode
            raise LaunchError(f"cannot resolve {host!r}: {e}") from None
        except OSError as e:
            raise LaunchError(f"cannot listen on {host}:{port} for the other nodes "
                              f"({e.strerror}): choose a free port with --link-port") from None
        self.listener.listen(max(64, len(self.expected)))  # every node may dial at once (capped by somaxconn)
        self.listener.setblocking(False)
        # A job of N nodes may see N legitimate connections at once: admit at least N a second.
        self.admission = auth.Admission(max(auth.ACCEPTS_PER_SECOND, len(self.expected)), auth.MAX_PENDING,
                                        auth.MAX_PENDING_PER_PEER)
        self.listening = False
        self.paused: Timer | None = None
        # What a node joining now is told: the attempt it joins, and whether it waits for "go" (a restart
        # waiting for lost nodes to come back) or starts at once (the first attempt).
        self.attempt = 1
        self.holding = False
        self.end_in_sight: float | None = None  # when ready_to_finish was first asked, this attempt
        self.sharing = MembershipSharing()  # the membership told to every node (share)
        self.joining_next: dict[int, int] = {}  # place -> spare joined there as its attempt stops (places.joins_next)
        self.went_whole = True  # the last go was on every place (or there was none): see go()
        self.asking: tuple[int | None, bytes] = (None, b"")  # the last question asked of the nodes, encoded
        self.listen()
        self.timer: Timer | None = loop.call_later(self.heartbeat, self.tick)

    # -- admission ---------------------------------------------------------------------------------
    def listen(self) -> None:
        self.paused = None
        if not self.listening and places.anyone_to_admit(self) and self.listener.fileno() >= 0:
            self.loop.add_reader(self.listener, Priority.CHILD_OUTPUT, self.on_accept)
            self.listening = True

    def _stop_listening(self, for_seconds: float | None) -> None:
        """Leave new connections in the kernel's backlog (none at all once every node has joined)."""
        if self.listening:
            self.loop.remove(self.listener)
            self.listening = False
        if for_seconds is not None and self.paused is None:
            self.paused = self.loop.call_later(for_seconds, self.listen)

    def on_accept(self) -> None:
        known = {*self.addrs.values(), *self.spares.addrs.values()}  # the job's own nodes' addresses
        while True:
            wait = self.admission.wait(self.loop.clock())
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
            if not auth.admits(peer, [p.peer for p in self.pending], known, self.admission):
                sock.close()  # one address, or a few, cannot hold every pending slot
                continue
            conn = PeerConnection(self.loop, sock, WORKER, self.on_message, self.on_close)
            conn.peer, conn.max_line = peer, message_bound(self.spares.next)  # every node and spare of the job
            self.pending.add(conn)
            conn.send(Challenge(job=self.job_id, nonce=conn.nonce))

    def _authenticate(self, conn: PeerConnection, m: Message) -> None:
        self.pending.discard(conn)
        node = m.node if isinstance(m, Auth) else None
        spare = node is not None and self.spares.admits(node)
        returned = node is not None and places.place_taken(self, node, m.spare if isinstance(m, Auth) else None)
        ok = (isinstance(m, Auth) and (m.node in self.expected or spare or returned) and bool(self.secret)
              and auth.mac_matches(m.mac, auth.worker_mac(self.secret, self.job_id, m.node, conn.nonce)))
        if ok and returned:  # its place is another's or empty: it joins again as a spare (link/places.py)
            assert isinstance(m, Auth)
            places.enlist(self, conn, m)
            self.listen()  # for it, as that spare
            return
        # A spare sent to a node's place as the node was lost: it joins while that attempt stops, for the next.
        early = ok and isinstance(m, Auth) and places.joins_next(self, m.node, m.spare)
        if not ok or node is None or (node in self.nodes and not early):
            self.events.trace(f"refused a link connection (node {node!r}): bad credentials or duplicate")
            conn.close()
            return
        assert isinstance(m, Auth)
        conn.trusted(auth.link_key(self.secret, self.job_id, node, conn.nonce, m.nonce))  # sends from the welcome on
        conn.node = node
        addr = m.addr or str(conn.sock.getpeername()[0])
        if spare:  # it waits, held, until a node's place is free (spares.py); welcomed first, maybe promoted at once
            conn.send(Welcome(mac=auth.chief_mac(self.secret, self.job_id, node, m.nonce), attempt=self.attempt,
                              hold=True))
            self.spares.joined(node, conn, addr)
            self.sharing.welcome(conn)
            self._stop_listening_if_complete()
            return
        if early:  # held until the restart; its lost predecessor still counts in the attempt that stops
            self.joining_next[node] = m.spare or 0
        self.nodes[node] = conn
        self.spares.arrived(node)
        self._stop_listening_if_complete()
        self.addrs[node] = addr
        conn.send(Welcome(mac=auth.chief_mac(self.secret, self.job_id, node, m.nonce),
                          attempt=self.attempt + 1 if early else self.attempt, hold=self.holding or early))
        self.sharing.welcome(conn)
        if self.stop_message is not None and not early:  # joined after the job was stopped
            conn.send(self.stop_message)
        self.events.trace(f"node {node} joined the job" + (" for the next attempt" if early else ""))
        self.events.node_joined(node, self.addrs[node])
        if not early and len(self.nodes) >= len(self.expected) and not self.missing_nodes():  # (count first: O(1))
            self.events.joined()

    def _stop_listening_if_complete(self) -> None:
        if not places.anyone_to_admit(self):
            self._stop_listening(for_seconds=None)  # every node is here: nobody else has a reason to connect

    # -- what the workers say ------------------------------------------------------------------------
    def on_message(self, conn: PeerConnection, m: Message) -> None:
        if not conn.authed:
            self._authenticate(conn, m)
            return
        node = conn.node
        assert node is not None  # set on authenticating
        if any(status.node_rank != node for status in statuses_in(m)):  # a node speaks for its own ranks only
            return conn.end(f"it sent a rank status of another node than its own ({node})")
        match m:
            case RankExit(status=status):
                self.remote_ranks[status.rank] = status
                self.events.remote_rank_exit(status)
            case Failed(failure=failure) if failure is not None:
                self.events.remote_failure(failure)
            case Ask(key=key, what=what, args=args):  # a client asked that node (control.py)
                self.questions.remote_ask(node, key, what, args)
            case Reply(key=key, data=data):
                self.questions.part(key, node, data)
            case Bye(ranks=ranks):
                for status in ranks:
                    self.remote_ranks[status.rank] = status
                self.finished.add(node)  # the connection stays open for the final verdict

    def on_close(self, conn: PeerConnection) -> None:
        self.pending.discard(conn)
        if self.paused is None:
            self.listen()  # a pending slot is free again
        node = conn.node
        if self.spares.owns(conn):
            self.spares.closed(conn, conn.why or "its detlaunch closed the connection")
            return
        if node is not None and self.nodes.get(node) is conn and node in self.joining_next:
            places.lost_early(self, node, conn.why or "its detlaunch closed the connection")
            return
        if node is None or node in self.finished or self.nodes.get(node) is not conn:
            return
        self.lost(node, conn.why or "its detlaunch closed the connection without saying goodbye")

    def lost(self, node: int, why: str) -> None:
        """Node `node` is lost: its questions go unanswered, its supervisor decides."""
        self.finished.add(node)
        self.questions.node_gone(node)
        self.events.node_lost(node, self.addr_of(node), why)

    def addr_of(self, node: int) -> str:
        return self.addrs.get(node, "address unknown")

    def tick(self) -> None:
        now = time.monotonic()
        silence = HEARTBEAT_MISSES * self.heartbeat
        for conn in [p for p in self.pending if now - p.opened > silence]:
            self.events.trace("closed a link connection that never authenticated")
            self.pending.discard(conn)
            conn.close()
        for node, conn in list(self.nodes.items()):
            if conn.closed:
                continue
            if conn.silent_for() > silence:
                conn.close()
                self.lost(node, f"no heartbeat for {silence:g} s")
            else:
                conn.send_encoded(HEARTBEAT)
        self.spares.tick(silence)
        self.timer = self.loop.call_later(self.heartbeat, self.tick)

    # -- what the supervisor asks of it ---------------------------------------------------------------
    def missing_nodes(self) -> list[int]:
        return sorted(self.expected - set(self.nodes))

    def rank_exited(self, status: RankStatus) -> None:
        pass  # the chief's own ranks are in its own report

    def failed(self, failure: Failure) -> None:
        """The job failed (here or anywhere): every node stops, with this verdict (so far)."""
        self.stop_message = Stop(failure=failure)
        self._to_every_node(self.stop_message)

    def together(self) -> contextlib.AbstractContextManager[None]:
        """What is sent to the nodes inside goes to each in one write (wire.together)."""
        return together(self.nodes.values())

    def _to_every_node(self, message: Message) -> None:
        encoded = encode(message)  # once, for every node
        for conn in self.nodes.values():
            conn.send_encoded(encoded)

    def share(self, m: Membership) -> None:
        """The membership to every node and every waiting spare (node/succession.py; link/sharing.py)."""
        self.sharing.share(m, [*self.nodes.values(), *self.spares.waiting.values()])

    def live_nodes(self) -> set[int]:
        """The worker nodes that joined and are still connected."""
        return {n for n, conn in self.nodes.items() if not conn.closed}

    def request(self, node: int, key: int, what: str, args: dict[str, Any]) -> None:
        """Node `node`'s part of gathering `key` (control.py asks every node in turn: encoded once for all)."""
        if self.asking[0] != key:
            self.asking = (key, encode(Request(key=key, what=what, args=args)))
        self.nodes[node].send_encoded(self.asking[1])

    def answer(self, node: int, key: int, data: dict[str, Any]) -> None:
        conn = self.nodes.get(node)
        if conn is not None:
            conn.send(Answer(key=key, data=data))

    def ready_to_finish(self) -> bool:
        """Every node that joined said goodbye or was lost, and none is halfway through joining (it would find the
        secret gone): a handshake begun before the end was first in sight, while a node of the job has not joined
        yet (a flood of unauthenticated connections never delays the end; the tick closes one that never ends)."""
        if self.end_in_sight is None:
            self.end_in_sight = time.monotonic()
        if len(self.finished) < len(self.nodes) or not self.nodes.keys() <= self.finished:
            return False  # (the count first: asked after every batch of goodbyes, O(1) until the last)
        cutoff = self.end_in_sight  # (no node pending: no sort)
        return not (any(p.opened <= cutoff for p in self.pending) and self.missing_nodes())

    def lost_nodes(self) -> list[int]:
        """Nodes whose connection is gone: their new detlaunch must join again before another attempt starts."""
        return sorted(n for n, conn in self.nodes.items() if conn.closed)

    def restart(self, attempt: int, delay: float) -> None:
        """Every node said goodbye to the last attempt: each starts `attempt` after `delay` seconds.

        With lost nodes, they are forgotten and the chief listens for them again; the others (and
        each node as it joins) wait for go(): the attempt starts only once every node is back.
        """
        lost = self.lost_nodes()
        for node in lost:
            del self.nodes[node]
        # Held for go: lost nodes, or places a shrunk job takes back (membership.py), or a spare that joined as the
        # last attempt stopped while the job runs on fewer than all places (it learns which from the go).
        hold = bool(self.missing_nodes()) or bool(self.joining_next) and bool(places.dropped(self))
        self.attempt, self.holding = attempt, hold
        self.end_in_sight = None
        self.joining_next = {}  # nodes of this attempt now, like the others
        self._to_every_node(Restart(attempt=attempt, delay=None if hold else delay))
        self.finished = set()
        self.remote_ranks = {}
        self.stop_message = None
        if hold:
            self.listen()

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
            self._to_every_node(Restart(attempt=self.attempt, delay=None))
        if lost:
            self.listen()
        return lost

    def go(self) -> None:
        """Every node is back after a lost one: the attempt the nodes wait for starts now. Its places are named
        only when some node may not know them: the job runs on fewer than all, or did at the last go (a node
        that had no go takes every place; one that had, its last go's). Else 1024 places to each of 1024 nodes."""
        if self.holding:
            self.holding = False
            members = places.members(self)
            every = len(members) == len(self.places) + 1
            self._to_every_node(Go(attempt=self.attempt, members=None if every and self.went_whole else members))
            self.went_whole = every

    def promote_spare(self, place: int, excluded: set[str]) -> tuple[int, str] | None:
        """Send a waiting spare (on no host in `excluded`) to take lost node `place`'s place (it joins again as
        that node): the spare's number and address, or None when no spare waits."""
        promoted = self.spares.promote(place, excluded)
        if promoted is not None:
            self.listen()  # for the spare's new connection, as node `place`
        return promoted

    def finish(self, failure: Failure | None, ranks: list[RankStatus]) -> None:
        """Every node has finished: tell each the final verdict (the earliest failure of all)."""
        self.spares.end(failure)
        self._to_every_node(End(failure=failure))
        for conn in self.nodes.values():
            conn.close_when_sent()
        self.loop.remove(self.listener)
        self.listener.close()
        # A worker that does not read (stopped, hung) gets the heartbeat window, then is let go.
        self.loop.call_later(HEARTBEAT_MISSES * self.heartbeat, self._let_go)

    def _let_go(self) -> None:
        for conn in self.nodes.values():
            conn.close()

    @property
    def closed(self) -> bool:
        """Every worker has its final verdict (or was let go)."""
        return all(conn.closed for conn in self.nodes.values())

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for conn in [*self.nodes.values(), *self.pending]:
            conn.close()
        self.spares.close()
        self.loop.remove(self.listener)
        try:
            self.listener.close()
        except OSError:
            pass
        if not self.secret_from_env and not self.keep_secret:
            try:
                os.unlink(os.path.join(self.shared_dir, SECRET_FILE))
            except OSError:
                pass
