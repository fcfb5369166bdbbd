"""Events: JSON lines that round-trip, match the documented schema, and a log that never raises.

jsonschema is not a dependency: `check` below implements the part of JSON Schema that
docs/events.schema.json uses, and the tests show it rejects what it should.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
from detlaunch.observe.events import DETAILS, SCHEMA_VERSION, Event, EventKind, EventLog, events_path, json_schema
from support import paths

ROOT = paths.ROOT
SCHEMA_FILE = ROOT / "docs" / "events.schema.json"
EVENTS_MD = (ROOT / "docs" / "EVENTS.md").read_text()
SCHEMA = json.loads(SCHEMA_FILE.read_text())

JSON_TYPES: dict[str, Any] = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
                              "integer": int, "number": (int, float)}
SUPPORTED = {"$schema", "$id", "title", "description", "type", "required", "properties", "additionalProperties",
             "enum", "const", "minimum", "maximum", "allOf", "if", "then"}


def is_type(value: object, name: str) -> bool:
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    return isinstance(value, JSON_TYPES[name])


def check(value: object, schema: dict[str, Any], where: str = "$") -> list[str]:
    """The errors of `value` against `schema` (the subset of JSON Schema listed in SUPPORTED)."""
    unknown = set(schema) - SUPPORTED
    assert not unknown, f"the schema uses {unknown}: teach check() first"
    errors: list[str] = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(is_type(value, t) for t in types):
            return [f"{where}: {value!r} is not of type {types}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{where}: {value!r} is not {schema['const']!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: {value} > {schema['maximum']}")
    if isinstance(value, dict):
        errors += [f"{where}: {name!r} is required" for name in schema.get("required", ()) if name not in value]
        props = schema.get("properties", {})
        for name, sub in props.items():
            if name in value:
                errors += check(value[name], sub, f"{where}.{name}")
        if schema.get("additionalProperties") is False:
            errors += [f"{where}: unexpected {name!r}" for name in value if name not in props]
    for sub in schema.get("allOf", ()):
        errors += check(value, sub, where)
    if "if" in schema and not check(value, schema["if"], where):
        errors += check(value, schema.get("then", {}), where)
    return errors


SAMPLE_DETAILS: dict[str, Any] = {"integer": 3, "number": 1.5, "string": "x", "boolean": True, "array": [1, 2],
                                  "null": None}


def sample(kind: EventKind) -> Event:
    """An event of `kind` with every documented detail."""
    details = {name: SAMPLE_DETAILS[t[0] if isinstance(t, tuple) else t] for name, t in DETAILS[kind].items()}
    return Event(1764577335.25, "job-1", 1, 3, kind, details)


def test_the_schema_document_is_the_one_the_code_generates() -> None:
    assert SCHEMA == json_schema(), "docs/events.schema.json is out of date: python -m detlaunch.observe.events > it"


def test_every_kind_has_its_details_declared() -> None:
    assert set(DETAILS) == set(EventKind)


@pytest.mark.parametrize("kind", list(EventKind))
def test_every_kind_round_trips_and_matches_the_schema(kind: EventKind) -> None:
    event = sample(kind)
    line = event.to_json_line()
    assert "\n" not in line
    assert check(json.loads(line), SCHEMA) == []
    assert Event.from_json(line) == event


def test_the_checker_rejects_what_the_schema_forbids() -> None:
    good = json.loads(sample(EventKind.RANK_EXITED).to_json_line())
    assert check(good, SCHEMA) == []
    missing = {**good, "details": {"code": 1, "signal": None, "wall": 2.0}}
    assert check(missing, SCHEMA) == ["$.details: 'stopped' is required"]
    wrong_type = {**good, "details": {**good["details"], "code": "3"}}
    assert check(wrong_type, SCHEMA) == ["$.details.code: '3' is not of type ['integer', 'null']"]
    assert check({**good, "kind": "rank_vanished"}, SCHEMA) != []
    assert check({**good, "extra": 1}, SCHEMA) == ["$: unexpected 'extra'"]
    assert check({**good, "v": SCHEMA_VERSION + 1}, SCHEMA) != []
    assert check({**good, "rank": True}, SCHEMA) != []


def test_events_md_documents_every_kind_and_its_details() -> None:
    sections = dict(re.findall(r"^### `(\w+)`\n(.*?)(?=^### |\Z)", EVENTS_MD, re.M | re.S))
    assert set(sections) == {k.value for k in EventKind}, "docs/EVENTS.md: one ### section per EventKind"
    for kind, fields in DETAILS.items():
        for name in fields:
            assert f"`{name}`" in sections[kind.value], f"docs/EVENTS.md: {kind.value} does not document {name}"
    assert f"(schema version {SCHEMA_VERSION})" in EVENTS_MD.splitlines()[0]


def test_details_are_frozen_and_kinds_are_plain_strings() -> None:
    event = Event.now(EventKind.RANK_STARTED, "j", 0, 0, pid=42)
    with pytest.raises(TypeError):
        event.details["pid"] = 1  # type: ignore[index]
    assert event.kind == "rank_started" and Event(0.0, "j", 0, None, "node_lost").kind is EventKind.NODE_LOST  # type: ignore[arg-type]


def test_a_detail_json_cannot_hold_is_written_as_its_repr() -> None:
    line = Event(0.0, "j", 0, None, EventKind.STOP_REQUESTED, {"reason": {1, 2}.__class__}).to_json_line()
    assert json.loads(line)["details"]["reason"] == "<class 'set'>"


@pytest.mark.parametrize(("line", "says"), [
    ("{not json", "not JSON"),
    ("[1]", "a JSON object"),
    ('{"v":2,"time":0,"job":"j","node":0,"rank":null,"kind":"job_finished","details":{}}', "reads up to 1"),
    ('{"v":1,"time":0,"job":"j","node":0,"rank":null,"kind":"job_exploded","details":{}}', "malformed"),
    ('{"v":1,"time":0,"job":"j","rank":null,"kind":"job_finished","details":{}}', "the field 'node'"),
    ('{"v":1,"time":0,"job":"j","node":0,"rank":"3","kind":"job_finished","details":{}}', "not an integer"),
    ('{"v":1,"time":0,"job":"j","node":0,"rank":true,"kind":"job_finished","details":{}}', "not an integer"),
])
def test_a_bad_line_is_one_clear_value_error(line: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Event.from_json(line)


def test_the_log_appends_one_private_line_per_event(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(sample(EventKind.JOB_PLANNED).to_json_line() + "\n")
    path.chmod(0o644)
    events = [sample(k) for k in EventKind]
    with EventLog(str(path)) as log:
        assert all(log.write(e) for e in events)
    assert log.error is None and log.dropped == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_text().splitlines()
    assert [Event.from_json(x) for x in lines] == [sample(EventKind.JOB_PLANNED), *events]


def test_the_log_refuses_a_symlink_without_raising(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "events.jsonl").symlink_to(target)
    log = EventLog(str(tmp_path / "events.jsonl"))
    assert not log.write(sample(EventKind.JOB_FINISHED)) and not log.write(sample(EventKind.JOB_FINISHED))
    assert log.error == (f"cannot open the event log {tmp_path}/events.jsonl: Too many levels of symbolic links; "
                         "no event is logged")
    assert log.dropped == 2 and target.read_text() == ""


def test_the_log_refuses_a_file_of_another_user(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to make a file of another user")
    path = tmp_path / "events.jsonl"
    path.write_text("")
    os.chown(path, 65534, 65534)
    log = EventLog(str(path))
    assert not log.write(sample(EventKind.JOB_FINISHED)) and path.read_text() == ""
    assert log.error == f"cannot open the event log {path}: it belongs to uid 65534, not to you; no event is logged"


def test_a_fifo_of_another_user_or_nobody_reading_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO planted at the --events path must neither read the stream nor hold the job's start."""
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo)
    log = EventLog(str(fifo))  # nobody reads it: ENXIO at once, not a hang
    assert log.error == f"cannot open the event log {fifo}: No such device or address; no event is logged"
    if os.getuid() != 0:
        return
    os.chown(fifo, 65534, 65534)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        log = EventLog(str(fifo))
        assert log.error == f"cannot open the event log {fifo}: it belongs to uid 65534, not to you; no event is logged"
        assert not log.write(sample(EventKind.JOB_PLANNED))
        assert os.read(reader, 100) == b""  # nothing reached the other user's reader (its writer is gone)
    finally:
        os.close(reader)


def test_a_write_failure_is_recorded_once_and_the_log_stops(tmp_path: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    log = EventLog("/dev/full")
    assert log.error is None  # opening works; every write fails with ENOSPC
    assert not log.write(sample(EventKind.RANK_STARTED))
    first = log.error
    assert first == "cannot write the event log /dev/full: No space left on device; the log stops here"
    assert not log.write(sample(EventKind.RANK_EXITED)) and log.error == first and log.dropped == 2
    log.close()


def test_events_go_to_the_flag_else_the_log_dir_else_nowhere() -> None:
    assert events_path("my.jsonl", "logs") == "my.jsonl"
    assert events_path(None, "logs") == "logs/events.jsonl"
    assert events_path(None, None) is None
