"""The chief's membership, told to every node and spare as it changes (node/succession.py reads it): whole to a
connection that has none yet, else only what changed since the last one (each had it: every share goes to
every connection). A node or spare that joins after a share gets the last one at once (welcome): the next
share may be a heartbeat away, and a chief lost before it would leave that one knowing no successor. A whole
membership of 1024 nodes is ~20 KB; a lost node's change, under a kilobyte."""

from __future__ import annotations

from collections.abc import Iterable

from detlaunch.link.membership import Membership, change
from detlaunch.link.messages import Members, MembersChange, encode
from detlaunch.link.wire import PeerConnection


class MembershipSharing:
    """The last membership shared and the connections that have it."""

    def __init__(self) -> None:
        self.shared: Membership | None = None
        self.told: set[PeerConnection] = set()

    def share(self, m: Membership, connections: Iterable[PeerConnection]) -> None:
        """`m` to every open connection of `connections`, each message encoded once."""
        conns = [c for c in connections if not c.closed]
        delta = change(self.shared, m) if self.shared is not None else None
        whole = encode(Members(m=m)) if delta is None or any(c not in self.told for c in conns) else b""
        changed = encode(MembersChange(c=delta)) if delta is not None else whole
        for conn in conns:
            conn.send_encoded(changed if conn in self.told else whole)
        self.shared, self.told = m, set(conns)

    def welcome(self, conn: PeerConnection) -> None:
        """A connection that joined: the last membership shared, now, if there is one (none before the job's
        first start: every node is there before the first share)."""
        if self.shared is not None and conn not in self.told:
            conn.send_encoded(encode(Members(m=self.shared)))
            self.told.add(conn)
