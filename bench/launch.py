"""4. Launch overhead: each launcher runs 2 ranks of a trivial script (prints a line, exits 0).

Time from start until the exit code is observed and every process is gone; detlaunch's
layers as a ratio to the launcher they wrap. The ratio is the median of each repetition's own ratio
(the two run within seconds of each other in it): on a shared machine the launchers' times swing by
+-0.3 s from one minute to the next, more than the overhead measured, and a ratio of two medians
moves with that swing.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from .common import SCRIPTS, Goal, NotAvailable, Panel, Section, Stat, Table, interleaved, run, say
from .launchers import LAUNCHERS, PAIRS

RANK = str(SCRIPTS / "rank.py")
RANKS = 2


def main(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    samples: dict[str, list[float]] = {name: [] for name in LAUNCHERS}
    by_rep: dict[str, dict[int, float]] = {name: {} for name in LAUNCHERS}
    missing: dict[str, str] = {}
    for rep, name in interleaved(reps, list(LAUNCHERS)):
        if name in missing:
            continue
        say(f"launch: {name} ({rep + 1}/{reps})")
        job = tmp / f"launch-{re.sub(r'[^a-z0-9]+', '-', name.lower())}-{rep}"
        job.mkdir()
        try:
            argv = LAUNCHERS[name](RANKS, [RANK, "trivial"], job, env)
        except NotAvailable as e:
            missing[name] = str(e)
            continue
        duration = run(argv, env, timeout=120).check(0).duration
        samples[name].append(duration)
        by_rep[name][rep] = duration

    stats = {name: Stat(s) for name, s in samples.items() if s}
    rows, goals = [], []
    for name in LAUNCHERS:
        if name in missing:
            rows.append([name, f"n/a ({missing[name]})", ""])
            if name in PAIRS:
                goals.append(Goal(f"launch overhead, {name}", f"<= 1.10x {PAIRS[name]}", "n/a", None))
            continue
        bare = PAIRS.get(name)
        ratio = ""
        if bare in stats:
            paired = [by_rep[name][rep] / by_rep[bare][rep] for rep in by_rep[name] if rep in by_rep[bare]]
            r = statistics.median(paired)
            ratio = f"{r:.2f}x {bare} ({min(paired):.2f}-{max(paired):.2f})"
            goals.append(Goal(f"launch overhead, {name}", f"<= 1.10x {bare}", f"{r:.2f}x", r <= 1.10))
        elif bare:
            ratio = f"n/a ({bare}: {missing.get(bare, 'not measured')})"
        rows.append([name, stats[name].fmt(), ratio])
    table = Table(f"Launch overhead: {RANKS} ranks of a trivial script, start -> every process gone",
                  ["launcher", "time", "ratio"], rows,
                  ["median (min-max); ratio: the median of each repetition's own ratio (min-max)"])
    labels = [n.replace("detlaunch --layer ", "detlaunch ") for n in stats]
    panel = Panel("Launch overhead, trivial script (lower is better)", "seconds", labels, list(stats.values()))
    return Section("launch", [table], [panel], goals)
