"""Stragglers (issue 27): `detlaunch.section()`'s cost, how fast a slow rank is named, how often a balanced one is.

    python -m bench.stragglers [--quick]

1. `detlaunch.section(name)` per call (a `with` block around nothing), in a fresh Python: under
   detlaunch (a progress file named in DETLAUNCH_PROGRESS_FILE) and without it; `detlaunch.progress()`
   beside it for scale. Best of 5 runs of a loop, in CPU time (process_time: on a shared machine, wall time
   is mostly other processes' turn). Goal: <= 5 us a call. Its share of a step
   follows: at 100 ms a step, 5 us is 0.005 %.
2. Steps from the slowdown to the report: the chief's judge (observe/stragglers.py) fed synthetic
   figures of N ranks (per-call times with 5 % noise), one rank 2x / 1.5x slower from step 100, the
   chief reading once a step and once every 5 steps (a 1 s poll over 0.2 s steps).
3. False positives: balanced jobs of 1000 steps, N ranks, 20 % uniform noise, --seeds seeds: ranks
   named. Goal: 0.

Part of `python -m bench` (`--only stragglers`) and standalone. (2) and (3) are the judge alone, in
this process: the job tests (tests/node/test_stragglers_job.py) check the same on real ranks.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from detlaunch.observe.stragglers import StragglerDetector

from .common import Goal, Section, Table, say

TIMING = """
import os, sys, time
import detlaunch
from detlaunch.rank.progress import create_progress_file
if sys.argv[1] == "on":
    os.environ["DETLAUNCH_PROGRESS_FILE"] = create_progress_file(sys.argv[3], 0)
n, best = int(sys.argv[2]), []
what = sys.argv[4]
section, progress = detlaunch.section, detlaunch.progress
for _ in range(5):
    t = time.process_time()
    if what == "section":
        for _ in range(n):
            with section("step"):
                pass
    else:
        for i in range(n):
            progress(i)
    best.append((time.process_time() - t) / n)
print(min(best) * 1e6)
"""


def call_cost(what: str, under: bool, calls: int, env: dict[str, str]) -> float:
    """Microseconds a call of `what` ("section" or "progress") takes, with or without detlaunch."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", TIMING, "on" if under else "off", str(calls), tmp, what],
                             env={k: v for k, v in env.items() if k != "DETLAUNCH_PROGRESS_FILE"},
                             capture_output=True, text=True, check=True, timeout=300)
    return float(out.stdout)


def steps_to_report(ranks: int, slower: float, every: int, seed: int = 0) -> int | None:
    """Steps from the slowdown (step 100) to the judge's report of the slow rank; None: never (in 400 steps)."""
    rng, judge = random.Random(seed), StragglerDetector()
    totals = [0.0] * ranks
    for step in range(500):
        for r in range(ranks):
            totals[r] += 0.1 * rng.uniform(0.95, 1.05) * (slower if r == 1 and step >= 100 else 1.0)
        if step % every == every - 1:
            found = judge.update({(r, 0): {"step": (step + 1, totals[r])} for r in range(ranks)}, {})
            if any(f.rank == 1 for f in found):
                return step - 100 + 1
    return None


def false_positives(ranks: int, seeds: int, every: int = 1) -> int:
    """Ranks named over `seeds` balanced jobs of 1000 steps (20 % uniform noise a call)."""
    named = 0
    for seed in range(seeds):
        rng, judge = random.Random(seed), StragglerDetector()
        totals = [0.0] * ranks
        for step in range(1000):
            for r in range(ranks):
                totals[r] += 0.1 * rng.uniform(0.8, 1.2)
            if step % every == every - 1:
                named += len(judge.update({(r, 0): {"step": (step + 1, totals[r])} for r in range(ranks)}, {}))
    return named


def measure(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    """`python -m bench --only stragglers`."""
    calls, seeds = (50_000, 5) if quick else (200_000, 30)
    rows, goals = [], []
    say("stragglers: section() and progress() per call")
    cost = {(what, under): call_cost(what, under, calls, env) for what in ("section", "progress")
            for under in (True, False)}
    for (what, under), us in cost.items():
        rows.append([f"detlaunch.{what}() a call, {'under detlaunch' if under else 'without detlaunch'}",
                     f"{us:.2f} us"])
    goals.append(Goal("detlaunch.section() a call, under detlaunch", "<= 5 us", f"{cost[('section', True)]:.2f} us",
                      cost[("section", True)] <= 5.0))
    say("stragglers: steps to the report, false positives (the judge alone)")
    worst = 0
    for ranks in (4, 16, 64):
        for slower in (2.0, 1.5):
            for every in (1, 5):
                steps = steps_to_report(ranks, slower, every)
                worst = max(worst, steps if steps is not None else 10**6)
                rows.append([f"{ranks} ranks, one {slower:g}x slower, read every {every} step(s): steps to the report",
                             "never" if steps is None else str(steps)])
    goals.append(Goal("steps from a slowdown to the report (read every 5 steps)", "<= 20", str(worst), worst <= 20))
    fp = sum(false_positives(ranks, seeds) for ranks in (2, 4, 16))
    rows.append([f"false positives, {seeds} balanced jobs x 1000 steps at 2, 4 and 16 ranks (20 % noise)", str(fp)])
    goals.append(Goal("false positives over 1000 balanced steps", "0", str(fp), fp == 0))
    notes = ["section()/progress(): best of 5 runs of a loop in a fresh Python, CPU time; the judge: synthetic "
             "figures in this process (the job tests check the same on real ranks)"]
    return Section("stragglers", [Table("Stragglers: section() cost, detection, false positives",
                                        ["measurement", "result"], rows, notes)], [], goals)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stragglers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        section = measure(dict(os.environ), 1, args.quick, Path(tmp))
    for table in section.tables:
        for what, result in table.rows:
            print(f"{what}: {result}")
    for goal in section.goals:
        print(f"goal: {goal.what} {goal.target}: {goal.measured} ({'met' if goal.met else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
