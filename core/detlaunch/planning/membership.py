"""Which nodes run an attempt, and the cluster each of them plans that attempt from. Pure.

A node's place keeps one number for the whole job: its node rank at the start (a spare that takes a
lost node's place takes that number, planning/spares.py). The job link knows nodes by it. An attempt's
members are the places that run it, in order: the chief (0) first, then the others by number. Their
node ranks are their positions in that list, so when places are dropped, node ranks and global ranks
are renumbered contiguously (every node's slots kept), as torchrun's elastic agent numbers a smaller
world; with every place present, each node rank is its place's number, as before.

`--nnodes MIN:MAX`: when a lost node's place has no spare to fill it, the next attempt runs on the
places left, if there are at least MIN (`shrink`); else it waits for the node to join again
(--start-timeout). A job that shrank grows back at a later restart, place by place, when spares wait
then (`grow`): a restart that happens anyway, never one of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from detlaunch.planning.cluster import ClusterInfo


def members(places: Collection[int]) -> tuple[int, ...]:
    """An attempt's members in node-rank order: the chief, then the other places by number."""
    return (0, *sorted(p for p in places if p != 0))


def cluster_of(base: ClusterInfo, ids: tuple[int, ...], own: int,
               addrs: Mapping[int, str] | None = None) -> ClusterInfo:
    """The cluster `own` (a place's number) plans an attempt of `ids` from. `base` is the job's cluster at
    the start, one entry per place (node rank = place number); `addrs`: where places are now (the chief's
    link knows), else the base's."""
    addrs = addrs or {}
    return dataclasses.replace(base, node_addrs=tuple(addrs.get(p) or base.node_addrs[p] for p in ids),
                               slots=tuple(base.slots[p] for p in ids), node_rank=ids.index(own))


def shrink(missing: Collection[int], coming: Collection[int], present: Collection[int],
           min_nodes: int | None) -> set[int]:
    """The places to drop for the next attempt: those missing with no spare coming, when the places left
    (the chief, the nodes `present`, those a spare is `coming` to) are at least `min_nodes`; else none
    (the attempt waits for them). `min_nodes` None: a job of a fixed size never shrinks."""
    unfilled = set(missing) - set(coming)
    left = {0} | set(present) | (set(coming) & set(missing))
    if min_nodes is None or not unfilled or len(left) < min_nodes:
        return set()
    return unfilled


def grow(dropped: Collection[int], spares_waiting: int) -> list[int]:
    """The dropped places a restart takes back (lowest first), one for each spare that waits."""
    return sorted(dropped)[:max(spares_waiting, 0)]


def describe(ids: tuple[int, ...], slots: tuple[int, ...], of: int) -> str:
    """'2 nodes of 3, 4 ranks': an attempt's size (`slots`: per place, by number; `of`: the places in all)."""
    return f"{len(ids)} node(s) of {of}, {sum(slots[p] for p in ids)} rank(s)"
