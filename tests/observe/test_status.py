"""The status snapshot: JSON that round-trips, and a table a person can read."""

from __future__ import annotations

import signal

import pytest
from detlaunch.observe.events import Event, EventKind
from detlaunch.observe.status import (
    CLEAR_AND_HOME,
    EXITED,
    RUNNING,
    STOPPED,
    JobPhase,
    JobStatus,
    RankState,
    StatusTracker,
    format_age,
    format_duration,
    merge,
    render_table,
    watch_frame,
)

NOW = 1764577400.0
STATUS = JobStatus("job-7", "stopping", NOW, ranks=(
    RankState(1, 0, "127.0.0.1", 4242, EXITED, exit_code=3, started_at=NOW - 75.5, ended_at=NOW - 2.0,
              last_output=NOW - 2.5, cpu_percent=99.25, rss=412 * 1024 * 1024 + 300_000, restarts=1),
    RankState(0, 0, "127.0.0.1", 4241, RUNNING, started_at=NOW - 75.0, last_output=NOW - 0.4,
              last_heartbeat=NOW - 3.24, cpu_percent=2.0, rss=98_000_000),
    RankState(2, 1, "node-b.example", None),
    RankState(3, 1, "node-b.example", 777, STOPPED, signal=signal.SIGTERM, started_at=NOW - 3700),
), root_cause="rank 1 on node 0 (127.0.0.1) exited with code 3")


def test_the_table_has_a_row_per_rank_in_aligned_columns() -> None:
    assert render_table(STATUS, NOW) == (
        "job job-7: stopping, 4 rank(s) on 2 node(s)\n"
        "root cause: rank 1 on node 0 (127.0.0.1) exited with code 3\n"
        "NODE  HOST            RANK   PID  STATE                        RUN TIME  LAST OUTPUT  HEARTBEAT  CPU %  RSS MB  RESTARTS\n"  # noqa: E501
        "0     127.0.0.1          0  4241  running                         1m15s  0.4s ago     3.2s ago     2.0    93.5         0\n"  # noqa: E501
        "0     127.0.0.1          1  4242  exit 3                          1m13s  2.5s ago     -           99.2   412.3         1\n"  # noqa: E501
        "1     node-b.example     2     -  starting                            -  -            -              -       -         0\n"  # noqa: E501
        "1     node-b.example     3   777  stopped (killed by SIGTERM)     1h01m  -            -              -       -         0\n"  # noqa: E501
    )


def test_the_status_round_trips_through_json() -> None:
    assert JobStatus.from_json(STATUS.to_json()) == STATUS


@pytest.mark.parametrize("text", ["{", "[]", '{"v": 2}', '{"v": 1, "job_id": "j"}',
                                  '{"v":1,"job_id":"j","phase":"x","taken_at":0,"ranks":[{"rank":0}]}'])
def test_a_bad_status_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        JobStatus.from_json(text)


def test_an_unknown_state_is_refused() -> None:
    with pytest.raises(ValueError, match="'lost' is not one of starting, running, exited, stopped"):
        RankState(0, 0, "h", state="lost")


@pytest.mark.parametrize(("seconds", "text"), [(0.04, "0.0s"), (3.24, "3.2s"), (59.9, "59.9s"), (60, "1m00s"),
                                               (723, "12m03s"), (18420, "5h07m"), (-1, "0.0s")])
