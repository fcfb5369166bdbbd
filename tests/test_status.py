"""The status snapshot: JSON that round-trips, and a table a person can read."""

from __future__ import annotations

import signal

import pytest
from detlaunch.status import (
    CLEAR_AND_HOME,
    EXITED,
    RUNNING,
    STOPPED,
    JobStatus,
    RankState,
    format_age,
    format_duration,
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
