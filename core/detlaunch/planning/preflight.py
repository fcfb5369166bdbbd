"""The preflight's pure parts: what a check is, how nodes are paired, and who is judged slow or broken.

Before any rank starts (``--preflight``), every node runs checks in a child process of its detlaunch
(node/preflight.py asks, node/preflight_child.py runs them: the launcher never imports torch). A check
is a plugin's (``detlaunch_preflight_checks``, docs/HOOKS.md); the built-in compute and network checks
(node/preflight_checks.py) come through the same hook. A node check runs on every node alone; a pair
check runs in a group of two nodes (three for the odd one out) that measure together.

Pairing follows DLRover's pre-check: round 1 pairs neighbours; when a group was slow or failed, round 2
pairs the slowest node with the fastest, so that one bad node (slow in both of its groups) is told
apart from its partner (fine with its new one), and a bad link (slow only in one group) from a bad node.
Everything here is pure and fast: the unit tests call it with made-up figures.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

ONCE, ALWAYS = "once", "always"  # --preflight: before the first attempt whose ranks start, or before each
STOP, WARN = "stop", "warn"  # --preflight-action, when no spare can take the node's place
DEFAULT_THRESHOLD = 0.7
BUILT_IN_NAMES = ("compute", "network", "doctor", "preflight", "plugins")  # the figures core itself names


@dataclasses.dataclass(frozen=True)
class Peer:
    """What a pair check gets: its group, set up by detlaunch (a torch.distributed group on `backend`
    whose store the group's first node serves at `master_addr:master_port`)."""

    rank: int  # in the group: 0 serves the store
    size: int  # 2 (3 for the odd node out)
    master_addr: str
    master_port: int
    backend: str  # the job's: gloo here, nccl on GPUs
    nodes: tuple[int, ...]  # the group's node ranks, in group-rank order
    timeout: float  # seconds the group may take to form


@dataclasses.dataclass(frozen=True)
class Figure:
    """What one check found on one node: ok, and a number to compare with the other nodes' (higher is better)."""

    ok: bool
    value: float | None = None
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class PreflightCheck:
    """One check of the preflight, as a plugin returns it from ``detlaunch_preflight_checks``.

    run: called in the check's child process (torch may be imported there), with the node's group for a
    `pairwise` check, else None; it returns a Figure (an exception is a failed figure naming it).
    unit: of Figure.value; compare: values are judged against the median of every node's (False: only ok counts).
    """

    name: str
    run: Callable[[Peer | None], Figure]
    unit: str = ""
    pairwise: bool = False
    compare: bool = True


def doctor_job_config(config: Any) -> Any:
    """``detlaunch doctor --job``: the job's config, run as a job whose every node runs the preflight (always
    stopping on a named node, no spare replacing it) and then ends, no rank started (node/preflight.py)."""
    import sys

    from detlaunch.errors import ConfigError

    if not config.layer:
        raise ConfigError("detlaunch doctor --job runs the preflight as a job of a layer would: add --layer NAME "
                          "and the job's options (its hosts, --nnodes, --node-rank...)")
    options = {**config.options, "preflight": config.options.get("preflight") or ONCE, "preflight_action": STOP,
               "no_warm_ranks": True, "spares": 0}
    return dataclasses.replace(config, options=options, command=(sys.executable, "-c", ""))


# -- pairing -----------------------------------------------------------------------------------------
Group = tuple[int, ...]


def groups_of(nodes: Sequence[int]) -> list[Group]:
    """Neighbours in twos, in the given order; an odd one out joins the last pair (a group of three)."""
    nodes = list(nodes)
    if len(nodes) < 2:
        return []
    groups = [tuple(nodes[i:i + 2]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2:
        groups[-1] = (*groups[-1], nodes[-1])
    return groups


def first_round(nodes: Sequence[int]) -> list[Group]:
    return groups_of(sorted(nodes))


def second_round(first: Sequence[Group], speed: Mapping[Group, float | None]) -> list[Group]:
    """The slowest node with the fastest, the next slowest with the next fastest... A node's speed is its
    first-round group's (a failed group: 0). Ties keep node order. Empty when re-pairing cannot tell more
    (fewer than two groups in the first round)."""
    if len(first) < 2:
        return []
    of_node = {n: speed.get(g) or 0.0 for g in first for n in g}
    ranked = sorted(of_node, key=lambda n: (of_node[n], n))
    order: list[int] = []
    lo, hi = 0, len(ranked) - 1
    while lo <= hi:  # slowest, fastest, next slowest, next fastest...
        order.append(ranked[lo])
        if lo != hi:
            order.append(ranked[hi])
        lo, hi = lo + 1, hi - 1
    return groups_of(order)


def needs_second_round(first: Sequence[Group], speed: Mapping[Group, float | None], threshold: float) -> bool:
    """Re-pair only when the first round found a slow or failed group, and re-pairing can tell who."""
    return len(first) >= 2 and any(slow_groups(speed, threshold))


def slow_groups(speed: Mapping[Group, float | None], threshold: float) -> set[Group]:
    """Groups that failed (None) or measured under `threshold` x the median of all groups."""
    ok = [v for v in speed.values() if v is not None]
    median = statistics.median(ok) if ok else 0.0
    return {g for g, v in speed.items() if v is None or v < threshold * median}


# -- judging -----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Result:
    """One check's figure on one node (`group`: a pair check's group, in its round)."""

    node: int
    check: str
    figure: Figure
    unit: str = ""
    compare: bool = True
    group: Group = ()

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "check": self.check, "ok": self.figure.ok, "value": self.figure.value,
                "detail": self.figure.detail, "unit": self.unit, "compare": self.compare, "group": list(self.group)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Result:
        value = data.get("value")
        return cls(int(data["node"]), str(data["check"]),
                   Figure(bool(data.get("ok")), None if value is None else float(value), str(data.get("detail") or "")),
                   str(data.get("unit") or ""), bool(data.get("compare", True)),
                   tuple(int(n) for n in data.get("group") or ()))


@dataclasses.dataclass(frozen=True)
class Finding:
    """A node the preflight names: why, in figures."""

    node: int
    host: str
    reasons: tuple[str, ...]  # "compute 2.1 GFLOP/s (median 8.4, under 0.7x)"
    figures: Mapping[str, float | None]  # check name -> this node's figure (None: failed)

    def describe(self) -> str:
        return f"node {self.node} ({self.host}) " + "; ".join(self.reasons)


def _number(v: float | None, unit: str) -> str:
    return "failed" if v is None else f"{v:.3g} {unit}".rstrip()


def judge(results: Sequence[Result], threshold: float, hosts: Mapping[int, str] | None = None) -> list[Finding]:
    """Every node that failed a check, or stays under `threshold` x the median of a compared check.

    A node check: its best figure over the rounds against the median of every node's best. A pair
    check: a node is named when every group it was in failed or was slow (its partner, fine with
    another node in round 2, is not); with one round only, both nodes of a slow group are named.
    """
    hosts = hosts or {}
    reasons: dict[int, list[str]] = {}
    figures: dict[int, dict[str, float | None]] = {}

    def name(node: int, check: str, value: float | None, why: str) -> None:
        reasons.setdefault(node, []).append(why)
        figures.setdefault(node, {})[check] = value

    for check in dict.fromkeys(r.check for r in results):
        mine = [r for r in results if r.check == check]
        unit = mine[0].unit
        if any(r.group for r in mine):
            _judge_pairs(mine, threshold, unit, name)
            continue
        best: dict[int, Result] = {}
        for r in mine:
            old = best.get(r.node)
            if old is None or _better(r, old):
                best[r.node] = r
        ok = [r.figure.value for r in best.values() if r.figure.ok and r.figure.value is not None]
        median = statistics.median(ok) if ok else None
        for node, r in sorted(best.items()):
            if not r.figure.ok:
                name(node, check, None, f"{check} failed" + (f": {r.figure.detail}" if r.figure.detail else ""))
            elif (r.compare and median and r.figure.value is not None and len(ok) > 1
                  and r.figure.value < threshold * median):
                name(node, check, r.figure.value, f"{check} {_number(r.figure.value, unit)} (median of the nodes "
                     f"{_number(median, unit)}, under {threshold:g}x)")
    return [Finding(n, hosts.get(n, "?"), tuple(reasons[n]), figures[n]) for n in sorted(reasons)]


def _better(new: Result, old: Result) -> bool:
    if new.figure.ok != old.figure.ok:
        return new.figure.ok
    return (new.figure.value or 0.0) > (old.figure.value or 0.0)


def group_speeds(results: Sequence[Result]) -> dict[Group, float | None]:
    """A pair check's figure per group (every node of a group reports the group's). None: every node of the
    group failed (it did not form, or broke: whose fault, re-pairing tells). Left out: a group where some nodes
    failed and the others did not (those failures are the nodes' own, `own_failures`: a node whose torch cannot
    start a group tells its partners so, and they measure nothing), and one with no value."""
    grouped: dict[Group, list[Result]] = {}
    for r in results:
        if r.group:
            grouped.setdefault(r.group, []).append(r)
    speed: dict[Group, float | None] = {}
    for group, mine in grouped.items():
        failed = sum(1 for r in mine if not r.figure.ok)
        values = [r.figure.value for r in mine if r.figure.ok and r.figure.value is not None]
        if failed == len(mine):
            speed[group] = None
        elif not failed and values:
            speed[group] = values[0]
    return speed


def own_failures(results: Sequence[Result]) -> list[Result]:
    """A pair check's failed figures in groups whose other nodes did not fail: each the failed node's own."""
    ok_in = {r.group for r in results if r.group and r.figure.ok}
    return [r for r in results if r.group in ok_in and not r.figure.ok]


def _judge_pairs(results: Sequence[Result], threshold: float, unit: str,
                 name: Callable[[int, str, float | None, str], None]) -> None:
    speed = group_speeds(results)
    check = results[0].check
    own = own_failures(results)
    for r in own:
        name(r.node, check, None, f"{check} failed" + (f": {r.figure.detail}" if r.figure.detail else ""))
    slow = slow_groups(speed, threshold) if len(speed) > 1 else {g for g, v in speed.items() if v is None}
    ok = [v for v in speed.values() if v is not None]
    median = statistics.median(ok) if ok else 0.0
    nodes = sorted({n for g in speed for n in g} - {r.node for r in own})
    for node in nodes:
        mine = [g for g in speed if node in g]
        if not mine or not all(g in slow for g in mine):
            continue
        said = ", ".join(f"{_number(speed[g], unit)} with node(s) {'+'.join(str(n) for n in g if n != node)}"
                         for g in mine)
        best = max((speed[g] or 0.0 for g in mine), default=0.0)
        name(node, check, best or None, f"{check} {said} (median of the groups {_number(median, unit)}, "
             f"under {threshold:g}x)" if ok else f"{check} {said}")


def round_args(groups: Sequence[Group], addrs: Mapping[int, str], base_port: int) -> dict[str, Any]:
    """What each node is told for one round of pair checks: its group, and where the group's store listens
    (the group's first node, a port of its own per group: several groups may share a machine)."""
    return {"groups": [{"nodes": list(g), "addr": addrs.get(g[0], ""), "port": base_port + i}
                       for i, g in enumerate(groups)]}


def table(results: Sequence[Result], findings: Sequence[Finding], hosts: Mapping[int, str]) -> list[str]:
    """One line per node: its figures, and OK or what is wrong (for the console and ``doctor --job``)."""
    named = {f.node: f for f in findings}
    lines = []
    for node in sorted({r.node for r in results} | set(named)):
        mine: dict[str, list[str]] = {}
        for r in results:
            if r.node == node:
                text = _number(r.figure.value if r.figure.ok else None, r.unit) if r.figure.value is not None \
                    or not r.figure.ok else "ok"
                mine.setdefault(r.check, []).append(text)
        figures = ", ".join(f"{c} {' / '.join(v)}" for c, v in mine.items())
        verdict = "ok" if node not in named else "NAMED: " + "; ".join(named[node].reasons)
        lines.append(f"node {node} ({hosts.get(node, '?')}): {figures or 'no figures'} -- {verdict}")
    return lines


PreflightFigure: TypeAlias = Figure  # their names in the public API (detlaunch.PreflightFigure...)
PreflightPeer: TypeAlias = Peer
