"""A job's story as a Chrome/Perfetto trace (`detlaunch report --format trace`): for people who already look at
traces in Perfetto (ui.perfetto.dev) or chrome://tracing. Pure.

The Trace Event Format's JSON object form: each node a process (pid = node + 1, named with its host), each
rank a thread (tid = rank + 1) with one complete event ("X") per attempt, named in status's words; the
attempts, backoffs and hang windows on a "job" process of their own (pid 0); marks as instant events ("i")
on their rank's thread or their node. Times are microseconds from the job's first event.
"""

from __future__ import annotations

import json
from typing import Any

from detlaunch.observe.story_model import Story

JOB_PID = 0


def render(story: Story) -> str:
    def us(t: float) -> float:
        return round((t - story.start) * 1e6, 1)

    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": JOB_PID, "tid": 0, "args": {"name": f"job {story.job_id}"}},
        {"ph": "M", "name": "process_sort_index", "pid": JOB_PID, "tid": 0, "args": {"sort_index": -1}}]
    for node in sorted(story.nodes.values(), key=lambda n: n.node):
        name = f"node {node.node}" + (f" ({node.host})" if node.host else "")
        events.append({"ph": "M", "name": "process_name", "pid": node.node + 1, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": node.node + 1, "tid": 0,
                       "args": {"sort_index": node.node}})
    for w in [*story.attempts, *story.windows]:
        events.append({"ph": "X", "name": w.text, "cat": w.kind, "pid": JOB_PID, "tid": 0, "ts": us(w.start),
                       "dur": round((w.end - w.start) * 1e6, 1)})
    for rank, spans in sorted(story.spans.items()):
        pid = spans[-1].node + 1
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": rank + 1, "args": {"name": f"rank {rank}"}})
        for s in spans:
            start = s.start if s.start is not None else story.start
            end = story.end_of(s)
            args = {"state": s.words, "attempt": s.attempt, "pid": s.state.pid,
                    "report": (s.status.describe() if s.status else "no end in the log") + s.note}
            events.append({"ph": "X", "name": f"attempt {s.attempt}: {s.words}", "cat": s.outcome + (
                ",cause" if s.cause else ""), "pid": pid, "tid": rank + 1, "ts": us(start),
                "dur": round(max(end - start, 0.0) * 1e6, 1), "args": args})
    for m in story.marks:
        if m.rank is not None and m.rank in story.spans:
            where = {"pid": story.spans[m.rank][-1].node + 1, "tid": m.rank + 1, "s": "t"}
        else:
            where = {"pid": m.node + 1, "tid": 0, "s": "p"}
        events.append({"ph": "i", "name": m.text, "cat": m.kind, "ts": us(m.time), **where})
    other = {"job": story.job_id, "layer": story.layer, "verdict": story.verdict, "report": story.report}
    if story.problems:
        other["problems"] = story.problems
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": other},
                      separators=(",", ":")) + "\n"
