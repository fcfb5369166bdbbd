"""The details a job's page needs that its events did not carry: written by the supervisor, optional in a line.

A page is built from the event log alone (`detlaunch report`, long after the job), so what the end report
printed must be in the log for the page to say it in the same words: the root cause's own lines and the
stacks (`root_cause`), and how a rank's end came about when detlaunch ended it (`rank_exited`, whose details
are all made here). Each is a detail a reader may ignore (docs/EVENTS.md: new details keep the schema version);
the attempts' class and cause come from restarts/attempts.py, which owns them (`Attempts.ended_event`).
"""

from __future__ import annotations

from typing import Any

from detlaunch.outcome import JobResult, RankStatus


def rank_exited(status: RankStatus) -> dict[str, Any]:
    """The details of a rank's `rank_exited` event: its end (a signal's: no code), and `killed`, `lost`, `ended` and
    `teardown_signal`, each only when it is so."""
    extra: dict[str, Any] = {"code": None if status.signal else status.exit_code, "signal": status.signal,
                             "wall": status.wall, "stopped": status.stopped}
    if status.killed:
        extra["killed"] = True
    if status.lost:
        extra["lost"] = True
    if status.ended:
        extra["ended"] = status.ended
    if status.teardown_signal:
        extra["teardown_signal"] = status.teardown_signal
    return extra


def root_cause(result: JobResult) -> dict[str, Any]:
    """What the report shows under the root cause: its kind, its last output lines and whose they are, and the
    other ranks' stacks when they were taken."""
    f = result.failure
    if f is None:
        return {}
    extra: dict[str, Any] = {"failure_kind": f.kind.value, "tail": list(f.tail), "tail_of": f.tail_of}
    if result.stacks:
        extra["stacks"] = list(result.stacks)
    return extra
