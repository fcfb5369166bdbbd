"""The chief's places: which run the next attempt, and a lost node's detlaunch that comes back after its place
went to another (or the job shrank), made a spare.

A place is a worker node's number at the start (1..MAX-1); the link knows nodes by it (ChiefLink.places,
every one; ChiefLink.expected, those the next attempt waits for). With `--nnodes MIN:MAX` a place no spare
fills is dropped, and taken back when a spare waits at a restart (planning/membership.py decides, the
attempt driver acts). A lost node's new detlaunch whose place is taken or dropped is welcomed as a new spare
number (link/spares.py) and let go: it joins again through a spare's own admission (node/spare.py).
Functions of the chief's link, kept out of its class.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import detlaunch.exit_codes as exit_codes
from detlaunch.link import auth
from detlaunch.link.messages import Auth, End, Welcome
from detlaunch.link.spares import SparePool
from detlaunch.link.wire import PeerConnection
from detlaunch.outcome import Failure, FailureKind
from detlaunch.planning import membership


class Events(Protocol):
    def trace(self, message: str) -> None: ...
    def spare_lost(self, node: int, addr: str, why: str) -> None: ...


class ChiefLink(Protocol):
    """What these functions read of the chief's link (link/chief.py)."""

    expected: set[int]
    places: frozenset[int]
    nodes: dict[int, PeerConnection]
    finished: set[int]
    joining_next: dict[int, int]
    spares: SparePool
    secret: str
    job_id: str
    attempt: int

    @property
    def events(self) -> Events: ...

    @property
    def questions(self) -> Any: ...  # chief.ChiefQuestions

    def listen(self) -> None: ...
    def lost(self, node: int, why: str) -> None: ...
    def addr_of(self, node: int) -> str: ...


def members(link: ChiefLink) -> tuple[int, ...]:
    """The places that run the next attempt, in node-rank order (the chief first)."""
    return membership.members(link.expected)


def dropped(link: ChiefLink) -> set[int]:
    """Worker places that run no attempt now (the job shrank)."""
    return set(link.places - link.expected)


def drop(link: ChiefLink, places: set[int]) -> None:
    """The next attempt runs without these places: no node is waited for there."""
    link.expected -= places


def take_back(link: ChiefLink, places: list[int]) -> None:
    """A shrunk job grows: these places are waited for again (a spare is sent to each)."""
    link.expected |= set(places) & link.places


def anyone_to_admit(link: ChiefLink) -> bool:
    """A node of the job or a spare has not joined; or a place was taken or dropped, and the lost node's new
    detlaunch may come back (as a spare)."""
    return bool(len(link.nodes) < len(link.expected) or link.expected - link.nodes.keys() or link.spares.missing
                or link.spares.promoted or link.places - link.expected)  # (the count first: O(1) a join, not O(n))


def place_taken(link: ChiefLink, node: int, spare: int | None) -> bool:
    """Node `node`'s place is another's now (a spare was sent there, and the detlaunch claiming it says it is not
    that spare: `spare`, the spare number its auth names, or None) or empty (the job shrank): a new detlaunch
    of that node joins as a spare, not as the node. Told by what each says it is, not by its address (a spare
    and the lost node's new detlaunch may share one: a host, a NAT, a pod's recycled IP). A node still
    connected in its own place is never displaced."""
    spares = link.spares
    if node not in link.places:
        return False
    if node in spares.coming:
        return spare != spares.coming[node]
    return (node in link.nodes and node in spares.promoted.values()) or node not in link.expected


def enlist(link: ChiefLink, conn: PeerConnection, m: Auth) -> None:
    """Welcome it (proven as node `m.node`) as a new spare number, and let this connection go: it joins again
    as that spare."""
    number = link.spares.enlist()
    addr = m.addr or str(conn.sock.getpeername()[0])
    conn.trusted(auth.link_key(link.secret, link.job_id, m.node, conn.nonce, m.nonce))
    conn.send(Welcome(mac=auth.chief_mac(link.secret, link.job_id, m.node, m.nonce), attempt=link.attempt,
                      hold=True, spare=number))
    conn.close_when_sent()
    link.events.trace(f"node {m.node} ({addr}) came back after its place was taken: it joins as spare {number}")


def joins_next(link: ChiefLink, node: int, spare: int | None) -> bool:
    """The spare `spare` was sent to node `node`'s place as that node was lost, and joins while the node's attempt
    stops (attempt_driver.replace_now): it is admitted now, for the next attempt, held until the restart. The
    lost node still counts in the attempt that stops (its place holds it until ChiefLink.restart)."""
    return spare is not None and link.spares.coming.get(node) == spare and node in link.nodes \
        and node in link.finished


def lost_early(link: ChiefLink, node: int, why: str) -> None:
    """A spare that joined in node `node`'s place for the next attempt was lost before it began: the place is
    empty again (the restart waits for it, and another spare may go)."""
    spare = link.joining_next.pop(node)
    del link.nodes[node]
    link.listen()
    link.events.spare_lost(spare, link.addr_of(node), f"{why} (it had joined in node {node}'s place for the next "
                                                      "attempt)")


def dismiss(link: ChiefLink, node: int, why: str, lost: bool = True) -> bool:
    """Send a live worker node away (replaced by a spare): it gets the job's end with `why` as its verdict.
    lost: it counts as lost here (a straggler: the next attempt gives its place to a spare); else its place
    is free at once and nothing failed (the preflight's, no rank started: a spare goes there now). False:
    not joined."""
    conn = link.nodes.get(node)
    if conn is None or conn.closed or node in link.finished:
        return False
    what = f"node {node} ({link.addr_of(node)}) was replaced: {why}"
    conn.send(End(failure=Failure(what, exit_codes.FAILED, at=time.time(), kind=FailureKind.NODE_LOST)))
    conn.close_when_sent()
    if lost:
        link.lost(node, why)
        return True
    del link.nodes[node]  # missing: its place is waited for (its connection's close is no loss)
    link.questions.node_gone(node)
    link.listen()
    return True
