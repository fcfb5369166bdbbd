"""`detlaunch report` on a malformed or hostile log (security round 2, item 5): a detail of the wrong type, a
number out of any range, nesting deep enough to break a parser, a lone surrogate, a FIFO, a line of 50 MB. Each
gives one warning line naming what could not be read, and a page of what could, in bounded time and size. In
this interpreter (cli.main); no process is started."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from detlaunch.cli.main import main
from support.story_logs import simulated_job, write_logs

pytestmark = pytest.mark.timeout(30)


def detail(kind: str, name: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        if obj["kind"] == kind:
            obj["details"][name] = value
    return change


def field(kind: str, name: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        if obj["kind"] == kind:
            obj[name] = value
    return change


CASES = {
    "exit_code 'x'": detail("job_finished", "exit_code", "x"),
    "duration 'x'": detail("job_finished", "duration", "x"),
    "nodes 'abc'": detail("job_planned", "nodes", "abc"),
    "nodes 3000000": detail("job_planned", "nodes", 3_000_000),
    "nodes 1e9": detail("job_planned", "nodes", 10**9),
    "ranks 1e12": detail("job_planned", "ranks", 10**12),
    "signal 'x'": detail("rank_exited", "signal", "x"),
    "at 'x'": detail("failure", "at", "x"),
    "tail 5": detail("root_cause", "tail", 5),
    "stacks 'x'": detail("root_cause", "stacks", "x"),
    "stacks of objects": detail("root_cause", "stacks", [{"a": 1}]),
    "failure_kind 'x'": detail("root_cause", "failure_kind", "nope"),
    "class 'x'": detail("attempt_ended", "class", "nope"),
    "started_at 1e400": detail("attempt_ended", "started_at", 10**400),
    "time 'inf'": field("job_finished", "time", "inf"),
    "time 1e308": field("job_finished", "time", 1e308),
    "time -1e308": field("job_finished", "time", -1e308),
    "node 1e30": field("rank_exited", "node", 10**30),
    "a lone surrogate": detail("root_cause", "what", "\ud800 broken"),
}


@pytest.mark.parametrize("change", list(CASES.values()), ids=list(CASES))
def test_a_malformed_line_is_named_and_the_rest_makes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               change: Callable[[dict[str, Any]], None]) -> None:
    (chief,) = write_logs(tmp_path / "logs", {0: simulated_job(2)[0]})
    lines = []
    for line in chief.read_text().splitlines():
        obj = json.loads(line)
        change(obj)
        lines.append(json.dumps(obj))
    chief.write_text("\n".join(lines) + "\n")
    out = tmp_path / "page.html"
    assert main(["report", str(chief), "-o", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) in (1, 2) and err[-1].startswith(f"detlaunch: wrote {out} ("), err
    assert len(err) == 1 or ("could not be read" in err[0] and err[0].endswith("the page shows what could be read"))
    assert out.stat().st_size < 1 << 20 and "\ud800" not in out.read_text(errors="replace")


def test_nesting_deep_enough_to_break_a_parser_is_one_unread_line(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (chief,) = write_logs(tmp_path / "logs", {0: simulated_job(2)[0]})
    deep = '{"v":1,"time":1.0,"job":"j","node":0,"rank":null,"kind":"straggler","details":' + "[" * 200_000
    chief.write_text(chief.read_text() + deep + "]" * 200_000 + "}\n")
    assert main(["report", str(chief), "-o", str(tmp_path / "page.html")]) == 0
    assert "1 line(s) could not be read" in capsys.readouterr().err


def test_a_line_of_50_mb_makes_no_large_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = simulated_job(2)[0]
    big = json.loads(next(line for line in lines if '"root_cause"' in line))
    big["details"]["tail"] = ["x" * (50 << 20)]
    (chief,) = write_logs(tmp_path / "logs", {0: [*lines, json.dumps(big)]})
    out = tmp_path / "page.html"
    assert main(["report", str(chief), "-o", str(out)]) == 0
    assert out.stat().st_size < 2 << 20


def test_a_fifo_named_as_a_log_is_one_line_not_a_wait(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "events.jsonl")
    assert main(["report", str(tmp_path / "events.jsonl"), "-o", str(tmp_path / "page.html")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"detlaunch: error: no event could be read from {tmp_path}/events.jsonl ({tmp_path}/events.jsonl: cannot be "
        "read (not a regular file): the page shows what could be read)"]
