"""What torch's Flight Recorder says of a hung job: the rank that never entered the collective the others wait in.

    flight recorder: rank 1 never entered all_reduce #4 (rank 0 waits in it)

On GPUs a rank's Python stack shows its next sync point, not the NCCL collective it is stuck behind,
so the stack rule ("not in the collective the others wait in", groups.py) can name the wrong rank.
Every rank's Flight Recorder (rank/flightrec.py asks for it) lists the collectives it entered, per
process group, each numbered (`collective_seq_id`) and marked when it completed. Per process group:
the highest number any rank entered is #N; a member whose last entered is lower never entered #N,
one that entered #N and did not complete it waits in it. The ranks that never entered are the
suspects, less those that themselves wait in another group's collective (they are held up by
someone else), unless every one of them does (a cycle).

Pure functions, no I/O: `summarize` on each node (a dump of 2000 entries, ~1 MB, becomes a few
fields per process group before it crosses the job link), `verdict` where the stacks are grouped.
Point-to-point operations (send/recv) are left out; a member of a subgroup that never entered any
of its collectives is known only where torch lists the group's ranks (NCCL's `pg_config`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from detlaunch.observe.rank_sets import format_ranks
from detlaunch.rank.flightrec import ABSENT, NO_FIFO

RankKey = tuple[int, int]  # (rank, node rank), as groups.py
RECORDERS = ("nccl", "fr")  # the keys of a rank's answer: torch's NCCL recorder, and the one of gloo and others
MAX_GROUP_LINES = 4
NOT_THERE = frozenset({ABSENT, NO_FIFO})  # no rank answering for one of these: not a torch.distributed job, or off


@dataclasses.dataclass(frozen=True)
class FlightVerdict:
    lines: tuple[str, ...]  # for the report, beside the stacks
    suspects: Mapping[RankKey, str]  # the ranks it names: why ("never entered all_reduce #4 (flight recorder)")


def summarize(raw: bytes) -> dict[str, Any]:
    """A rank's answer reduced to what `verdict` needs: {"groups": [{lib, pg, desc, entered, op, completed,
    ranks}]} (the highest collective number it entered in each process group, its name, the highest it
    completed, the group's ranks where torch lists them), or {"error": why}."""
    try:
        data = json.loads(raw)
    except ValueError:
        return {"error": "its answer could not be read (cut short?)"}
    if not isinstance(data, dict):
        return {"error": "its answer could not be read"}
    if "error" in data:
        return {"error": str(data["error"])}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    errors = []
    for key in RECORDERS:
        dump = data.get(key)
        if isinstance(dump, dict) and "error" in dump:
            errors.append(f"{key}: {dump['error']}")
        elif isinstance(dump, dict):
            _add_dump(dump, groups)
    if not groups and errors:
        return {"error": f"torch's dump failed ({'; '.join(errors)})"}
    return {"groups": [groups[k] for k in sorted(groups)]}


def _add_dump(dump: Mapping[str, Any], groups: dict[tuple[str, str], dict[str, Any]]) -> None:
    config = dump.get("pg_config")
    config = config if isinstance(config, dict) else {}
    by_id: dict[str, tuple[str, str]] = {}  # pg_id (this process's own numbering) -> group
    for e in dump.get("entries") or []:
        try:
            if e.get("is_p2p"):
                continue
            seq = int(e["collective_seq_id"])
            pg, desc = str(e["process_group"][0]), str(e["process_group"][1])
            lib, colon, op = str(e["profiling_name"]).partition(":")  # "gloo:all_reduce"
            if not colon:
                lib, op = "", lib
        except (AttributeError, KeyError, TypeError, ValueError, IndexError):
            continue
        g = groups.setdefault((lib, pg), {"lib": lib, "pg": pg, "desc": desc, "entered": 0, "op": "",
                                          "completed": 0, "ranks": _ranks(config, pg)})
        by_id[str(e.get("pg_id"))] = (lib, pg)
        if seq >= g["entered"]:
            g["entered"], g["op"] = seq, op
        if e.get("state") == "completed" or e.get("retired") is True:
            g["completed"] = max(g["completed"], seq)
    status = dump.get("pg_status")
    for pg_id, st in (status.items() if isinstance(status, dict) else ()):
        if str(pg_id) in by_id and isinstance(st, dict):
            g = groups[by_id[str(pg_id)]]
            try:
                g["completed"] = max(g["completed"], min(int(st["last_completed_collective"]), g["entered"]))
            except (KeyError, TypeError, ValueError):
                pass


def _ranks(config: Mapping[str, Any], pg: str) -> list[int]:
    """The group's global ranks, where torch's pg_config lists them ('[0, 1]'); [] where it does not (gloo)."""
    entry = config.get(pg)
    try:
        ranks = json.loads(entry["ranks"]) if isinstance(entry["ranks"], str) else entry["ranks"]  # type: ignore[index]
        return sorted(int(r) for r in ranks)
    except (KeyError, TypeError, ValueError):
        return []


def is_world(lib_pg: tuple[str, str], desc: str) -> bool:
    return lib_pg[1] == "0" or desc == "default_pg"


def verdict(flights: Mapping[RankKey, Mapping[str, Any]]) -> FlightVerdict:
    """The ranks' summaries (`summarize`; an {"error": why} for a rank that did not answer) -> the lines
    for the report and the suspects. Nothing at all when no rank has a flight recorder listener (not a
    torch.distributed job) or its FIFO (turned off)."""
    answered = {k: v for k, v in flights.items() if isinstance(v.get("groups"), list)}
    silent: dict[str, list[RankKey]] = {}
    for k, v in sorted(flights.items()):
        if k not in answered:
            silent.setdefault(str(v.get("error") or "no answer"), []).append(k)
    if not answered and set(silent) <= NOT_THERE:
        return FlightVerdict((), {})
    seen, descs = _by_group(answered)
    found = (_finding(g, seen[g], _members(g, seen[g], descs[g], answered)) for g in sorted(seen, key=_order))
    findings = [f for f in found if f is not None]
    libs = {g[0] for g in seen}
    lines: list[str] = []
    suspects: dict[RankKey, str] = {}
    waiting_anywhere = {k for f in findings for k in f.waiting}
    for f in findings:
        where = _where(f.group, descs[f.group])
        name = f"{f.group[0]} {f.ops[0]} #{f.seq}{where}" if len(libs) > 1 else f"{f.ops[0]} #{f.seq}{where}"
        if f.behind:
            told = [f"{_who(f.waiting)} {_verb(f.waiting, 'waits', 'wait')} in it" if f.waiting else "",
                    f"{_who(f.done)} completed it" if f.done else ""]
            lines.append(f"flight recorder: {_who(f.behind)} never entered {name} ({'; '.join(t for t in told if t)})")
            suspects.update({k: f"never entered {name} (flight recorder)" for k in f.behind})
        elif len(f.ops) > 1:
            entered = "; ".join(f"{_who(keys)} {op}" for op, keys in f.by_op)
            lines.append(f"flight recorder: the ranks entered different collectives as #{f.seq}{where}: {entered}")
        elif f.waiting:
            every = "every rank of the group that answered" if silent else "every rank of the group"
            lines.append(f"flight recorder: {_who(f.waiting)} {_verb(f.waiting, 'waits', 'wait')} in {name}, "
                         f"which {every} entered")
    if len(lines) > MAX_GROUP_LINES:
        lines[MAX_GROUP_LINES:] = [f"flight recorder: and {len(lines) - MAX_GROUP_LINES} more process group(s)"]
    if findings and not lines and silent:
        lines.append("flight recorder: every rank that answered completed every collective it entered")
    elif findings and not lines:
        last = f" ({findings[0].ops[0]} #{findings[0].seq})" if len(findings) == 1 else ""
        lines.append(f"flight recorder: every rank completed every collective it entered{last}: "
                     "the hang is not in a collective")
    lines.extend(f"flight recorder: {_who(keys)}: {why}" for why, keys in silent.items())
    free = {k: why for k, why in suspects.items() if k not in waiting_anywhere}  # the others wait on someone
    if not free and not silent:  # each of them waits in another collective: a cycle, all of them are suspects
        free = suspects  # (with ranks that did not answer, the chain may lead to one of those: name none)
    return FlightVerdict(tuple(lines), free)


@dataclasses.dataclass(frozen=True)
class _Finding:
    group: tuple[str, str]
    seq: int  # the highest collective number a member entered
    ops: tuple[str, ...]  # its name(s), as the members that entered it recorded it
    by_op: tuple[tuple[str, tuple[RankKey, ...]], ...]
    behind: tuple[RankKey, ...]  # never entered it
    waiting: tuple[RankKey, ...]  # entered it, not completed
    done: tuple[RankKey, ...]  # entered and completed it


def _by_group(answered: Mapping[RankKey, Mapping[str, Any]]) -> tuple[
        dict[tuple[str, str], dict[RankKey, Mapping[str, Any]]], dict[tuple[str, str], str]]:
    seen: dict[tuple[str, str], dict[RankKey, Mapping[str, Any]]] = {}
    descs: dict[tuple[str, str], str] = {}
    for key, summary in sorted(answered.items()):
        for g in summary["groups"]:
            if isinstance(g, Mapping):
                group = (str(g.get("lib", "")), str(g.get("pg", "")))
                seen.setdefault(group, {})[key] = g
                descs.setdefault(group, str(g.get("desc") or ""))
    return seen, descs


def _members(group: tuple[str, str], seen: Mapping[RankKey, Mapping[str, Any]], desc: str,
             answered: Mapping[RankKey, Any]) -> set[RankKey]:
    """The ranks that answered and belong to the group: those that recorded it, those torch lists for it,
    and for the default group every rank that answered."""
    if is_world(group, desc):
        return set(answered)
    by_rank = {k[0]: k for k in answered}
    listed = {by_rank[r] for g in seen.values() for r in g.get("ranks") or [] if r in by_rank}
    return set(seen) | listed


def _finding(group: tuple[str, str], seen: Mapping[RankKey, Mapping[str, Any]],
             members: Iterable[RankKey]) -> _Finding | None:
    entered, completed = {}, {}
    for k in members:
        try:
            entered[k] = int(seen[k]["entered"]) if k in seen else 0
            completed[k] = int(seen[k]["completed"]) if k in seen else 0
        except (KeyError, TypeError, ValueError):
            continue
    if not entered or max(entered.values()) <= 0:
        return None
    seq = max(entered.values())
    at = sorted(k for k in entered if entered[k] == seq)
    by_op: dict[str, list[RankKey]] = {}
    for k in at:
        by_op.setdefault(str(seen[k].get("op") or "collective"), []).append(k)
    return _Finding(group, seq, tuple(sorted(by_op)), tuple((op, tuple(ks)) for op, ks in sorted(by_op.items())),
                    tuple(sorted(k for k in entered if entered[k] < seq)),
                    tuple(k for k in at if completed[k] < seq), tuple(k for k in at if completed[k] >= seq))


def _order(group: tuple[str, str]) -> tuple[int, int, str, str]:
    lib, pg = group
    return (0 if pg == "0" else 1, int(pg) if pg.isdigit() else 1 << 30, pg, lib)


def _where(group: tuple[str, str], desc: str) -> str:
    if is_world(group, desc):
        return ""
    named = f" ({desc})" if desc and desc != "undefined" else ""
    return f" of process group {group[1]}{named}"


def _who(keys: Iterable[RankKey]) -> str:
    ranks = sorted({k[0] for k in keys})
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _verb(keys: tuple[RankKey, ...], one: str, many: str) -> str:
    return one if len({k[0] for k in keys}) == 1 else many