def test_durations_read_easily(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_ages() -> None:
    assert format_age(None, NOW) == "-" and format_age(NOW - 3.2, NOW) == "3.2s ago"


def test_watch_redraws_in_place_only_on_a_terminal() -> None:
    assert watch_frame("table\n", tty=True) == CLEAR_AND_HOME + "table\n"
    assert watch_frame("table\n", tty=False) == "table\n\n"


def ev(kind: EventKind, t: float, rank: int | None = None, node: int = 0, **details: object) -> Event:
    return Event(t, "job-7", node, rank, kind, details)


def test_the_tracker_follows_a_failing_job_from_its_events() -> None:
    tracker = StatusTracker("job-7")
    tracker.observe(ev(EventKind.JOB_PLANNED, 0.0, layer="torchrun", nodes=1, ranks=2))
    for r in (0, 1):
        tracker.observe(ev(EventKind.RANK_REGISTERED, 1.0, r, host="127.0.0.1", pid=100 + r))
    assert tracker.snapshot(1.5).phase == "starting"
    assert [r.describe_state() for r in tracker.snapshot(1.5).ranks] == ["starting", "starting"]
    for r in (0, 1):
        tracker.observe(ev(EventKind.RANK_STARTED, 2.0, r, pid=200 + r))
    tracker.last_output[0] = 4.0
    tracker.last_heartbeat[1] = 4.5
    tracker.usage[1] = (97.5, 300 * 1024 * 1024)
    running = tracker.snapshot(5.0)
    assert running.phase == "running" and running.root_cause is None
    assert running.ranks == (
        RankState(0, 0, "127.0.0.1", 200, RUNNING, started_at=2.0, last_output=4.0),
        RankState(1, 0, "127.0.0.1", 201, RUNNING, started_at=2.0, last_heartbeat=4.5, cpu_percent=97.5,
                  rss=300 * 1024 * 1024),
    )
    tracker.observe(ev(EventKind.RANK_EXITED, 6.0, 1, code=3, signal=None, wall=5.9, stopped=False))
    tracker.observe(ev(EventKind.FAILURE, 6.0, 1, what="rank 1 exited with code 3", exit_code=3, at=5.9))
    tracker.observe(ev(EventKind.ROOT_CAUSE, 6.1, 1, what="rank 1 exited with code 3", exit_code=3, at=5.9))
    tracker.observe(ev(EventKind.STOP_REQUESTED, 6.1, reason="failure"))
    tracker.observe(ev(EventKind.RANK_STARTED, 6.2, 0, pid=200))  # late news must not undo "stopping"
    assert tracker.snapshot(6.3).phase == "stopping"
    tracker.observe(ev(EventKind.RANK_EXITED, 6.5, 0, code=None, signal=15, wall=6.4, stopped=True))
    tracker.observe(ev(EventKind.JOB_FINISHED, 7.0, exit_code=3, duration=7.0))
    done = tracker.snapshot(8.0)
    assert (done.phase, done.root_cause) == (JobPhase.FINISHED, "rank 1 exited with code 3")
    assert JobStatus.from_json(done.to_json()).phase == "finished" and '"phase":"finished"' in done.to_json()
    assert [r.describe_state() for r in done.ranks] == ["stopped (killed by SIGTERM)", "exit 3"]
    assert [(r.ended_at, r.cpu_percent) for r in done.ranks] == [(6.4, None), (5.9, None)]
    assert "root cause: rank 1 exited with code 3" in render_table(done, 8.0)


def test_a_restart_counts_for_every_rank_and_runs_again() -> None:
    tracker = StatusTracker("job-7")
    tracker.observe(ev(EventKind.RANK_REGISTERED, 1.0, 0, host="h", pid=1))
    tracker.observe(ev(EventKind.JOB_FINISHED, 2.0, exit_code=1, duration=1.0))
    tracker.observe(ev(EventKind.ATTEMPT_STARTED, 3.0, attempt=0))
    assert tracker.snapshot(3.0).ranks[0].restarts == 0
    tracker.observe(ev(EventKind.ATTEMPT_STARTED, 4.0, attempt=1))
    status = tracker.snapshot(4.0)
    assert status.phase == "running" and status.ranks[0].restarts == 1


def test_merge_puts_every_node_in_one_status() -> None:
    chief = JobStatus("job-7", "running", NOW, ranks=STATUS.ranks[2:])
    worker = JobStatus("job-7", "stopping", NOW, ranks=STATUS.ranks[:2], root_cause="x")
    merged = merge([chief, worker])
    assert merged.phase == "running" and merged.root_cause == "x"
    assert [r.rank for r in merged.ranks] == [0, 1, 2, 3]


def test_a_nodes_answer_joins_what_the_supervisor_knows_beyond_the_events() -> None:
    tracker = StatusTracker("job-7")
    tracker.observe(ev(EventKind.RANK_REGISTERED, 1.0, 0, host="h"))
    tracker.observe(ev(EventKind.RANK_STARTED, 1.5, 0, pid=100))
    answer = tracker.answer("h", {0: (4.0, 4.5)}, None, 2, now=5.0)
    assert (answer["host"], answer["phase"], answer["taken_at"], answer["root_cause"]) == ("h", "running", 5.0, None)
    (row,) = answer["ranks"]
    assert (row["rank"], row["pid"], row["state"], row["last_output"], row["last_heartbeat"], row["restarts"]) == (
        0, 100, RUNNING, 4.0, 4.5, 2)
    tracker.observe(ev(EventKind.ROOT_CAUSE, 6.0, 0, what="from the events", exit_code=3, at=5.9))
    assert tracker.answer("h", {}, None, 0, now=7.0)["root_cause"] == "from the events"
    assert tracker.answer("h", {}, "the verdict's", 0, now=7.0)["root_cause"] == "the verdict's"  # it knows best


def test_a_job_that_may_shrink_shows_its_size_beside_its_spares() -> None:
    import dataclasses

    shrunk = dataclasses.replace(STATUS, size="2 of 3 (--nnodes 2:3); the places of node(s) 2 are empty",
                                 spares=("node 3 (127.0.0.3) waiting",))
    lines = render_table(shrunk, NOW).splitlines()
    assert lines[2:4] == ["nodes: 2 of 3 (--nnodes 2:3); the places of node(s) 2 are empty",
                          "spares: node 3 (127.0.0.3) waiting"], lines
    assert JobStatus.from_json(shrunk.to_json()) == shrunk
