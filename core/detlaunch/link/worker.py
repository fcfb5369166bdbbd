"""A worker node's side of the job link: it reaches the chief (retrying until the start timeout) and obeys it.

It proves itself (auth.py), reports its ranks' exits, its own failures and its goodbye, and passes
on what the chief says: the verdict to its supervisor, a restart or a "go" to whoever runs the
attempts, questions and answers to control.py. It says nothing before the chief's welcome: what
its node reports meanwhile waits for it. The messages are in messages.py; the connection in wire.py.
"""

from __future__ import annotations

import enum
import socket
from typing import Any, Protocol

from detlaunch.link import auth
from detlaunch.link.dial import Dialer
from detlaunch.link.membership import Membership, applied
from detlaunch.link.messages import (
    CHIEF,
    Answer,
    Ask,
    Auth,
    Bye,
    Challenge,
    End,
    Failed,
    Go,
    Members,
    MembersChange,
    Message,
    Promote,
    RankExit,
    Reply,
    Request,
    Restart,
    Stop,
    Welcome,
)
from detlaunch.link.settings import LinkSettings
from detlaunch.link.wire import HEARTBEAT, HEARTBEAT_MISSES, PeerConnection, message_bound
from detlaunch.outcome import Failure, RankStatus
from detlaunch.system.eventloop import EventLoop, Timer
from detlaunch.system.jobdir import SECRET_ENV, read_secret


class WorkerEvents(Protocol):
    """What a worker's link tells its node's supervisor."""

    def trace(self, message: str) -> None: ...
    def joined(self) -> None: ...  # this node joined the chief (WorkerLink.attempt, .hold: what it joined)
    def link_failed_to_start(self, what: str) -> None: ...
    def chief_verdict(self, failure: Failure | None) -> None: ...
    def chief_lost(self, why: str) -> None: ...
    def promoted(self, place: int) -> None: ...  # (a spare) take node `place`'s place (link/spares.py)
    def made_spare(self, number: int) -> None: ...  # this node's place is taken: join again as spare `number`


class WorkerQuestions(Protocol):
    """Where a worker's link delivers the chief's questions and answers (control.ControlRequests)."""

    def chief_request(self, key: int, what: str, args: dict[str, Any]) -> None: ...
    def answered(self, key: int, data: dict[str, Any]) -> None: ...
    def chief_gone(self) -> None: ...  # questions passed to it will get no answer


class AttemptOrders(Protocol):
    """Where a worker's link delivers the chief's restarts (node/attempt_driver.AttemptDriver)."""

    def chief_restart(self, attempt: int, delay: float | None) -> None: ...  # None: wait for chief_go
    def chief_go(self, attempt: int) -> None: ...  # every node is back: start `attempt` now


class NoQuestionsNoOrders:
    """WorkerQuestions and AttemptOrders that take nothing: for a link whose chief sends it neither (a spare
    waiting, node/spare.py; a simulated node)."""

    def chief_request(self, key: int, what: str, args: dict[str, Any]) -> None:
        pass

    def answered(self, key: int, data: dict[str, Any]) -> None:
        pass

    def chief_gone(self) -> None:
        pass

    def chief_restart(self, attempt: int, delay: float | None) -> None:
        pass

    def chief_go(self, attempt: int) -> None:
        pass


class LinkState(enum.Enum):
    """Where a worker node's link to the chief is. Every change goes through WorkerLink._to (traced
    under --debug)::

        DIALING --welcome--> JOINED --stop--> STOPPED
                               ^                 |
                               +----restart------+
        JOINED or STOPPED --end--> ENDED       (the chief's last word: the job is over)
        any --close()--> CLOSED                (this node is done with the link)

    A connection that closes in DIALING is a failed start; in JOINED or STOPPED, a lost chief; in
    ENDED or CLOSED, expected.
    """

    DIALING = "dialing"  # reaching the chief, and proving to each other who we are
    JOINED = "joined"  # welcomed: this node runs the attempts the chief starts, and reports to it
    STOPPED = "stopped"  # the chief stopped this attempt (its verdict): nothing more to report on it
    ENDED = "ended"
    CLOSED = "closed"


