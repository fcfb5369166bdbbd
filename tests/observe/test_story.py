"""A job's page from its event logs (observe/story_*.py), without a process: reading logs that went wrong,
the model's words (status's and the report's), folding lanes at scale, the page and the trace. Milliseconds each."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from detlaunch.observe import story_html, story_trace
from detlaunch.observe.events import Event, EventKind
from detlaunch.observe.status import StatusTracker, render_table
from detlaunch.observe.story_lanes import lanes
from detlaunch.observe.story_model import Story, build
from detlaunch.observe.story_read import Reading, log_files, read_lines, read_logs
from support.story_logs import T0, simulated_job, write_logs

pytestmark = pytest.mark.timeout(30)
K = EventKind


def story_of(tmp_path: Path, ranks: int, **kw: int) -> Story:
    write_logs(tmp_path / "logs", simulated_job(ranks, **kw))
    return build(read_logs([str(tmp_path / "logs")]))


def line(t: float, event_kind: EventKind, rank: int | None = None, node: int = 0, **details: object) -> str:
    return Event(T0 + t, "j", node, rank, event_kind, details).to_json_line()


@pytest.fixture(scope="module")
def story_1024(tmp_path_factory: pytest.TempPathFactory) -> Story:
    """The simulated 1024-rank job of 3 attempts, read once for the tests that need it (about a second)."""
    return story_of(tmp_path_factory.mktemp("story"), 1024)


# -- reading -----------------------------------------------------------------------------------------------


def test_a_log_cut_short_keeps_every_whole_line_and_says_its_last_is_cut() -> None:
    good = [line(0, K.JOB_PLANNED, layer="direct", nodes=1, ranks=1), line(1, K.RANK_STARTED, 0, pid=5)]
    data = ("\n".join(good) + "\n" + line(2, K.RANK_EXITED, 0, code=0, signal=None, wall=T0 + 2, stopped=False)[:30])
    reading = Reading()
    read_lines("events.jsonl", data.encode(), reading)
    assert [e.kind for e in reading.events] == [K.JOB_PLANNED, K.RANK_STARTED]
    assert reading.problems == ["events.jsonl: its last line (line 3) is cut short"]
    assert reading.summary() == "events.jsonl: its last line (line 3) is cut short: the page shows what could be read"


def test_lines_that_are_not_events_are_counted_and_the_first_named() -> None:
    data = "\n".join([line(0, K.JOB_PLANNED, layer="x", nodes=1, ranks=1), "garbage {", '{"v":1}', "[1,2]",
                      line(1, K.JOB_FINISHED, exit_code=0, duration=1.0)]) + "\n"
    reading = Reading()
    read_lines("a.jsonl", data.encode(), reading)
    assert len(reading.events) == 2
    assert len(reading.problems) == 1 and reading.problems[0].startswith("a.jsonl: 3 line(s) could not be read "
                                                                          "(line 2: not JSON: ")
    whole = Reading()  # every line JSON (read in one go): a line that is no event is still named by its number
    read_lines("b.jsonl", "\n".join([line(0, K.JOB_PLANNED, layer="x", nodes=1, ranks=1), "", '{"v":1}', "1,2"])
               .encode() + b"\n", whole)
    assert len(whole.events) == 1 and whole.problems == [
        "b.jsonl: 2 line(s) could not be read (line 3: an event needs the field 'kind')"]


def test_a_kind_this_detlaunch_does_not_know_is_kept_as_a_mark_and_a_newer_schema_is_not() -> None:
    unknown = json.dumps({"v": 1, "time": T0, "job": "j", "node": 0, "rank": 2, "kind": "gpu_throttled",
                            "details": {"ratio": 2.1}})
    newer = json.dumps({"v": 99, "time": T0, "job": "j", "node": 0, "rank": None, "kind": "future", "details": {}})
    reading = Reading()
    read_lines("e", f"{unknown}\n{newer}\n".encode(), reading)
    assert [(f.kind, f.rank, dict(f.details)) for f in reading.foreign] == [("gpu_throttled", 2, {"ratio": 2.1})]
    assert "event schema version 99" in reading.problems[0]
    spare = json.dumps({"v": 1, "time": T0, "job": "j", "node": 1, "rank": None, "kind": "spare_promoted",
                        "details": {"spare": 3, "host": "10.0.0.9", "replaces": "10.0.0.2"}})
    reading = Reading()
    read_lines("e", f"{spare}\n".encode(), reading)
    assert [(m.kind, m.text) for m in build(reading).marks] == [
        ("replaced", "spare 3 (10.0.0.9) takes the place of node 1 (10.0.0.2)")]
    known = Reading(events=[Event(T0, "j", 0, None, K.STACKS_TAKEN, {"ranks": [0], "path": "/x"})])
    assert [(m.kind, m.text) for m in build(known).marks] == [("stacks_taken", "stacks_taken: ranks=[0], path=/x")]


def test_a_log_dir_gives_the_chiefs_log_then_the_workers_in_node_order(tmp_path: Path) -> None:
    for name in ("events-node-10.jsonl", "events-node-2.jsonl", "events.jsonl", "rank-0.log"):
        (tmp_path / name).write_text("")
    assert [Path(p).name for p in log_files([str(tmp_path)])] == ["events.jsonl", "events-node-2.jsonl",
                                                                  "events-node-10.jsonl"]
    with pytest.raises(FileNotFoundError, match="no-such: no such file or directory"):
        log_files([str(tmp_path / "no-such")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no event log"):
        log_files([str(tmp_path / "empty")])


# -- the model: status's and the report's words ---------------------------------------------------------


def test_each_rank_has_a_span_per_attempt_in_the_words_detlaunch_status_uses(tmp_path: Path) -> None:
    story = story_of(tmp_path, 16)
    assert len(story.attempts) == 3 and story.ranks == list(range(16))
    tracker = StatusTracker("sim-job")  # what `detlaunch status` would have shown at the end, from the same events
    for path in sorted((tmp_path / "logs").iterdir()):
        for raw in path.read_text().splitlines():
            obj = json.loads(raw)
            if obj["kind"] in ("rank_registered", "rank_started", "rank_exited"):
                tracker.observe(Event.from_json(raw))
    table = render_table(tracker.snapshot(T0 + 100), T0 + 100)
    for rank in range(16):
        last = story.spans[rank][-1]
        assert last.words == tracker.ranks[rank].describe_state()
        assert f"  {last.words}  " in table
    assert [s.words for s in story.spans[5]] == ["exit 3", "stopped (exit 143)", "stopped (killed by SIGKILL)"]
    assert [s.cause for s in story.spans[5]] == [True, False, False]
    assert story.spans[5][0].note == " (root cause)" and story.spans[0][0].note == " (stopped by detlaunch)"
    assert [s.outcome for s in story.spans[8]] == ["stopped", "running", "stopped"]  # node 1: lost in attempt 2


def test_the_report_under_the_timeline_is_the_end_report_in_its_own_words(tmp_path: Path) -> None:
    story = story_of(tmp_path, 16)
    assert story.verdict == "failed: the job hung: no rank showed progress for 30.0 s (--hang-timeout) (exit 124)"
    assert story.report[:3] == ["3 attempt(s):",
                                "  attempt 1: rank-failed after 22.0 s: rank 5 on node 0 (10.0.0.1) exited with code 3",
                                "    -> attempt 2 started 1.0 s later"]
    assert "    -> restart budget spent (2 of 2): not restarting" in story.report
    assert "every rank's stack when the job hung:" in story.report
    assert "  rank 3 (node 0): killed by SIGKILL (stopped by detlaunch)" in story.report
    assert story.report[-1] == "exit code 124"


def test_lost_node_spare_hang_backoff_and_a_straggler_are_marked(tmp_path: Path) -> None:
    story = story_of(tmp_path, 16)
    kinds = {(m.kind, m.node, m.rank) for m in story.marks}
    assert {("lost", 1, None), ("replaced", 1, None), ("straggler", 0, 2), ("failure", 0, 5)} <= kinds
    assert next(m.text for m in story.marks if m.kind == "replaced") == "node 1: 10.9.0.2 took the place of 10.0.0.2"
    assert [w.kind for w in story.windows].count("backoff") == 2
    hang = next(w for w in story.windows if w.kind == "hang")
    assert hang.end - hang.start == pytest.approx(30.0)
    assert story.missing_logs() == []


def test_a_worker_log_that_was_not_given_is_named(tmp_path: Path) -> None:
    paths = write_logs(tmp_path / "logs", simulated_job(16))
    story = build(read_logs([str(paths[0])]))
    assert story.missing_logs() == [1] and story.ranks == list(range(8))


def test_an_old_log_without_the_new_details_still_tells_its_story() -> None:
    """Logs of a detlaunch before these details: no attempt classes, no root cause lines."""
    lines = [line(0, K.JOB_PLANNED, layer="torchrun", nodes=1, ranks=2),
             line(1, K.RANK_REGISTERED, 0, host="h", pid=1), line(1, K.RANK_REGISTERED, 1, host="h", pid=2),
             line(1.5, K.RANK_STARTED, 0, pid=3), line(1.5, K.RANK_STARTED, 1, pid=4),
             line(3, K.RANK_EXITED, 1, code=7, signal=None, wall=T0 + 3, stopped=False),
             line(3.1, K.FAILURE, 1, what="rank 1 on node 0 (h) exited with code 7", exit_code=7, at=T0 + 3),
             line(3.5, K.RANK_EXITED, 0, code=None, signal=15, wall=T0 + 3.4, stopped=True),
             line(4, K.ROOT_CAUSE, 1, what="rank 1 on node 0 (h) exited with code 7", exit_code=7, at=T0 + 3),
             line(4, K.JOB_FINISHED, exit_code=7, duration=4.0)]
    reading = Reading()
    read_lines("old", "\n".join(lines).encode() + b"\n", reading)
    story = build(reading)
    assert story.report == ["job failed: rank 1 on node 0 (h) exited with code 7",
                            "  rank 0 (node 0): killed by SIGTERM (stopped by detlaunch)",
                            "  rank 1 (node 0): exit 7 (root cause)", "exit code 7"]
    assert [s.words for s in story.spans[0]] == ["stopped (killed by SIGTERM)"]


# -- lanes, page and trace ---------------------------------------------------------------------------------


def test_lanes_fold_by_node_at_scale_and_keep_the_odd_ones_out(tmp_path: Path, story_1024: Story) -> None:
    assert all(not g.folded for g in lanes(story_of(tmp_path, 16)))
    groups = lanes(story_1024)
    assert len(groups) == 128
    assert groups[0].shown == (2, 5) and groups[0].why[5] == "its failure ended an attempt"
    assert groups[0].why[2] == "straggler"
    assert all(g.shown == () and len(g.folded) == 8 for g in groups[1:])


def test_a_1024_rank_page_of_3_attempts_is_small_self_contained_and_marks_the_root_cause(story_1024: Story) -> None:
    page = story_html.render(story_1024)
    assert len(page.encode()) < 2 * 1024 * 1024
    assert "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none';" in page
    assert not re.search(r"(https?:|//[a-z]|\bsrc=|@import|url\()", page)  # nothing a browser would fetch
    assert page.count('<details class="folded"') == 128
    assert page.count('class="lane rank') == 2  # the odd ones out; the others wait in the folded lanes' JSON
    folded = json.loads(page.split('<script type="application/json" id="folded-lanes">')[1].split("</script>")[0])
    assert len(folded) == 128 and sum(lanes.count('class="lane rank') for lanes in folded.values()) == 1022
    assert re.search(r'<div class="lane rank cause" data-rank="5" data-node="0" data-cause="1"', page)
    assert page.count('class="band attempt"') == 3


def test_what_the_logs_say_is_escaped_on_the_page() -> None:
    what = "rank 0 on node 0 (<script>alert(1)</script>) exited with code 1"
    lines = [line(0, K.JOB_PLANNED, layer="x", nodes=1, ranks=1), line(1, K.RANK_STARTED, 0, pid=1),
             line(2, K.RANK_EXITED, 0, code=1, signal=None, wall=T0 + 2, stopped=False),
             line(2, K.FAILURE, 0, what=what, exit_code=1, at=T0 + 2),
             line(3, K.ROOT_CAUSE, 0, what=what, exit_code=1, at=T0 + 2, failure_kind="rank", tail=["</pre><b>x"],
                  tail_of="rank 0"), line(3, K.JOB_FINISHED, exit_code=1, duration=3.0)]
    reading = Reading()
    read_lines("e", "\n".join(lines).encode() + b"\n", reading)
    page = story_html.render(build(reading))
    assert "<script>alert" not in page and "</pre><b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "  | &lt;/pre&gt;&lt;b&gt;x" in page


def test_the_trace_has_a_thread_per_rank_and_a_complete_event_per_attempt(tmp_path: Path) -> None:
    trace = json.loads(story_trace.render(story_of(tmp_path, 16)))
    events = trace["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert len(names) == 16 and (2, "rank 8") in names  # node 1 is pid 2
    spans = [e for e in events if e["ph"] == "X" and e["pid"] > 0]
    assert len(spans) == 48 and all(e["ts"] >= 0 and e["dur"] >= 0 for e in spans)
    cause = [e for e in spans if "cause" in e["cat"]]
    assert [(e["tid"], e["name"]) for e in cause] == [(6, "attempt 1: exit 3")]
    assert {e["name"] for e in events if e["ph"] == "X" and e["pid"] == 0} >= {"attempt 1: exit 3",
                                                                                  "attempt 3: exit 124"}
    assert trace["otherData"]["report"][-1] == "exit code 124"
