"""Event logs of a job that never ran, for the page's tests and bench/story.py: any number of ranks, three
attempts, with what a page must show (a root cause, a lost node and the spare in its place, a straggler, a hang).

    attempt 1: rank 5 exits 3 with a traceback; the others are stopped (SIGTERM, exit 143)
    attempt 2: node 1 is lost (its ranks never report); the others are stopped; a spare joins as node 1
    attempt 3: rank 2 is a straggler; no progress for 30 s: the hang, the stacks, every rank SIGKILLed -> exit 124

Each node's events go to its own log, as the supervisors write them (events.jsonl, events-node-N.jsonl).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from detlaunch.observe.events import SCHEMA_VERSION, Event, EventKind

K = EventKind
T0 = 1_764_000_000.0
TRACEBACK = ["Traceback (most recent call last):", '  File "train.py", line 12, in <module>',
             "    step(batch)", "ValueError: the loss is nan"]


def simulated_job(ranks: int, per_node: int = 8, job: str = "sim-job") -> dict[int, list[str]]:
    """node -> its log's lines, for a job of `ranks` ranks, `per_node` a node (the last node may have fewer)."""
    nodes = max(1, -(-ranks // per_node))
    logs: dict[int, list[str]] = {n: [] for n in range(nodes)}

    def emit(t: float, node: int, rank: int | None, event_kind: EventKind, into: int | None = None,
             **details: Any) -> None:
        """An event about `node`, in the log of node `into` (the chief's log says when a worker joined)."""
        logs[node if into is None else into].append(Event(T0 + t, job, node, rank, event_kind, details).to_json_line())

    def host(node: int, spare: bool = False) -> str:
        return f"10.0.{node // 250}.{node % 250 + 1}" if not spare else f"10.9.0.{node % 250 + 1}"

    for n in range(nodes):
        emit(0.0, n, None, K.JOB_PLANNED, layer="direct", nodes=nodes, ranks=ranks)
        if n:
            emit(0.2 + n * 0.001, n, None, K.NODE_JOINED, into=0, host=host(n))
    start = 1.0
    lost = 1 if nodes > 1 else None
    for attempt in range(3):
        for n in range(nodes):
            emit(start, n, None, K.ATTEMPT_STARTED, attempt=attempt)
            emit(start + 0.05, n, None, K.LAUNCHER_STARTED, name="python", pid=100 + n)
        for r in range(ranks):
            n = r // per_node
            t = start + 0.1 + (r % per_node) * 0.01 + (5.0 if attempt == 2 and r == 2 else 0.0)
            spare = attempt == 2 and n == lost
            emit(t, n, r, K.RANK_REGISTERED, host=host(n, spare), pid=1000 + r)
            emit(t + 0.5, n, r, K.RANK_STARTED, pid=2000 + r)
        end = start + 20.0
        if attempt == 0:
            cause = min(5, ranks - 1)
            what = f"rank {cause} on node {cause // per_node} ({host(cause // per_node)}) exited with code 3"
            emit(end, cause // per_node, cause, K.RANK_EXITED, code=3, signal=None, wall=T0 + end, stopped=False)
            emit(end + 0.01, cause // per_node, cause, K.FAILURE, what=what, exit_code=3, at=T0 + end)
            if cause // per_node:
                emit(end + 0.02, 0, cause, K.FAILURE, what=what, exit_code=3, at=T0 + end)
            stopped, code = [r for r in range(ranks) if r != cause], 3
        elif attempt == 1 and lost is not None:
            emit(end, lost, None, K.NODE_LOST, into=0, host=host(lost), reason="no heartbeat for 10.0 s")
            what = f"node {lost} ({host(lost)}) was lost: no heartbeat for 10.0 s"
            emit(end + 0.01, 0, None, K.FAILURE, what=what, exit_code=1, at=T0 + end)
            stopped, code = [r for r in range(ranks) if r // per_node != lost], 1
        else:
            emit(end + 1.0, 0, None, K.HANG_DETECTED, silent_for=30.0)
            what = "the job hung: no rank showed progress for 30.0 s (--hang-timeout)"
            emit(end + 1.01, 0, None, K.FAILURE, what=what, exit_code=124, at=T0 + end + 1.0)
            stopped, code = list(range(ranks)), 124
        if attempt == 2:
            logs[0].append(json.dumps({"v": SCHEMA_VERSION, "time": T0 + start + 8, "job": job, "node": 0,
                                       "rank": 2, "kind": "straggler", "details": {"section": "step", "ratio": 2.1}}))
        for n in range(nodes):
            emit(end + 1.1, n, None, K.STOP_REQUESTED, reason="failure" if n == 0 else "chief")
        for r in stopped:
            wall = end + 1.3 + (r % 7) * 0.01
            if code == 124:
                emit(wall, r // per_node, r, K.RANK_EXITED, code=None, signal=9, wall=T0 + wall, stopped=True)
            else:
                emit(wall, r // per_node, r, K.RANK_EXITED, code=143, signal=None, wall=T0 + wall, stopped=True)
        finish = end + 2.0
        for n in range(nodes):
            if attempt == 1 and n == lost:
                continue
            if attempt < 2:
                details: dict[str, Any] = {}
                if n == 0:
                    cls = "rank-failed" if attempt == 0 else "node-lost"
                    sig = "exit 3: ValueError: the loss is nan" if attempt == 0 else "exit 1"
                    details = {"class": cls, "what": what, "signature": sig, "exception": "",
                               "next": f"restart {attempt + 1} of 2 in 1.0 s"}
                emit(finish, n, None, K.ATTEMPT_ENDED, attempt=attempt, exit_code=code, **details)
        if attempt == 1 and lost is not None:
            emit(finish + 0.5, lost, None, K.NODE_JOINED, into=0, host=host(lost, spare=True))
        start = finish + 1.0
    end = start - 1.0
    for n in range(nodes):
        details = {"class": "hang", "what": what, "signature": "killed by SIGKILL", "exception": "",
                   "next": "restart budget spent (2 of 2): not restarting"} if n == 0 else {}
        emit(end + 0.1, n, None, K.ATTEMPT_ENDED, attempt=2, exit_code=124, **details)
        stacks = [f"{ranks - 1} rank(s) {0}-{ranks - 1}: in all_reduce (train.py:40)"] if n == 0 else []
        emit(end + 0.2, n, None, K.ROOT_CAUSE, what=what, exit_code=124, at=T0 + end - 1.0, failure_kind="hang",
             tail=stacks, tail_of="", **({"stacks": stacks} if stacks else {}))
        emit(end + 0.3, n, None, K.JOB_FINISHED, exit_code=124, duration=end + 0.3)
    return logs


def write_logs(folder: Path, logs: dict[int, list[str]]) -> list[Path]:
    """The logs as a --log-dir holds them; their paths, the chief's first."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for node, lines in sorted(logs.items()):
        path = folder / ("events.jsonl" if node == 0 else f"events-node-{node}.jsonl")
        path.write_text("".join(line + "\n" for line in lines))
        paths.append(path)
    return paths
