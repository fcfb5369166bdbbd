"""Which lanes a job's page shows: a lane per rank, grouped by node; past `FOLD_OVER` ranks, each node's ranks
folded into the node's lane, with the odd ones out shown. Pure.

A 1024-rank job whose ranks all ended alike is 128 node lanes, not 1024 rank lanes: what people look for is
the rank that did not end like its neighbours (the root cause, a rank that failed or was killed, a mark on it
such as a straggler, one that started or ended well apart from its node's others). Those keep a lane of
their own under their node's; the rest are one click away (folded, not dropped).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter

from detlaunch.observe.story_model import Span, Story

FOLD_OVER = 64  # ranks: more than this and each node's ranks are folded
APART = 0.05  # of the job's length (at least APART_S): a rank that starts or ends this far from its node's median
APART_S = 1.0


@dataclasses.dataclass(frozen=True)
class NodeLanes:
    """One node: its ranks shown with a lane each, and those folded (shown on asking)."""

    node: int
    shown: tuple[int, ...]
    folded: tuple[int, ...]
    why: dict[int, str]  # a shown rank of a folded node -> why it is an odd one out


def lanes(story: Story, fold_over: int = FOLD_OVER) -> list[NodeLanes]:
    """The node groups of the page, in node order; nodes without ranks (lost before any) included."""
    by_node: dict[int, list[int]] = {n: [] for n in story.nodes}
    for rank, spans in story.spans.items():
        by_node.setdefault(spans[-1].node, []).append(rank)
    fold = len(story.spans) > fold_over
    marked = {m.rank: m.kind for m in story.marks if m.rank is not None}
    out = []
    for node in sorted(by_node):
        ranks = sorted(by_node[node])
        if not fold:
            out.append(NodeLanes(node, tuple(ranks), (), {}))
            continue
        why = odd_ones_out(story, ranks, marked)
        out.append(NodeLanes(node, tuple(r for r in ranks if r in why), tuple(r for r in ranks if r not in why), why))
    return out


def signature(spans: list[Span]) -> tuple[tuple[int, str], ...]:
    """How a rank went through the job: each attempt's state in status's words."""
    return tuple((s.attempt, s.words) for s in spans)


def odd_ones_out(story: Story, ranks: list[int], marked: dict[int, str]) -> dict[int, str]:
    """The ranks of one node that did not go through the job as most of its ranks did, and why (`marked`: the
    ranks with a mark on their lane, and its kind)."""
    usual = Counter(signature(story.spans[r]) for r in ranks).most_common(1)
    common = usual[0][0] if usual else ()
    apart = max(APART_S, APART * (story.end - story.start))
    medians: dict[tuple[int, str], float] = {}
    for attempt in {s.attempt for r in ranks for s in story.spans[r]}:
        for edge in ("start", "end"):
            times = [t for r in ranks for s in story.spans[r] if s.attempt == attempt
                     if (t := _edge(s, edge)) is not None]
            if times:
                medians[(attempt, edge)] = statistics.median(times)
    why: dict[int, str] = {}
    for r in ranks:
        spans = story.spans[r]
        if any(s.cause for s in spans):
            why[r] = "its failure ended an attempt"
        elif r in marked:
            why[r] = marked[r]
        elif signature(spans) != common:
            why[r] = "it ended unlike its node's other ranks"
        else:
            for s in spans:
                for edge in ("start", "end"):
                    t, m = _edge(s, edge), medians.get((s.attempt, edge))
                    if t is not None and m is not None and abs(t - m) > apart:
                        why[r] = f"its {edge} in attempt {s.attempt} is {t - m:+.1f} s from its node's median"
                if r in why:
                    break
    return why


def _edge(span: Span, edge: str) -> float | None:
    return span.start if edge == "start" else span.state.ended_at
