"""The job's membership, as the chief shares it with every node: who is where, and what a successor must know.

A node started with torchrun-style flags knows only the chief's address; the chief learns each node's
from its join. So that the job outlives its chief (node/succession.py), the chief sends every node and
every waiting spare a `Membership` whenever it changes (rate-limited to one a heartbeat): each node
rank's address, which nodes are live, the waiting spares and those already used, and the restart
state (the attempt, every attempt's end: both restart counts and the crash-loop breaker read them from
the history alone, so carrying the history carries them exactly; the excluded hosts, and each loss of the
others). Whole to a node that has none yet; to one that has the last, only what changed since
(`MembershipChange`).

From it, every surviving node computes the same thing without asking anyone (pure functions here):
the successor (the lowest live node rank but the chief's), the cluster as it is after the succession
(the successor becomes node rank 0, so that the chief's role and global rank 0 stay on one node and
MASTER_ADDR = DET_CHIEF_IP = the chief's address, as every layer assumes; the place it leaves is the
one a spare fills, or its node must join again), and whether a side of a partition may go on
(`has_majority`: more than half of the last attempt's nodes).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

from detlaunch.outcome import AttemptEnd, RestartClass
from detlaunch.planning.cluster import ClusterInfo


def _end_json(end: AttemptEnd) -> dict[str, Any]:
    out = dataclasses.asdict(end)
    out["restart_class"] = end.restart_class.value if end.restart_class else None
    return out


def _end_from_json(raw: Any) -> AttemptEnd:
    if not isinstance(raw, dict):
        raise TypeError("an attempt's end is an object")
    names = {f.name for f in dataclasses.fields(AttemptEnd)}
    values = {k: v for k, v in raw.items() if k in names}
    cls = values.get("restart_class")
    values["restart_class"] = RestartClass(cls) if cls else None
    return AttemptEnd(**values)


@dataclasses.dataclass(frozen=True)
class Membership:
    """nodes[i]: node rank i's address ("" unknown; a spare's once it is sent there, before it joins); live: the
    node ranks joined and connected (the chief, 0, included); spares: the waiting spares (number, address);
    used_spares: spare numbers sent to a place (never admitted as spares again); attempt: the attempt that
    runs, or comes next (running: one runs); history: every attempt's end so far; excluded: the hosts kept
    out; lost: the other hosts of the exclusion file, once per loss (a host lost once may serve again, lost
    twice it is out)."""

    nodes: tuple[str, ...]
    live: tuple[int, ...]
    spares: tuple[tuple[int, str], ...] = ()
    used_spares: tuple[int, ...] = ()
    attempt: int = 1
    running: bool = True
    history: tuple[AttemptEnd, ...] = ()
    excluded: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "live": list(self.live), "spares": [list(s) for s in self.spares],
                "used_spares": list(self.used_spares), "attempt": self.attempt, "running": self.running,
                "history": [_end_json(e) for e in self.history], "excluded": list(self.excluded),
                "lost": list(self.lost)}

    @classmethod
    def from_json(cls, raw: Any) -> Membership:
        """TypeError/ValueError/KeyError on a malformed one (messages.decode makes it Malformed)."""
        if not isinstance(raw, dict):
            raise TypeError("a membership is an object")
        nodes = tuple(str(a) for a in raw["nodes"])
        live = tuple(sorted(int(n) for n in raw["live"] if 0 <= int(n) < len(nodes)))
        return cls(nodes=nodes, live=live, spares=tuple((int(n), str(a)) for n, a in raw.get("spares") or ()),
                   used_spares=tuple(int(n) for n in raw.get("used_spares") or ()), attempt=int(raw["attempt"]),
                   running=bool(raw.get("running", True)),
                   history=tuple(_end_from_json(e) for e in raw.get("history") or ()),
                   excluded=tuple(str(h) for h in raw.get("excluded") or ()),
                   lost=tuple(str(h) for h in raw.get("lost") or ()))

    def successor(self, gone: frozenset[int] = frozenset({0})) -> int | None:
        """The node rank that takes the chief's role: the lowest live one not in `gone` (None: none is left)."""
        return next((n for n in self.live if n not in gone), None)

    def succeeded_by(self, successor: int) -> Membership:
        """The membership as the successor numbers it: it is node 0, its old place the lost chief's (not live)."""
        nodes = list(self.nodes)
        nodes[0], nodes[successor] = nodes[successor], nodes[0]
        live = sorted({0 if n == successor else n for n in self.live if n != 0})
        return dataclasses.replace(self, nodes=tuple(nodes), live=tuple(live))


