"""Which rank is a straggler: the one whose work stays slower than the other ranks' (pure: figures in, findings out).

In a synchronous job every rank's step takes as long as the slowest one's (the others wait for it in
the collective), so step times name nobody. What a rank wraps in ``detlaunch.section(name)`` is its
work without the wait: the chief compares, for each section, every rank's time per call with the
median of the *other* ranks' over a window (so two ranks are enough), and names a rank whose speed
(their median over its time) stays under `threshold` (0.7, as NVIDIA's straggler detection) for
`windows` windows in a row. A window closes once every rank has made a new call since the last one,
so a job with long steps is judged per step, and one with short steps on the average of many.
Sections that hold under SHARE of the job's section time in a window are not judged (a tiny
section's jitter is not a slow machine). A rank within 1/threshold - 1 of the others (about 15%)
is never named, whatever its noise (tests/observe/test_stragglers.py, property-tested).

Without sections, the CPU time each node already samples (observe/sampler.py) names a suspect: the
rank that stays busy while the others' CPU is low (they wait for it). That is a guess, said with
a confidence word: "likely" when the others are under half as busy and there are 3 ranks or more,
"possible" otherwise. A whole node slowed by a CPU quota is not seen this way (its ranks are not
busy either); sections see it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from typing import Any

RankKey = tuple[int, int]  # (rank, node)
Figures = Mapping[str, tuple[int, float]]  # a rank's sections: {name: (calls, total seconds)}, cumulative
THRESHOLD = 0.7  # named under this fraction of the other ranks' speed
WINDOWS = 3  # ... for this many windows in a row
SHARE = 0.1  # a section under this share of the largest section's time in a window is not judged
CPU_BUSY = 10.0  # CPU %: a rank under this is not busy enough to be what the others wait for
CPU_WINDOWS = 6  # CPU-based: samples in a row (the nodes sample every 2 s, the chief asks every 1 s)


@dataclasses.dataclass(frozen=True)
class Finding:
    """A rank named a straggler. speed: its speed relative to the other ranks' median (0.5: twice as slow).
    basis: "sections" or "cpu"; section: the section it was slow in; confidence: "certain" from sections,
    else "likely" or "possible"; cpu: (its CPU %, the others' median) for the CPU basis."""

    rank: int
    node: int
    basis: str
    speed: float
    windows: int
    section: str | None = None
    confidence: str = "certain"
    cpu: tuple[float, float] | None = None

    def describe(self) -> str:
        """The console line (after "detlaunch: ")."""
        who = f"rank {self.rank} (node {self.node})"
        if self.basis == "sections":
            return (f"straggler: {who} is slow: its section {self.section!r} takes {1 / self.speed:.1f}x as long as "
                    f"the other ranks' (speed {self.speed:.2f} of theirs, {self.windows} windows in a row)")
        mine, others = self.cpu or (0.0, 0.0)
        return (f"straggler suspect ({self.confidence}, from CPU time: no detlaunch.section in the script): {who} "
                f"is busy ({mine:.0f}% CPU) while the other ranks wait ({others:.0f}%)")

    def mark(self) -> str:
        """A few words for a rank's row in `detlaunch status`, the hang report and `detlaunch stacks`."""
        if self.basis == "sections":
            return f"{self.speed:.2f}x ({self.section})"
        return f"cpu, {self.confidence}"

    def details(self) -> dict[str, object]:
        """The `straggler` event's details (docs/EVENTS.md)."""
        return {"basis": self.basis, "speed": round(self.speed, 4), "windows": self.windows,
                "section": self.section, "confidence": self.confidence, "mark": self.mark()}


class StragglerDetector:
    """The chief's judge for one attempt: `update` with every rank's cumulative figures as they are asked."""

    def __init__(self, threshold: float = THRESHOLD, windows: int = WINDOWS) -> None:
        self.threshold, self.windows = threshold, windows
        self.base: dict[RankKey, Figures] = {}  # each rank's figures when the current window began
        self.slow: dict[RankKey, list[tuple[float, str]]] = {}  # each rank's slow windows in a row: (speed, section)
        self.busy: dict[RankKey, int] = {}  # CPU basis: samples in a row it was the busy one
        self.named: dict[RankKey, Finding] = {}
        self.sections_seen = False

    def update(self, figures: Mapping[RankKey, Figures], cpu: Mapping[RankKey, float | None]) -> list[Finding]:
        """The ranks named by this reading (each rank once); figures: of the running ranks."""
        if any(figures.values()):
            self.sections_seen = True
            return self._sections({k: v for k, v in figures.items() if v})
        return [] if self.sections_seen else self._cpu(cpu)

    # -- sections -------------------------------------------------------------------------------
    def _sections(self, figures: Mapping[RankKey, Figures]) -> list[Finding]:
        for key in [k for k in self.base if k not in figures]:  # ended, or its node is gone
            del self.base[key]
        for key in figures:
            self.base.setdefault(key, {})  # a new rank: its first window counts from its first call
        judged = {k: _delta(self.base[k], figures[k]) for k in self.base}
        if len(judged) < 2 or not all(any(c for c, _ in d.values()) for d in judged.values()):
            return []  # a rank has made no new call yet: the window goes on
        self.base = {k: figures[k] for k in self.base}
        return self._judge(judged)

    def _judge(self, deltas: Mapping[RankKey, dict[str, tuple[int, float]]]) -> list[Finding]:
        weight = {}
        for name in {n for d in deltas.values() for n in d}:
            totals = [d[name][1] for d in deltas.values() if d.get(name, (0, 0.0))[0]]
            if len(totals) >= 2:
                weight[name] = statistics.median(totals)
        if not weight:
            return []
        heaviest = max(weight.values())
        judged = [n for n, w in weight.items() if w > 0 and w >= SHARE * heaviest]
        found = []
        for key, delta in deltas.items():
            scores = []
            for name in judged:
                calls, total = delta.get(name, (0, 0.0))
                others = [d[name][1] / d[name][0] for k, d in deltas.items() if k != key and d.get(name, (0, 0.0))[0]]
                if calls and others and total > 0:
                    scores.append((statistics.median(others) / (total / calls), name))
            if not scores:
                continue  # not judged in this window: its run of slow windows neither grows nor ends
            speed, name = min(scores)
            run = self.slow.setdefault(key, [])
            if speed >= self.threshold:
                run.clear()
                continue
            run.append((speed, name))
            if len(run) >= self.windows and key not in self.named:
                last = run[-self.windows:]
                section = statistics.mode(n for _, n in last)
                finding = Finding(key[0], key[1], "sections", statistics.median(s for s, _ in last), len(run), section)
                self.named[key] = finding
                found.append(finding)
        return found

    # -- CPU time, without sections -------------------------------------------------------------
    def _cpu(self, cpu: Mapping[RankKey, float | None]) -> list[Finding]:
        known = {k: v for k, v in cpu.items() if v is not None}
        if len(known) < 2 or len(known) < len(cpu):
            return []
        found = []
        for key, mine in known.items():
            others = statistics.median(v for k, v in known.items() if k != key)
            if mine < CPU_BUSY or others / mine >= self.threshold:
                self.busy[key] = 0
                continue
            self.busy[key] = self.busy.get(key, 0) + 1
            if self.busy[key] >= CPU_WINDOWS and key not in self.named:
                sure = "likely" if others / mine < 0.5 and len(known) >= 3 else "possible"
                finding = Finding(key[0], key[1], "cpu", others / mine, self.busy[key], None, sure, (mine, others))
                self.named[key] = finding
                found.append(finding)
        return found


def _delta(before: Figures, now: Figures) -> dict[str, tuple[int, float]]:
    """What a rank did since `before`: {section: (calls, seconds)} (a section new since then counts whole)."""
    out = {}
    for name, (calls, total) in now.items():
        was_calls, was_total = before.get(name, (0, 0.0))
        if calls > was_calls:
            out[name] = (calls - was_calls, total - was_total)
    return out


def marks(stragglers: Mapping[Any, Any]) -> dict[int, str]:
    """{rank: mark} from the chief's answer's "stragglers" ({"3": "0.50x (step)"}); malformed entries skipped."""
    out = {}
    for rank, mark in stragglers.items():
        try:
            out[int(rank)] = str(mark)
        except (TypeError, ValueError):
            continue
    return out
