"""Failure teardown on 32 real nodes: 32 `detlaunch --layer direct` on 127.0.0.1-127.0.0.32, one rank each
(bench/scripts/rank.py, no torch); once all 32 ranks started, the last node's rank exits 3. Two cases,
interleaved: the default (every node takes its running rank's stack before it stops it, within --dump-budget,
1.5 s; the chief gathers the 31 stacks for its report), and --dump-budget 0 (stopped at once, no stacks).

    python -m bench --only teardown-nodes --reps 3

Timed from the moment the failing rank calls exit (it writes CLOCK_MONOTONIC just before) to every
node's detlaunch exited (each exit timed as it is reaped, bench/scripts/nodes.py), and to every process
of the job gone (common.run). Every node must exit 3, and by default the chief's report must show the 31
running ranks' stacks; the 1-min load average is taken before each run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .common import SCRIPTS, Goal, Panel, Section, Stat, Table, interleaved, run, say
from .teardown import on_nodes

RANK = str(SCRIPTS / "rank.py")
NODES = 32
TIMEOUT = 240.0  # 32 detlaunch processes starting on 2 shared cores
CASES = {"default (stacks first)": [], "--dump-budget 0": ["--dump-budget", "0"]}


def once(job: Path, env: dict[str, str], options: list[str]) -> tuple[float, float, float]:
    """(failing rank's exit -> the first node exited, -> every node exited, -> every process gone), seconds."""
    job.mkdir()
    argv = on_nodes("direct", NODES)(NODES, [*options, RANK, "fail", str(job), str(NODES)], job, env)
    r = run(argv, env, timeout=TIMEOUT)
    if r.leaked:
        raise RuntimeError(f"32 nodes left processes behind: {r.leaked}")
    if r.code is None or not (job / "exit-time").exists():
        raise RuntimeError(f"32 nodes: timed out or the failing rank never ran (exit {r.code}):\n{r.stderr[-3000:]}")
    nodes = json.loads((job / "node-exits").read_text())
    if set(nodes["codes"]) != {3}:
        raise RuntimeError(f"32 nodes: exit codes {nodes['codes']}, every node should exit 3:\n{r.stderr[-3000:]}")
    dumped = f"detlaunch:   ranks 0-{NODES - 2} (nodes 0-{NODES - 2}): "  # the chief's report: every survivor's stack
    if "--dump-budget" not in options and dumped not in r.stderr:
        raise RuntimeError(f"32 nodes: the report shows no stack of the running ranks:\n{r.stderr[-3000:]}")
    failed_at = float((job / "exit-time").read_text())
    return min(nodes["exits"]) - failed_at, max(nodes["exits"]) - failed_at, r.end - failed_at


def main(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    first: dict[str, list[float]] = {name: [] for name in CASES}
    every: dict[str, list[float]] = {name: [] for name in CASES}
    gone: dict[str, list[float]] = {name: [] for name in CASES}
    load: list[float] = []
    for rep, name in interleaved(reps, list(CASES)):
        say(f"teardown-nodes: {NODES} nodes, {name} ({rep + 1}/{reps})")
        load.append(os.getloadavg()[0])
        a, b, c = once(tmp / f"teardown-nodes-{rep}-{len(CASES[name])}", env, CASES[name])
        first[name].append(a)
        every[name].append(b)
        gone[name].append(c)
        say(f"  first node exited {a:.3f} s, every node {b:.3f} s, every process gone {c:.3f} s after the rank's exit")
    rows = [[name, Stat(first[name]).fmt("s", 3), Stat(every[name]).fmt("s", 3), Stat(gone[name]).fmt("s", 3)]
            for name in CASES]
    table = Table(f"Failure teardown on {NODES} real nodes (detlaunch --layer direct, one rank each)",
                  ["case", "failing rank's exit -> first node exited", "-> every node exited",
                   "-> every process gone"], rows,
                  [f"median (min-max) of {reps} runs; 1-min load average before each run: "
                   f"{', '.join(f'{x:.1f}' for x in load)} (2 cores)"])
    goals = [Goal(f"{NODES} real nodes, {name}: failing rank's exit -> every node exited", "<= 1 s",
                  Stat(every[name]).fmt("s", 3), Stat(every[name]).median <= 1.0) for name in CASES]
    panel = Panel(f"Failure teardown, {NODES} nodes: to every node exited", "seconds", list(CASES),
                  [Stat(every[name]) for name in CASES], goal=1.0)
    return Section("teardown-nodes", [table], [panel], goals)
