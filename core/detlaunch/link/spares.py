"""The chief's spare nodes: joined, kept alive, and each sent to take a lost node's place.

A spare is a detlaunch like any other, numbered after the job's nodes (node ranks num_nodes and up),
that joins the chief through the same authenticated admission and runs no rank. It waits, its
connection heartbeated like a node's; when a node is lost and the next attempt needs its place, the
chief sends the lowest-numbered spare "promote": the spare leaves and joins again as that node, with
the lost node's node rank (so every global rank keeps its number) and its own address, through the
path a lost node's new detlaunch takes (node/spare.py is the spare's side). A spare that goes silent
or closes is simply gone: it held nothing.
"""

from __future__ import annotations

import time
from typing import Protocol

from detlaunch.link.messages import End, Promote, encode
from detlaunch.link.wire import HEARTBEAT, PeerConnection
from detlaunch.outcome import Failure

# A spare sent to a place plans that node's part and starts its supervisor before it dials again: it has this
# many times the heartbeat window (HEARTBEAT_MISSES x --heartbeat) to join there before it counts as lost.
JOIN_WINDOW = 6


class SpareEvents(Protocol):
    def trace(self, message: str) -> None: ...
    def spare_joined(self, node: int, addr: str) -> None: ...
    def spare_lost(self, node: int, addr: str, why: str) -> None: ...


class SparePool:
    def __init__(self, first: int, count: int, events: SpareEvents) -> None:
        self.ids = set(range(first, first + count))  # the spares' node numbers
        self.next = first + count  # the number of the next lost node that comes back as a spare (enlist)
        self.events = events
        self.waiting: dict[int, PeerConnection] = {}  # joined, not promoted, still connected
        self.addrs: dict[int, str] = {}
        self.promoted: dict[int, int] = {}  # spare number -> the place it was sent to (numbers never reused)
        self.coming: dict[int, int] = {}  # place -> the spare sent there, until it joins as that node
        self.sent_at: dict[int, float] = {}  # place -> when its spare was sent (monotonic)

    def admits(self, node: int) -> bool:
        """`node` is a spare's number not in use (a promoted spare's number is never reused)."""
        return node in self.ids and node not in self.waiting and node not in self.promoted

    def enlist(self) -> int:
        """A lost node's new detlaunch came back after its place was taken: the spare number it joins again as."""
        number = self.next
        self.next += 1
        self.ids.add(number)
        return number

    @property
    def missing(self) -> set[int]:
        return self.ids - set(self.waiting) - set(self.promoted)

    def joined(self, node: int, conn: PeerConnection, addr: str) -> None:
        self.waiting[node] = conn
        self.addrs[node] = addr
        self.events.spare_joined(node, addr)

    def owns(self, conn: PeerConnection) -> bool:
        return conn.node is not None and self.waiting.get(conn.node) is conn

    def closed(self, conn: PeerConnection, why: str) -> None:
        assert conn.node is not None
        del self.waiting[conn.node]
        self.events.spare_lost(conn.node, self.addrs.get(conn.node, "address unknown"), why)

    def tick(self, silence: float) -> None:
        """Heartbeats out; a spare silent for `silence` seconds is dropped (it holds nothing), and so is one sent
        to a place that has not joined there within JOIN_WINDOW x `silence` (it died on the way): the place is
        free for another spare."""
        now = time.monotonic()
        for place, at in list(self.sent_at.items()):
            if now - at > JOIN_WINDOW * silence:
                spare = self.coming.get(place)
                self.arrived(place)
                if spare is not None:
                    self.events.spare_lost(spare, self.addrs.get(spare, "address unknown"), f"sent to node {place}'s "
                                           f"place, it did not join there within {JOIN_WINDOW * silence:g} s")
        for node, conn in list(self.waiting.items()):
            if now - conn.last_heard > silence:
                conn.close()  # on_close is not called for a close of ours
                if self.waiting.get(node) is conn:
                    del self.waiting[node]
                    self.events.spare_lost(node, self.addrs.get(node, "address unknown"), f"no heartbeat for "
                                                                                          f"{silence:g} s")
            else:
                conn.send_encoded(HEARTBEAT)

    def promote(self, place: int, excluded: set[str]) -> tuple[int, str] | None:
        """Send the lowest-numbered waiting spare (on no host in `excluded`) to take node `place`'s place:
        (its number, its address)."""
        for node in sorted(self.waiting):
            if self.addrs.get(node) in excluded or self.waiting[node].closed:
                continue
            conn = self.waiting.pop(node)
            conn.send(Promote(place=place))
            conn.close_when_sent()
            self.promoted[node] = place
            self.coming[place] = node
            self.sent_at[place] = time.monotonic()
            return node, self.addrs.get(node, "address unknown")
        return None

    def arrived(self, place: int) -> None:
        """Node `place` joined (a promoted spare, or the lost node's own detlaunch, back first)."""
        self.coming.pop(place, None)
        self.sent_at.pop(place, None)

    def end(self, failure: Failure | None) -> None:
        """The job is over: every waiting spare is told, and let go."""
        encoded = encode(End(failure=failure))
        for conn in self.waiting.values():
            conn.send_encoded(encoded)
            conn.close_when_sent()

    def close(self) -> None:
        for conn in self.waiting.values():
            conn.close()
        self.waiting.clear()
