"""The emitter (events to the status tracker, the log and the plugins) and the folding console, in milliseconds."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from detlaunch.cli.control import format_status
from detlaunch.cli.main import main
from detlaunch.observe import console as console_module
from detlaunch.observe.console import FoldedStream
from detlaunch.observe.emitter import EventEmitter
from detlaunch.observe.events import Event, EventKind
from detlaunch.planning.config import apply_defaults, build_parser, parse
from detlaunch.system.eventloop import EventLoop


def test_every_event_reaches_the_tracker_the_log_and_the_plugins_in_that_order(tmp_path: Path) -> None:
    seen: list[tuple[str, object]] = []
    emitter = EventEmitter("job-1", 1, path=str(tmp_path / "events.jsonl"),
                           hook=lambda e: seen.append(("hook", e.kind)) or [], warn=lambda w: seen.append(("warn", w)),
                           clock=lambda: 100.0)
    emitter.emit(EventKind.RANK_REGISTERED, 3, host="h", pid=10)
    event = emitter.emit(EventKind.RANK_STARTED, 3, pid=11)
    emitter.emit(EventKind.NODE_LOST, node=2, host="h2", reason="no heartbeat")
    emitter.close()
    assert event == Event(100.0, "job-1", 1, 3, EventKind.RANK_STARTED, {"pid": 11})
    assert seen == [("hook", "rank_registered"), ("hook", "rank_started"), ("hook", "node_lost")]
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["node"], e["rank"]) for e in lines] == [
        ("rank_registered", 1, 3), ("rank_started", 1, 3), ("node_lost", 2, None)]
    (row,) = emitter.tracker.snapshot(101.0).ranks
    assert (row.rank, row.node, row.host, row.pid, row.state, row.started_at) == (3, 1, "h", 11, "running", 100.0)
    assert emitter.warnings() == []


def test_a_full_disk_is_said_once_and_in_the_report() -> None:
    warned: list[str] = []
    emitter = EventEmitter("job-1", 0, path="/dev/full", hook=None, warn=warned.append)
    for _ in range(3):
        emitter.emit(EventKind.STOP_REQUESTED, reason="finished")
    emitter.close()
    assert warned == ["cannot write the event log /dev/full: No space left on device; the log stops here"]
    assert emitter.warnings() == [f"{warned[0]} (3 event(s) not written)"]


def test_a_plugin_that_raises_is_said_once_and_changes_nothing() -> None:
    warned: list[str] = []
    calls: list[str] = []

    def hook(event: Event) -> list[tuple[str, str]]:
        calls.append(event.kind)
        return [("exporter", "ValueError: boom")]

    emitter = EventEmitter("job-1", 0, path=None, hook=hook, warn=warned.append)
    emitter.emit(EventKind.JOB_PLANNED, layer="x", nodes=1, ranks=1)
    emitter.emit(EventKind.JOB_FINISHED, exit_code=0, duration=1.0)
    assert calls == ["job_planned", "job_finished"]
    assert warned == ["plugin exporter: detlaunch_event failed: ValueError: boom; its later failures are not shown"]
    assert emitter.tracker.phase == "finished"


def _pipe(size: int | None = None) -> tuple[int, int]:
    r, w = os.pipe()
    if size:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, size)
    os.set_blocking(r, False)
    return r, w


def _read_all(fd: int) -> bytes:
    out = b""
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return out
        if not data:
            return out
        out += data


def test_the_console_folds_at_once_when_every_rank_printed_and_at_the_window_end_otherwise() -> None:
    now = [0.0]
    loop = EventLoop(clock=lambda: now[0])
    out_r, out_w = _pipe()
    stream = FoldedStream(loop, out_w, ranks=3, window=0.5)
    os.write(stream.write_fd, b"[rank=0] same\n[rank=1] same\n[rank=2] same\n[rank=0] alone\n[rank=1] two\n")
    loop.run_once(timeout=0)  # read
    loop.run_once(timeout=0)  # write
    assert _read_all(out_r) == b"[ranks=0-2] same\n"
    os.write(stream.write_fd, b"[rank=2] two\n")
    loop.run_once(timeout=0)
    loop.run_once(timeout=0)
    assert _read_all(out_r) == b""  # waiting for rank 0's twin, within the window
    now[0] = 0.6
    loop.run_once(timeout=0)  # the window's timer
    loop.run_once(timeout=0)
    assert _read_all(out_r) == b"[rank=0] alone\n[ranks=1-2] two\n"
    os.write(stream.write_fd, b"[rank=0] last\n")
    stream.close()  # the end: everything waiting is shown
    assert _read_all(out_r) == b"[rank=0] last\n"
    loop.close()
    os.close(out_r)
    os.close(out_w)


def test_a_flood_reaches_the_console_byte_for_byte_after_the_lines_waiting() -> None:
    now = [0.0]
    loop = EventLoop(clock=lambda: now[0])
    out_r, out_w = _pipe()
    stream = FoldedStream(loop, out_w, ranks=2, window=0.5, rate=100)  # over 200 lines a second: a flood
    os.write(stream.write_fd, b"[rank=0] waits\n")
    loop.run_once(timeout=0)
    flood = b"".join(b"[rank=%d] line %d\n" % (i % 2, i) for i in range(300))
    got = b""
    for i in range(0, len(flood), 4096):
        os.write(stream.write_fd, flood[i:i + 4096])
        loop.run_once(timeout=0)  # read
        loop.run_once(timeout=0)  # write
        got += _read_all(out_r)
    assert got == b"[rank=0] waits\n" + flood  # at once (the clock never moved): the waiting line, then every byte
    stream.close()
    assert _read_all(out_r) == b""
    loop.close()
    os.close(out_r)
    os.close(out_w)


def test_a_stalled_console_never_blocks_the_loop_and_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console_module, "OUTBOX_LIMIT", 8192)
    loop = EventLoop()
    out_r, out_w = _pipe(4096)  # a console nobody reads: one page
    stream = FoldedStream(loop, out_w, ranks=2, window=0.2, rate=float("inf"))  # never a flood: always folds
    data = b"".join(b"[rank=0] line %d\n[rank=1] line %d\n" % (i, i) for i in range(2000))  # folds at once
    sent = 0
    while sent < len(data) and stream.reading:
        sent += os.write(stream.write_fd, data[sent:sent + 4096])
        loop.run_once(timeout=0)  # returns at once: never waits for the full console
    assert not stream.reading and len(stream.outbox) > 8192  # back-pressure on the writers, not the loop
    got = b""
    while sent < len(data) or stream.outbox or stream.folder.next_deadline() is not None:
        got += _read_all(out_r)
        if stream.reading and sent < len(data):
            sent += os.write(stream.write_fd, data[sent:sent + 4096])
        loop.run_once(timeout=0.3)
    got += _read_all(out_r)
    assert got.splitlines(keepends=True) == [b"[ranks=0-1] line %d\n" % i for i in range(2000)]  # all, in order
    stream.close()
    loop.close()
    os.close(out_r)
    os.close(out_w)


def test_the_status_table_shows_every_node_and_says_who_did_not_answer() -> None:
    rank = {"rank": 0, "node": 0, "host": "a", "pid": 5, "state": "exited", "exit_code": 3, "signal": None,
            "started_at": 10.0, "ended_at": 15.0, "last_output": 14.0, "last_heartbeat": None, "cpu_percent": None,
            "rss": None, "restarts": 0, "new_field": "ignored"}
    text = format_status({"job": "j", "missing": [1], "nodes": [
        {"node": 0, "host": "a", "phase": "stopping", "taken_at": 20.0, "root_cause": "rank 0 exited",
         "ranks": [rank]}]})
    lines = text.splitlines()
    assert lines[:2] == ["job j: stopping, 1 rank(s) on 1 node(s)", "root cause: rank 0 exited"]
    assert lines[3].split()[:7] == ["0", "a", "0", "5", "exit", "3", "5.0s"]
    assert lines[-1] == "no answer from node(s) 1"


@pytest.mark.parametrize("prefix", ["{nope}", "{rank", "{0}"])
def test_a_bad_prefix_is_one_line(prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--layer", "torchrun", "--prefix", prefix, "--dry-run", "x.py"], env={}) == 2
    err = capsys.readouterr().err
    assert err.startswith("detlaunch: error: argument --prefix: ") and err.count("\n") == 1, err


@pytest.mark.parametrize(("env", "argv", "expected"), [
    ({}, [], None), ({"DETLAUNCH_DEDUPE": "0"}, [], False), ({"DETLAUNCH_DEDUPE": "yes"}, [], True),
    ({"DETLAUNCH_DEDUPE": "1"}, ["--no-dedupe"], False), ({}, ["--dedupe"], True)])
def test_dedupe_is_automatic_unless_a_flag_or_the_variable_says(env: dict[str, str], argv: list[str],
                                                                expected: bool | None) -> None:
    parser = build_parser()
    apply_defaults(parser, env, {}, {}, None)
    ns, _, _ = parse(parser, [*argv, "--", "x.py"], env)
    assert ns.dedupe is expected and ns.dedupe_window == 0.2 and ns.prefix == "[rank={rank}] "
