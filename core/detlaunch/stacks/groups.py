"""Every rank's stack, grouped so that a hundred ranks read as a few lines, with the odd ones out named.

    ranks 0,2-7 (node 0, 1): work.wait <- all_reduce <- step (train.py:88)
    rank 1 (node 0): time.sleep <- load_batch (data.py:41)  [suspect: not in the collective the others wait in]

Pure functions over `stacks` results; no I/O.

The signature of a rank is its main thread's frames (other threads are helpers: data
loaders, watchdogs) and whether it is SIGSTOPped. Frames compare by function, file and
line, except the innermost one, which compares by function and file only: a rank busy in
a Python loop is sampled at any of its lines, and its callers' lines are what say where it is.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from detlaunch.observe.rank_sets import format_ranks
from detlaunch.outcome import script_end_words
from detlaunch.stacks.pyspy import Frame, ProcessStack, StackResult, Unavailable, to_json

RankKey = tuple[int, int]  # (rank, node rank)
LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/")
_STDLIB = re.compile(r"/lib/python\d+\.\d+/")
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_KEYWORDS = {"if", "elif", "while", "for", "return", "yield", "await", "assert", "not", "and", "or", "in", "with"}
COLLECTIVE_MARKERS = ("/torch/distributed/", "/horovod/", "/deepspeed/comm/")


@dataclasses.dataclass(frozen=True)
class Group:
    """Ranks with the same stack signature; `stack` is the first rank's, as the example.
    `via`: {how: its ranks} for the ranks py-spy could not read (ProcessStack.via)."""

    ranks: tuple[RankKey, ...]
    stack: ProcessStack
    suspect: str = ""  # why these ranks are suspects, or ''
    via: tuple[tuple[str, tuple[RankKey, ...]], ...] = ()


@dataclasses.dataclass(frozen=True)
class UnavailableGroup:
    ranks: tuple[RankKey, ...]
    kind: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Suspect:
    rank: int
    node: int
    why: str


@dataclasses.dataclass(frozen=True)
class StackReport:
    groups: tuple[Group, ...]  # largest first
    unavailable: tuple[UnavailableGroup, ...]
    suspects: tuple[Suspect, ...]  # by rank
    flight: tuple[str, ...] = ()  # what torch's Flight Recorder says (flight.py), shown before the stacks


def is_library(file: str) -> bool:
    """A frame of installed code (site-packages, the standard library, frozen modules), not the user's own."""
    return file.startswith("<") or any(m in file for m in LIBRARY_MARKERS) or bool(_STDLIB.search(file))


def short_file(file: str) -> str:
    """torch/distributed/distributed_c10d.py for installed code; the base name for the user's files."""
    for marker in LIBRARY_MARKERS:
        if marker in file:
            return file.rsplit(marker, 1)[1]
    m = _STDLIB.search(file)
    return file[m.end():] if m else os.path.basename(file)


def in_collective(stack: ProcessStack) -> bool:
    main = stack.main
    return bool(main) and any(m in f.file for f in main.frames for m in COLLECTIVE_MARKERS)  # type: ignore[union-attr]


def signature(stack: ProcessStack) -> tuple[object, ...]:
    main = stack.main
    frames = main.frames if main else ()
    head = tuple((f.function, f.file) for f in frames[:1])
    return (stack.stopped, stack.ended, head, tuple((f.function, f.file, f.line) for f in frames[1:]))


