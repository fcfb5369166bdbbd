"""Failure teardown on 32 real nodes: 32 `detlaunch --layer direct` on 127.0.0.1-127.0.0.32, one rank each
(bench/scripts/rank.py, no torch); once all 32 ranks started, the last node's rank exits 3.

    python -m bench --only teardown-nodes --reps 3

Timed from the moment the failing rank calls exit (it writes CLOCK_MONOTONIC just before) to every
node's detlaunch exited (each exit timed as it is reaped, bench/scripts/nodes.py), and to every process
of the job gone (common.run). Every node must exit 3; the 1-min load average is taken before each run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .common import SCRIPTS, Goal, Panel, Section, Stat, Table, run, say
from .teardown import on_nodes

RANK = str(SCRIPTS / "rank.py")
NODES = 32
TIMEOUT = 240.0  # 32 detlaunch processes starting on 2 shared cores


def once(job: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """(failing rank's exit -> the first node exited, -> every node exited, -> every process gone), seconds."""
    job.mkdir()
    argv = on_nodes("direct", NODES)(NODES, [RANK, "fail", str(job), str(NODES)], job, env)
    r = run(argv, env, timeout=TIMEOUT)
    if r.leaked:
        raise RuntimeError(f"32 nodes left processes behind: {r.leaked}")
    if r.code is None or not (job / "exit-time").exists():
        raise RuntimeError(f"32 nodes: timed out or the failing rank never ran (exit {r.code}):\n{r.stderr[-3000:]}")
    nodes = json.loads((job / "node-exits").read_text())
    if set(nodes["codes"]) != {3}:
        raise RuntimeError(f"32 nodes: exit codes {nodes['codes']}, every node should exit 3:\n{r.stderr[-3000:]}")
    failed_at = float((job / "exit-time").read_text())
    return min(nodes["exits"]) - failed_at, max(nodes["exits"]) - failed_at, r.end - failed_at


def main(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    first: list[float] = []
    every: list[float] = []
    gone: list[float] = []
    load: list[float] = []
    for rep in range(reps):
        say(f"teardown-nodes: {NODES} nodes ({rep + 1}/{reps})")
        load.append(os.getloadavg()[0])
        a, b, c = once(tmp / f"teardown-nodes-{rep}", env)
        first.append(a)
        every.append(b)
        gone.append(c)
        say(f"  first node exited {a:.3f} s, every node {b:.3f} s, every process gone {c:.3f} s after the rank's exit")
    table = Table(f"Failure teardown on {NODES} real nodes (detlaunch --layer direct, one rank each)",
                  ["from the failing rank's exit to", "median (min-max)"],
                  [["the first node's detlaunch exited", Stat(first).fmt("s", 3)],
                   ["every node's detlaunch exited", Stat(every).fmt("s", 3)],
                   ["every process of the job gone", Stat(gone).fmt("s", 3)]],
                  [f"{reps} runs; 1-min load average before each: {', '.join(f'{x:.1f}' for x in load)} (2 cores)"])
    every_stat = Stat(every)
    goal = Goal(f"{NODES} real nodes: failing rank's exit -> every node exited", "<= 1 s", every_stat.fmt("s", 3),
                every_stat.median <= 1.0)
    panel = Panel(f"Failure teardown, {NODES} nodes", "seconds", ["first node exited", "every node exited",
                                                                 "every process gone"],
                  [Stat(first), every_stat, Stat(gone)], goal=1.0)
    return Section("teardown-nodes", [table], [panel], [goal])