@dataclasses.dataclass(frozen=True)
class MembershipChange:
    """A membership told as its change from the last one shared (`change`, `applied`): the places whose address
    moved, the node ranks that became live or stopped being live, and the rest whole (a few entries: the
    spares, the restart state). A whole membership of 1024 nodes is ~20 KB, to every node and spare at each
    change; a lost or joined node is a change of a few dozen bytes. history: the entries after the first
    `history_from` of the last one (the history only grows, but a successor's may be replaced whole)."""

    moved: tuple[tuple[int, str], ...]
    joined: tuple[int, ...]
    left: tuple[int, ...]
    spares: tuple[tuple[int, str], ...]
    used_spares: tuple[int, ...]
    attempt: int
    running: bool
    history_from: int
    history: tuple[AttemptEnd, ...]
    excluded: tuple[str, ...]
    lost: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"moved": [list(m) for m in self.moved], "joined": list(self.joined), "left": list(self.left),
                "spares": [list(s) for s in self.spares], "used_spares": list(self.used_spares),
                "attempt": self.attempt, "running": self.running, "history_from": self.history_from,
                "history": [_end_json(e) for e in self.history], "excluded": list(self.excluded),
                "lost": list(self.lost)}

    @classmethod
    def from_json(cls, raw: Any) -> MembershipChange:
        """TypeError/ValueError/KeyError on a malformed one (messages.decode makes it Malformed)."""
        if not isinstance(raw, dict):
            raise TypeError("a membership change is an object")
        return cls(moved=tuple((int(n), str(a)) for n, a in raw["moved"]),
                   joined=tuple(int(n) for n in raw["joined"]), left=tuple(int(n) for n in raw["left"]),
                   spares=tuple((int(n), str(a)) for n, a in raw["spares"]),
                   used_spares=tuple(int(n) for n in raw["used_spares"]), attempt=int(raw["attempt"]),
                   running=bool(raw["running"]), history_from=int(raw["history_from"]),
                   history=tuple(_end_from_json(e) for e in raw["history"]),
                   excluded=tuple(str(h) for h in raw["excluded"]),
                   lost=tuple(str(h) for h in raw.get("lost") or ()))


def change(old: Membership, new: Membership) -> MembershipChange | None:
    """`new` as a change from `old` (None: a job of another size, told whole)."""
    if len(old.nodes) != len(new.nodes):
        return None
    kept = 0
    while kept < min(len(old.history), len(new.history)) and old.history[kept] == new.history[kept]:
        kept += 1
    was, live = set(old.live), set(new.live)
    return MembershipChange(moved=tuple((n, a) for n, (o, a) in enumerate(zip(old.nodes, new.nodes, strict=True))
                                        if o != a),
                            joined=tuple(sorted(live - was)), left=tuple(sorted(was - live)), spares=new.spares,
                            used_spares=new.used_spares, attempt=new.attempt, running=new.running,
                            history_from=kept, history=new.history[kept:], excluded=new.excluded,
                            lost=new.lost)


def applied(m: Membership, c: MembershipChange) -> Membership:
    """The membership `c` changes `m` into (a node rank out of range is left out, as from_json does). In the
    change's time, not the job's size: every node applies every change (1024 nodes: a few microseconds, not
    a set and a sort of 1024)."""
    nodes = m.nodes
    if c.moved:
        moved = list(nodes)
        for n, addr in c.moved:
            if 0 <= n < len(moved):
                moved[n] = addr
        nodes = tuple(moved)
    live = list(m.live)  # sorted, each once
    for n in c.joined:
        i = bisect.bisect_left(live, n)
        if 0 <= n < len(nodes) and (i == len(live) or live[i] != n):
            live.insert(i, n)
    for n in c.left:
        i = bisect.bisect_left(live, n)
        if i < len(live) and live[i] == n:
            del live[i]
    return Membership(nodes=nodes, live=tuple(live), spares=c.spares, used_spares=c.used_spares,
                      attempt=c.attempt, running=c.running, history=m.history[:c.history_from] + c.history,
                      excluded=c.excluded, lost=c.lost)


def has_majority(joined: int, last_nodes: int) -> bool:
    """A side of the job may go on: more than half of the last attempt's `last_nodes` nodes are on it (its
    successor included). Two sides of a partition can never both have one."""
    return 2 * joined > last_nodes


def cluster_after(cluster: ClusterInfo, membership: Membership, successor: int) -> ClusterInfo:
    """This node's cluster once node `successor` has taken the chief's role: it becomes node rank 0 (with its
    slots), and its old place is the lost chief's (its address, until a spare or its node takes it); every
    other node keeps its rank. Addresses this node learned from the chief fill those it did not know."""
    n = len(membership.nodes)  # the places (a spare's cluster lists the spares after them)
    slots = list(cluster.slots[:n])
    slots[0], slots[successor] = slots[successor], slots[0]
    rank = {successor: 0, 0: successor}.get(cluster.node_rank, cluster.node_rank)
    swapped = list(cluster.node_addrs[:n])
    swapped[0], swapped[successor] = swapped[successor], swapped[0]
    moved = dataclasses.replace(cluster, node_addrs=(*swapped, *cluster.node_addrs[n:]),
                                slots=(*slots, *cluster.slots[n:]), node_rank=rank)
    return with_addresses(moved, membership.succeeded_by(successor))


def with_addresses(cluster: ClusterInfo, membership: Membership) -> ClusterInfo:
    """`cluster` with the places' addresses the membership knows (numbered as the chief that shared it numbers
    them), and its node 0 as the chief."""
    n = len(membership.nodes)
    addrs = [membership.nodes[i] or a for i, a in enumerate(cluster.node_addrs[:n])]
    return dataclasses.replace(cluster, node_addrs=(*addrs, *cluster.node_addrs[n:]),
                               chief_addr=addrs[0] or cluster.chief_addr)