def describe_stack(stack: ProcessStack) -> str:
    """The main thread in one line: the call it blocks in, the innermost library frame, the user's own frame.

    ``work.wait <- all_reduce <- step (train.py:88)``, ``time.sleep <- load_batch (data.py:41)``.
    A rank whose script had ended says so: its Python is shutting down (atexit, a library's teardown), and
    with no Python frames left (py-spy sees the main thread's frames gone, and no thread names either).
    """
    main = stack.main
    prefix = "[SIGSTOPped] " if stack.stopped else ""
    ended = script_end_words(stack.ended)
    if not main or not main.frames:
        why = f": {ended}, Python is shutting down" if ended else ""
        return f"{prefix}(no Python frames{why})"
    if ended:
        prefix += f"[{ended}, Python is shutting down] "
    frames = main.frames
    user = next((f for f in frames if not is_library(f.file)), None)
    innermost = frames[0]
    parts = [_callee(innermost)]
    if user is None:
        parts.append(f"{innermost.function} ({short_file(innermost.file)}:{innermost.line})")
    else:
        if innermost is not user:
            parts.append(innermost.function)
        parts.append(f"{user.function} ({short_file(user.file)}:{user.line})")
    return prefix + " <- ".join(p for p in parts if p)


def _callee(frame: Frame) -> str:
    """The function called on the innermost frame's line (time.sleep), when its source line is known."""
    m = _CALL.search(frame.code)
    if not m or m.group(1) in _KEYWORDS:
        return ""
    return m.group(1)


def group_stacks(results: Mapping[RankKey, StackResult], last_progress: Mapping[int, float] | None = None,
                 tolerance: float = 1.0, named: Mapping[RankKey, str] | None = None) -> StackReport:
    """Group ranks by stack signature and name the suspects.

    Suspects: SIGSTOPped ranks; the ranks outside the majority's group (when one group is larger than
    every other); with no majority, ranks outside a collective that other ranks wait in; and, given
    each rank's last progress (wall time), the ranks whose progress stopped first, more than
    `tolerance` seconds before the others'.

    named: the suspects torch's Flight Recorder names ({key: why}, flight.py). When there are any, they
    win over the rules read from the stacks (on GPUs a stack shows the next sync point, not the
    collective): they and the SIGSTOPped ranks are the suspects, and only they are marked.
    """
    if named:
        return _with_named(group_stacks(results), named)
    by_sig: dict[tuple[object, ...], list[RankKey]] = {}
    stacks: dict[tuple[object, ...], ProcessStack] = {}
    via: dict[tuple[object, ...], dict[str, list[RankKey]]] = {}
    missing: dict[tuple[str, str], list[RankKey]] = {}
    for key in sorted(results):
        r = results[key]
        if isinstance(r, Unavailable):
            missing.setdefault((r.kind, r.reason), []).append(key)
            continue
        sig = signature(r)
        by_sig.setdefault(sig, []).append(key)
        stacks.setdefault(sig, r)
        if r.via:
            via.setdefault(sig, {}).setdefault(r.via, []).append(key)
    order = sorted(by_sig, key=lambda s: (-len(by_sig[s]), by_sig[s][0]))
    why: dict[tuple[object, ...], str] = {}
    sizes = [len(by_sig[s]) for s in order]
    majority = order[0] if len(order) > 1 and sizes[0] > sizes[1] else None
    waiting = [s for s in order if in_collective(stacks[s])]
    for s in order:
        if stacks[s].stopped:
            why[s] = "SIGSTOPped"
        elif majority is not None and s != majority:
            why[s] = f"stack differs from the majority's ({sizes[0]} ranks)"
        elif majority is None and waiting and s not in waiting:
            why[s] = "not in the collective the others wait in"
    groups = tuple(Group(tuple(by_sig[s]), stacks[s], why.get(s, ""),
                         tuple((how, tuple(keys)) for how, keys in via.get(s, {}).items())) for s in order)
    suspects = {k: Suspect(k[0], k[1], g.suspect) for g in groups if g.suspect for k in g.ranks}
    for key, text in _stalled_first(results, last_progress or {}, tolerance).items():
        old = suspects.get(key)
        suspects[key] = Suspect(key[0], key[1], f"{old.why}; {text}" if old else text)
    unavailable = tuple(UnavailableGroup(tuple(keys), kind, reason) for (kind, reason), keys in missing.items())
    return StackReport(groups, unavailable, tuple(suspects[k] for k in sorted(suspects)))


