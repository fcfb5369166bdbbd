"""Reading a job's event logs for its page (`detlaunch report`): whatever could be read, and one line
about what could not.

A log is read after the fact, often after something went badly: a node killed mid-write leaves its
last line cut short, a disk that filled up leaves the log stopping early, someone's editor leaves a
line that is not JSON. None of that may cost the page: every line that parses is kept, the others are
counted and the first one named, so the page says exactly what it could not show.

A directory stands for the logs a job writes in its `--log-dir` (``events.jsonl``, and
``events-node-N.jsonl`` of the worker nodes that share it). Kinds this detlaunch does not know (a
newer writer's, a plugin's) are kept as `Foreign` records: the page shows them as marks, unexplained.
Pure apart from reading the files.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import stat
from collections.abc import Iterable, Mapping
from typing import Any

from detlaunch.observe.events import DETAILS, EVENTS_FILE, SCHEMA_VERSION, Event, EventKind
from detlaunch.outcome import FailureKind, RestartClass

KNOWN_KINDS = frozenset(k.value for k in EventKind)
MAX_FILE = 256 << 20  # bytes of one log read at most: more is said, not read (memory stays bounded)
MAX_TEXT, MAX_ITEMS, MAX_DEPTH = 16384, 4096, 8  # a detail's string is cut there, an array too; deeper: unread
MAX_NODES, MAX_RANKS = 65536, 1 << 22  # what a job can plan (--nnodes, x 64 ranks a node)
LATEST = 1e11  # seconds since the epoch (year 5138): a time past it is not a time
_JSON: Mapping[str, type | tuple[type, ...]] = {"integer": int, "number": (int, float), "string": str, "boolean": bool,
                                                "array": list, "object": dict}
K = EventKind
# The details the page reads that not every event has (events.DETAILS holds the required ones), by type: a line
# whose details have another type is not read, so that the page never trusts a log's types blindly.
OPTIONAL: Mapping[EventKind, Mapping[str, str]] = {
    K.RANK_EXITED: {"killed": "boolean", "lost": "boolean", "ended": "string", "teardown_signal": "integer"},
    K.FAILURE: {"failure_kind": "string", "tail": "array", "tail_of": "string"},
    K.ROOT_CAUSE: {"failure_kind": "string", "tail": "array", "tail_of": "string", "stacks": "array"},
    K.ATTEMPT_ENDED: {"class": "string", "what": "string", "signature": "string", "exception": "string",
                      "started_at": "number", "ended_at": "number", "next": "string"},
}


@dataclasses.dataclass(frozen=True)
class Foreign:
    """An event of a kind this detlaunch does not know: shown, not interpreted."""

    time: float
    node: int
    rank: int | None
    kind: str
    details: Mapping[str, Any]


@dataclasses.dataclass
class Reading:
    """What was read: the events of every log, in time order, the files read, and what went wrong."""

    events: list[Event] = dataclasses.field(default_factory=list)
    foreign: list[Foreign] = dataclasses.field(default_factory=list)
    files: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)  # one per file that had a problem

    def summary(self) -> str | None:
        """One line for the user about every problem, or None when every line was read."""
        if not self.problems:
            return None
        return "; ".join(self.problems) + ": the page shows what could be read"


def log_files(paths: Iterable[str]) -> list[str]:
    """The event logs `paths` name: files as given, a directory's ``events.jsonl`` and ``events-node-*.jsonl``.

    Raises FileNotFoundError naming a path that is neither (one line for the command)."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = [p for p in [os.path.join(path, EVENTS_FILE),
                                 *sorted(glob.glob(os.path.join(path, "events-node-*.jsonl")), key=_node_order)]
                     if os.path.isfile(p)]
            if not found:
                raise FileNotFoundError(f"{path} holds no event log ({EVENTS_FILE} or events-node-N.jsonl)")
            files.extend(found)
        elif os.path.exists(path):
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
    return list(dict.fromkeys(files))


def _node_order(path: str) -> int:
    digits = os.path.basename(path)[len("events-node-"):-len(".jsonl")]
    return int(digits) if digits.isdigit() else 1 << 30


def read_logs(paths: Iterable[str]) -> Reading:
    """Every readable event of the logs `paths` name (see log_files), merged by time."""
    reading = Reading()
    for path in log_files(paths):
        reading.files.append(path)
        try:  # never a FIFO or a device (a read that would hang, or never end), never more than MAX_FILE
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(22, "not a regular file")
                os.set_blocking(fd, True)
                data = f.read(MAX_FILE + 1)
        except OSError as e:
            reading.problems.append(f"{path}: cannot be read ({e.strerror or e})")
            continue
        if len(data) > MAX_FILE:
            reading.problems.append(f"{path}: only its first {MAX_FILE >> 20} MiB were read")
            data = data[:data.rfind(b"\n", 0, MAX_FILE) + 1]
        read_lines(path, data, reading)
    reading.events.sort(key=lambda e: e.time)  # stable: one node's events keep their order at equal times
    reading.foreign.sort(key=lambda e: e.time)
    return reading


