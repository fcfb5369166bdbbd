"""5. Scale on one node: 1, 4, 16, 64 ranks of a trivial script that does not import torch.

Each rank writes its start time, waits at a barrier (a file the bench creates once every
rank started and memory was sampled), writes the time it exits, and exits 0.
- all started: from the launch to the last rank's start;
- teardown: from the last rank's exit to the exit code seen and every process gone;
- memory of detlaunch's own processes (the supervisor and every rank wrapper) while all
  ranks run: RSS summed, and PSS summed (shared pages divided among the processes sharing
  them, so the sum is what the processes really cost together).
Linear growth: a least-squares line through (ranks, value), and its worst relative miss.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from .common import SCRIPTS, Goal, NotAvailable, Panel, Section, Stat, Table, interleaved, live_descendants, run, say
from .launchers import bare_torchrun, detlaunch_torchrun

RANK = str(SCRIPTS / "rank.py")
LAUNCHERS = {"detlaunch --layer torchrun": detlaunch_torchrun, "bare torchrun": bare_torchrun}


def own_memory() -> tuple[float, float, int]:
    """(RSS MB, PSS MB, process count) of detlaunch's own processes: the supervisor and the rank wrappers."""
    rss = pss = 0
    count = 0
    for p in live_descendants():
        try:
            cmdline = p.cmdline()
            ours = any(a.endswith("/detlaunch") for a in cmdline[:2]) or (
                len(cmdline) > 2 and cmdline[2].endswith("run_wrapper.py"))
            if ours:
                info = p.memory_full_info()
                rss += info.rss
                pss += info.pss
                count += 1
        except psutil.NoSuchProcess:
            pass
    return rss / 2**20, pss / 2**20, count


class Barrier:
    """The tick of one run: once all ranks started, sample memory (detlaunch only), then let them go."""

    def __init__(self, job: Path, ranks: int, sample: bool):
        self.job, self.ranks, self.sample = job, ranks, sample
        self.memory: tuple[float, float, int] | None = None
        self.released = False

    def __call__(self) -> None:
        if self.released:
            return
        if sum(n.startswith("started-") and not n.endswith(".tmp") for n in os.listdir(self.job)) < self.ranks:
            return
        if self.sample:
            self.memory = own_memory()
        (self.job / "go").touch()
        self.released = True


def times(job: Path, prefix: str) -> list[float]:
    return [float(p.read_text()) for p in job.glob(f"{prefix}-*") if not p.name.endswith(".tmp")]


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """(slope, intercept, worst |residual| / value) of the least-squares line."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    intercept = my - slope * mx
    worst = max(abs(y - (intercept + slope * x)) / y for x, y in zip(xs, ys, strict=True))
    return slope, intercept, worst


def main(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    sizes = [1, 4, 16, 64]
    cases = [(name, n) for n in sizes for name in LAUNCHERS]
    started: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
    teardown: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
    rss: dict[int, list[float]] = {n: [] for n in sizes}
    pss: dict[int, list[float]] = {n: [] for n in sizes}
    counts: dict[int, int] = {}
    labels = [f"{name}|{n}" for name, n in cases]
    for rep, label in interleaved(reps, labels):
        name, n = label.split("|")[0], int(label.split("|")[1])
        say(f"scale: {name}, {n} ranks ({rep + 1}/{reps})")
        job = tmp / f"scale-{'dl' if name.startswith('detlaunch') else 'bare'}-{n}-{rep}"
        job.mkdir()
        try:
            argv = LAUNCHERS[name](n, [RANK, "barrier", str(job)], job, env)
        except NotAvailable as e:
            raise RuntimeError(f"scale needs {name}: {e}") from None
        barrier = Barrier(job, n, sample=name.startswith("detlaunch"))
        r = run(argv, env, timeout=300, tick=barrier).check(0)
        started[(name, n)].append(max(times(job, "started")) - r.start)
        teardown[(name, n)].append(r.end - max(times(job, "exit")))
        if barrier.memory:
            rss[n].append(barrier.memory[0])
            pss[n].append(barrier.memory[1])
            counts[n] = barrier.memory[2]

    rows = []
    for n in sizes:
        for name in LAUNCHERS:
            own = (f"{Stat(rss[n]).fmt('MB', 1)} / {Stat(pss[n]).fmt('MB', 1)} ({counts.get(n, 0)} processes)"
                   if name.startswith("detlaunch") else "")
            rows.append([str(n), name, Stat(started[(name, n)]).fmt(), Stat(teardown[(name, n)]).fmt("s", 3), own])
    ours = "detlaunch --layer torchrun"
    notes = ["median (min-max); RSS and PSS of the detlaunch supervisor + every rank wrapper, sampled once all "
             "ranks run"]
    goals = []
    for what, series, unit in (("RSS of detlaunch's processes", [Stat(rss[n]).median for n in sizes], "MB"),
                               ("PSS of detlaunch's processes", [Stat(pss[n]).median for n in sizes], "MB"),
                               ("time to all ranks started", [Stat(started[(ours, n)]).median for n in sizes], "s")):
        slope, intercept, worst = linear_fit([float(n) for n in sizes], series)
        notes.append(f"{what}: {intercept:.2f} {unit} + {slope:.3f} {unit} per rank; "
                     f"worst miss of that line {worst:.0%}")
        if unit == "MB":
            goals.append(Goal(f"scale to 64 ranks: {what} linear", "linear (line misses <= 10%)",
                              f"{slope:.2f} MB/rank, worst miss {worst:.0%}", worst <= 0.10))
    table = Table("Scale on one node: N ranks of a trivial script (no torch in the ranks)",
                  ["ranks", "launcher", "launch -> all ranks started", "last rank exit -> all gone",
                   "detlaunch's own memory: RSS / PSS"], rows, notes)
    x = [float(n) for n in sizes]
    panels = [
        Panel("Scale: launch -> all ranks started", "seconds", list(LAUNCHERS), [], x=x,
              series={name: [Stat(started[(name, n)]) for n in sizes] for name in LAUNCHERS}),
        Panel("Scale: memory of detlaunch's supervisor + wrappers", "MB", ["RSS sum", "PSS sum"], [], x=x,
              series={"RSS sum": [Stat(rss[n]) for n in sizes], "PSS sum": [Stat(pss[n]) for n in sizes]}),
    ]
    return Section("scale", [table], panels, goals)