class WorkerLink:
    """A worker node's side: reaches the chief (retrying until the start timeout) and obeys it."""

    def __init__(self, loop: EventLoop, settings: LinkSettings, events: WorkerEvents, questions: WorkerQuestions,
                 orders: AttemptOrders):
        self.loop, self.events, self.questions, self.orders = loop, events, questions, orders
        self.node = settings.node
        self.promoted_from = settings.promoted_from  # this node is a spare sent to this place: said in its auth
        self.members: tuple[int, ...] | None = None  # the last "go"'s places (a job that may shrink)
        self.job_id = settings.job_id
        self.heartbeat = settings.heartbeat
        self.chief = (settings.chief_addr, settings.port)
        self.where = f"{settings.chief_addr}:{settings.port}"
        self.shared_dir = settings.shared_dir
        self.env = settings.environ
        self.connection: PeerConnection | None = None
        self.state = LinkState.DIALING
        self.secret: str | None = None
        self.known_secret = settings.secret  # a lost chief's follower holds it already (its job dir may be gone)
        self.unsent: list[Message] = []  # said before the welcome: the chief takes anything else for auth
        self.attempt = 1  # the attempt the chief's welcome said this node joins
        self.hold = False  # and whether it waits for the chief's "go" first
        self.membership: Membership | None = None  # the chief's latest: who succeeds it (node/succession.py)
        self.max_line = message_bound(settings.num_nodes + settings.spares)
        self.dialer = Dialer(loop, *self.chief, self._on_connected, events.link_failed_to_start,
                             source=settings.node_addr)
        self.timer: Timer | None = loop.call_later(self.heartbeat, self.tick)

    def _on_connected(self, sock: socket.socket) -> None:
        self.connection = PeerConnection(self.loop, sock, CHIEF, self.on_message, self.on_close)
        self.connection.max_line = self.max_line

    def _to(self, state: LinkState) -> None:
        if state is not self.state:
            self.events.trace(f"link to the chief: {self.state.value} -> {state.value}")
            self.state = state

    @property
    def joined(self) -> bool:
        """The chief has welcomed this node (whatever happened since)."""
        return self.state in (LinkState.JOINED, LinkState.STOPPED, LinkState.ENDED)

    # -- the handshake -------------------------------------------------------------------------------
    def _answer(self, conn: PeerConnection, m: Challenge) -> None:
        if m.job != self.job_id:
            self._give_up(conn, f"the detlaunch listening on {self.where} runs job {m.job!r}, not "
                                f"{self.job_id!r}: give every node the same --job-id")
            return
        try:
            self.secret = self.known_secret or read_secret(self.env, self.shared_dir)
        except OSError as e:
            self._give_up(conn, f"cannot read the job secret in {self.shared_dir} ({e.strerror}): the job "
                                f"directory must be shared by all nodes (--job-dir), or set {SECRET_ENV}")
            return
        conn.peer_nonce = m.nonce
        conn.send(Auth(node=self.node, nonce=conn.nonce, addr=self.dialer.source or "",
                       mac=auth.worker_mac(self.secret, self.job_id, self.node, m.nonce), spare=self.promoted_from))

    def _welcomed(self, conn: PeerConnection, m: Welcome) -> None:
        if self.secret is None or not auth.mac_matches(m.mac, auth.chief_mac(self.secret, self.job_id, self.node,
                                                                             conn.nonce)):
            self._give_up(conn, f"the chief at {self.where} failed authentication")
            return
        conn.trusted(auth.link_key(self.secret, self.job_id, self.node, conn.peer_nonce, conn.nonce))
        if m.spare is not None:
            self._made_spare(conn, m.spare)
            return
        self._to(LinkState.JOINED)
        for message in self.unsent:
            conn.send(message)
        self.unsent.clear()
        self.attempt, self.hold = m.attempt, m.hold
        self.events.trace(f"joined the chief (attempt {self.attempt}{', waiting for go' if self.hold else ''})")
        self.events.joined()

    def _made_spare(self, conn: PeerConnection, number: int) -> None:
        """A lost node's new detlaunch whose place is taken (a spare's, or the job shrank): this connection's
        part is over; the node joins again as spare `number` (link/spares.py)."""
        self._to(LinkState.ENDED)
        conn.close()
        self.connection = None
        self.events.made_spare(number)

    def _give_up(self, conn: PeerConnection, why: str) -> None:
        """The handshake failed on this side: drop the connection (a node whose part is over may end) and say why."""
        self.connection = None
        conn.close()
        self.events.link_failed_to_start(why)

    # -- what the chief says -------------------------------------------------------------------------
    def on_message(self, conn: PeerConnection, m: Message) -> None:
        if not conn.authed:  # nothing but the handshake counts before the chief has proven who it is
            if isinstance(m, Challenge):
                self._answer(conn, m)
            elif isinstance(m, Welcome):
                self._welcomed(conn, m)
            return
        match m:
            case Stop(failure=failure):
                self._to(LinkState.STOPPED)
                self.events.chief_verdict(failure)
            case Request(key=key, what=what, args=args):  # the chief gathers every node's answer to a question
                self.questions.chief_request(key, what, args)
            case Answer(key=key, data=data):
                self.questions.answered(key, data)
            case Restart(attempt=attempt, delay=delay):
                self._to(LinkState.JOINED)  # the chief answered the goodbye: the link serves the next attempt
                self.orders.chief_restart(attempt, delay)
            case Go(attempt=attempt, members=members):
                if members is not None:  # the places of this attempt (planning/membership.py)
                    self.members = members
                self.orders.chief_go(attempt)
            case Members(m=shared):
                self.membership = shared
            case MembersChange(c=change):  # what changed since the last one (the chief sent it whole first)
                if self.membership is not None:
                    self.membership = applied(self.membership, change)
            case Promote(place=place):
                self._to(LinkState.ENDED)  # this connection's part is over: the spare joins again as `place`
                conn.close()
                self.connection = None
                self.events.promoted(place)
            case End(failure=failure):
                self._to(LinkState.ENDED)
                if failure is not None:  # the final verdict, all nodes' reports considered
                    self.events.chief_verdict(failure)
                conn.close()
                self.connection = None

    def on_close(self, conn: PeerConnection) -> None:
        self.connection = None
        if self.state in (LinkState.ENDED, LinkState.CLOSED):
            return
        if not conn.authed:
            self.events.link_failed_to_start(
                f"the chief at {self.where} failed authentication: {conn.why}" if conn.why else
                f"the chief at {self.where} refused this node (wrong job secret?)")
            return
        self._lost(conn.why or "the chief's detlaunch closed the connection")

    def _lost(self, why: str) -> None:
        self.questions.chief_gone()
        self.events.chief_lost(why)

    def tick(self) -> None:
        self.timer = None
        conn = self.connection
        if conn is not None and conn.authed:
            if conn.silent_for() > HEARTBEAT_MISSES * self.heartbeat:
                conn.close()
                self.connection = None
                self._lost(f"no heartbeat from the chief for {HEARTBEAT_MISSES * self.heartbeat:g} s")
                return
            conn.send_encoded(HEARTBEAT)
        self.timer = self.loop.call_later(self.heartbeat, self.tick)

    # -- what this node says -------------------------------------------------------------------------
    def _send(self, message: Message) -> None:
        """To the chief once it has welcomed this node; kept until then."""
        if self.connection is not None and self.connection.authed:
            self.connection.send(message)
        elif self.connection is not None or self.state is LinkState.DIALING:
            self.unsent.append(message)

    def missing_nodes(self) -> list[int]:
        return [] if self.joined else [0]

    def rank_exited(self, status: RankStatus) -> None:
        self._send(RankExit(status=status))

    def ask(self, key: int, what: str, args: dict[str, Any]) -> bool:
        """Pass a client's question to the chief; False when there is no chief to ask."""
        if self.connection is None or not self.connection.authed:
            return False
        self.connection.send(Ask(key=key, what=what, args=args))
        return True

    def reply(self, key: int, data: Any) -> None:
        if self.connection is not None:  # a request came: the connection is trusted
            self.connection.send(Reply(key=key, data=data))

    def failed(self, failure: Failure) -> None:
        if self.state is not LinkState.STOPPED:
            self._send(Failed(failure=failure))

    def ready_to_finish(self) -> bool:
        return True

    def finish(self, failure: Failure | None, ranks: list[RankStatus]) -> None:
        """Say goodbye with this node's ranks, then wait for the verdict (or a restart): as long as the
        chief's heartbeats come, however long its own ranks take to stop (--grace-period, a
        checkpoint on SIGTERM); a chief that is gone is found by the heartbeat watch (tick)."""
        self._send(Bye(ranks=tuple(ranks)))

    @property
    def closed(self) -> bool:
        return self.connection is None

    def close(self) -> None:
        self._to(LinkState.CLOSED)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.dialer.stop()
        if self.connection is not None:
            self.connection.close()