def read_lines(name: str, data: bytes, reading: Reading) -> None:
    """Parse one log's bytes into `reading`; a line that is not an event is counted, the first one named."""
    lines = data.split(b"\n")
    cut = bool(lines and lines[-1].strip())  # no newline after the last line: a write was cut short
    bad: list[tuple[int, str]] = []
    kept: list[tuple[int, object]] = [(n, raw) for n, raw in enumerate(lines, 1) if raw.strip()]
    try:  # the usual log, every line whole: parsed in one call (json's C parser), then each checked
        objs = json.loads(b"[" + b",".join(raw for _, raw in kept if isinstance(raw, bytes)) + b"]")
        if len(objs) == len(kept):  # a line such as `1,2` would make two: then line by line
            kept = [(n, obj) for (n, _), obj in zip(kept, objs, strict=True)]
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        pass
    for number, raw in kept:
        why = _parse(raw, reading)
        if why is not None:
            bad.append((number, why))
    if not bad:
        return
    if cut and len(bad) == 1 and bad[0][0] == len(lines):
        reading.problems.append(f"{name}: its last line (line {bad[0][0]}) is cut short")
        return
    first, why = bad[0]
    reading.problems.append(f"{name}: {len(bad)} line(s) could not be read (line {first}: {why})")


def _parse(raw: object, reading: Reading) -> str | None:
    """Add the line's event (its bytes, or the object they parsed to) to `reading`; else why it is not one."""
    try:
        obj: Any = json.loads(raw) if isinstance(raw, bytes) else raw
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return f"not JSON: {e}"[:120]
    except RecursionError:
        return "not JSON: nested too deep"
    try:
        obj = _bounded(obj, 0)
    except ValueError as e:
        return f"malformed event: {e}"
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if isinstance(kind, str) and kind not in KNOWN_KINDS:
        try:
            version = int(obj["v"])
            if version > SCHEMA_VERSION:
                raise ValueError(f"event schema version {version}: this detlaunch reads up to {SCHEMA_VERSION}")
            rank = obj.get("rank")
            details = obj.get("details") or {}
            reading.foreign.append(Foreign(float(obj["time"]), int(obj["node"]),
                                           rank if isinstance(rank, int) else None, kind,
                                           details if isinstance(details, dict) else {}))
            return None
        except (KeyError, TypeError, ValueError) as e:
            return f"malformed event: {e}"[:120]
    try:
        event = Event.from_obj(obj)
        _check(event)
    except ValueError as e:
        return str(e)[:120]
    reading.events.append(event)
    return None


def _bounded(value: Any, depth: int) -> Any:
    """A parsed line made safe to show: strings cut at MAX_TEXT (a lone surrogate replaced), arrays at MAX_ITEMS;
    ValueError for a number that is not finite, or nesting deeper than MAX_DEPTH."""
    if isinstance(value, str):
        return value[:MAX_TEXT].encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number")
    if isinstance(value, int) and abs(value) >= 1 << 63:
        raise ValueError("a number too large")
    if isinstance(value, (list, dict)) and depth >= MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH}")
    if isinstance(value, list):
        return [_bounded(v, depth + 1) for v in value[:MAX_ITEMS]]
    if isinstance(value, dict):
        return {_bounded(str(k), depth + 1): _bounded(v, depth + 1) for k, v in list(value.items())[:MAX_ITEMS]}
    return value


def _check(event: Event) -> None:
    """ValueError when a detail the page reads has another type than the schema's, or a value is out of bounds."""
    if not 0 <= event.time <= LATEST or abs(event.node) > MAX_NODES or abs(event.rank or 0) > MAX_RANKS:
        raise ValueError("malformed event: its time, node or rank is out of bounds")
    wanted = {**DETAILS.get(event.kind, {}), **OPTIONAL.get(event.kind, {})}
    for name, kinds in wanted.items():
        value = event.details.get(name)
        if value is None:
            continue  # a required one was checked present by the writer's schema; a null reads as absent
        names = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        types = tuple(_JSON[k] for k in names if k in _JSON)
        if not any(isinstance(value, t) for t in types) or (isinstance(value, bool) and bool not in types):
            raise ValueError(f"malformed event: {event.kind.value}'s {name} is not {' or '.join(names)}")
        if isinstance(value, list) and any(not isinstance(v, (str, int, float)) for v in value):
            raise ValueError(f"malformed event: {event.kind.value}'s {name} holds more than values")
    nodes, ranks = event.details.get("nodes") or 0, event.details.get("ranks") or 0
    if event.kind is K.JOB_PLANNED and not (0 <= nodes <= MAX_NODES and 0 <= ranks <= MAX_RANKS):
        raise ValueError(f"malformed event: a job of {nodes} node(s) and {ranks} rank(s) cannot be")
    for name, words in (("failure_kind", FailureKind), ("class", RestartClass)):
        value = event.details.get(name)
        if value is not None and value not in {w.value for w in words}:
            raise ValueError(f"malformed event: {name} {value!r} is not one of detlaunch's")
