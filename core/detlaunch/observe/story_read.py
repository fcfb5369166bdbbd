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
import os
from collections.abc import Iterable, Mapping
from typing import Any

from detlaunch.observe.events import EVENTS_FILE, SCHEMA_VERSION, Event, EventKind

KNOWN_KINDS = frozenset(k.value for k in EventKind)


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
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            reading.problems.append(f"{path}: cannot be read ({e.strerror or e})")
            continue
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
    except (json.JSONDecodeError, UnicodeDecodeError):
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
        reading.events.append(Event.from_obj(obj))
    except ValueError as e:
        return str(e)[:120]
    return None