def _with_named(report: StackReport, named: Mapping[RankKey, str]) -> StackReport:
    """The report with the Flight Recorder's suspects instead of the stack rules' (SIGSTOPped ranks stay)."""
    groups = []
    for g in report.groups:
        reasons = {named.get(k, "") for k in g.ranks}
        why = "SIGSTOPped" if g.stack.stopped else reasons.pop() if len(reasons) == 1 else ""
        groups.append(dataclasses.replace(g, suspect=why))
    suspects = {k: why for k, why in named.items()}
    for g in groups:
        if g.stack.stopped:
            suspects.update({k: f"{named[k]}; SIGSTOPped" if k in named else "SIGSTOPped" for k in g.ranks})
    return dataclasses.replace(report, groups=tuple(groups),
                               suspects=tuple(Suspect(k[0], k[1], suspects[k]) for k in sorted(suspects)))


def _stalled_first(results: Mapping[RankKey, StackResult], last: Mapping[int, float],
                   tolerance: float) -> dict[RankKey, str]:
    known = {key: last[key[0]] for key in results if key[0] in last}
    if len(known) < 2:
        return {}
    earliest = min(known.values())
    others = [t for t in known.values() if t - earliest > tolerance]
    if not others:
        return {}
    lead = min(others) - earliest
    return {key: f"stopped making progress first ({lead:.1f} s before the next rank)"
            for key, t in known.items() if t - earliest <= tolerance}


def format_who(ranks: Iterable[RankKey]) -> str:
    """``ranks 0,2-7 (node 0, 1)`` or ``rank 1 (node 0)``."""
    keys = list(ranks)
    nums = sorted({r for r, _ in keys})
    nodes = sorted({n for _, n in keys})
    word = "rank" if len(nums) == 1 else "ranks"
    node_word = "node" if len(nodes) <= 2 else "nodes"
    node_text = ", ".join(map(str, nodes)) if len(nodes) <= 2 else format_ranks(nodes)
    return f"{word} {format_ranks(nums)} ({node_word} {node_text})"


def format_unavailable(ranks: Iterable[RankKey], reason: str) -> str:
    return f"{format_who(ranks)}: no stack: {reason}"


def format_text(report: StackReport, full: bool = False) -> list[str]:
    """The Flight Recorder's lines, a line per group (largest first), then a line per reason a stack could
    not be had.

    full: under each group, its main thread's frames, innermost first.
    """
    lines: list[str] = list(report.flight)
    for g in report.groups:
        mark = f"  [suspect: {g.suspect}]" if g.suspect else ""
        lines.append(f"{format_who(g.ranks)}: {describe_stack(g.stack)}{mark}")
        main = g.stack.main
        if full and main:
            lines.extend(f"    {f.function} ({short_file(f.file)}:{f.line})" + (f": {f.code}" if f.code else "")
                         for f in main.frames)
        lines.extend(f"    {format_who(keys)}: read with {how}" for how, keys in g.via)
    lines.extend(format_unavailable(u.ranks, u.reason) for u in report.unavailable)
    return lines


def format_json(report: StackReport) -> dict[str, Any]:
    """The same report as JSON data: each group with its ranks, summary line, suspect reason and full stack."""
    return {
        "groups": [{"ranks": [r for r, _ in g.ranks], "nodes": sorted({n for _, n in g.ranks}),
                    "summary": describe_stack(g.stack), "suspect": g.suspect, "stack": to_json(g.stack),
                    "via": [{"ranks": [r for r, _ in keys], "nodes": sorted({n for _, n in keys}), "how": how}
                            for how, keys in g.via]}
                   for g in report.groups],
        "unavailable": [{"ranks": [r for r, _ in u.ranks], "nodes": sorted({n for _, n in u.ranks}),
                         "kind": u.kind, "reason": u.reason} for u in report.unavailable],
        "suspects": [dataclasses.asdict(s) for s in report.suspects],
        "flight_recorder": list(report.flight),
    }
