"""Crash stop of PyTorch's DDP tutorial script: one rank calls os._exit(3) at epoch 2, the others die by themselves.

bench/scripts/ddp_tutorial.py is the tutorial's multinode.py on CPU (gloo); rank 1 (of 2) exits 3 at the start
of epoch 2, while rank 0 is in a collective of its first step: gloo fails it ("Connection reset by peer"), the
script raises, and the rank aborts at exit (SIGABRT). Issue 23 found detlaunch's dump before kill waiting its
whole budget for that dying rank's stack. Timed from the failing rank's os._exit (it writes CLOCK_MONOTONIC just
before) to the exit code seen and every process gone; bare torchrun, detlaunch with the default --dump-budget
(1.5 s) and with --dump-budget 0, on one node (2 ranks) and on two loopback nodes (1 rank each, node 1's fails).

    python -m bench --only teardown-tutorial --reps 3
"""

from __future__ import annotations

import re
from pathlib import Path

from .common import SCRIPTS, Goal, Panel, Section, Stat, Table, interleaved, run, say
from .launchers import Launcher, bare_torchrun, detlaunch_torchrun
from .teardown import on_nodes

SCRIPT = str(SCRIPTS / "ddp_tutorial.py")
TIMEOUT = 120.0


def with_options(launcher: Launcher, *options: str) -> Launcher:
    """`launcher` with detlaunch options in front of the script."""
    return lambda n, script, job, env: launcher(n, [*options, *script], job, env)


DEFAULT, AT_ONCE = "detlaunch --layer torchrun", "detlaunch --layer torchrun --dump-budget 0"
CASES: dict[str, tuple[Launcher, bool]] = {  # name: (launcher, on two nodes)
    "bare torchrun": (bare_torchrun, False),
    DEFAULT: (detlaunch_torchrun, False),
    AT_ONCE: (with_options(detlaunch_torchrun, "--dump-budget", "0"), False),
    f"{DEFAULT}, 2 nodes": (on_nodes("torchrun"), True),
    f"{AT_ONCE}, 2 nodes": (with_options(on_nodes("torchrun"), "--dump-budget", "0"), True),
}


def once(name: str, job: Path, env: dict[str, str]) -> tuple[float, int, str]:
    """(seconds from the failing rank's exit to the end of the job, its exit code, the report's lines on rank 0)."""
    job.mkdir()
    launcher, two_nodes = CASES[name]
    script = [SCRIPT, "5", "1", "--snapshot", str(job / "snapshot.pt"), "--fail-rank", "1", "--fail-epoch", "2",
              "--exit-time", str(job / "exit-time")]
    r = run(launcher(1 if two_nodes else 2, script, job, env), env, timeout=TIMEOUT)
    if r.leaked:
        raise RuntimeError(f"{name} left processes behind: {r.leaked}")
    exit_time = job / "exit-time"
    if r.code is None or not exit_time.exists():
        raise RuntimeError(f"{name}: timed out or the failing rank never failed (exit {r.code}):\n{r.stderr[-3000:]}")
    rank0 = [line for line in r.stderr.splitlines() if re.match(r"detlaunch:   (rank|ranks) 0\b", line)]
    return r.end - float(exit_time.read_text()), r.code, " / ".join(rank0)


def main(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    codes: dict[str, set[int]] = {name: set() for name in CASES}
    for rep, name in interleaved(reps, list(CASES)):
        say(f"teardown-tutorial: {name} ({rep + 1}/{reps})")
        seconds, code, rank0 = once(name, tmp / f"tutorial-{re.sub(r'[^a-z0-9]+', '-', name.lower())}-{rep}", env)
        say(f"  {seconds:.3f} s, exit {code}; {rank0 or '(no report line on rank 0)'}")
        samples[name].append(seconds)
        codes[name].add(code)
    rows = [[name, "2 nodes" if CASES[name][1] else "1 node", Stat(samples[name]).fmt("s", 2),
             ", ".join(map(str, sorted(codes[name])))] for name in CASES]
    table = Table("Crash stop of the DDP tutorial script (rank 1 of 2 calls os._exit(3) at epoch 2; rank 0, in "
                  "a collective, dies by itself)",
                  ["launcher", "where", "failing rank's exit -> exit code seen and every process gone", "exit code"],
                  rows, [f"median (min-max) of {reps} runs; bench/scripts/ddp_tutorial.py (pytorch/examples' "
                         "ddp-tutorial-series/multinode.py on CPU)"])
    goals = []
    for where in ("", ", 2 nodes"):
        default, at_once = Stat(samples[DEFAULT + where]), Stat(samples[AT_ONCE + where])
        goals.append(Goal(f"tutorial crash stop{where or ', 1 node'}: default budget within 0.1 s of --dump-budget 0",
                          "<= +0.1 s", f"{default.median:.2f} s vs {at_once.median:.2f} s",
                          default.median <= at_once.median + 0.1))
    panel = Panel("DDP tutorial crash stop (lower is better)", "seconds", list(CASES),
                  [Stat(samples[name]) for name in CASES])
    return Section("teardown-tutorial", [table], [panel], goals)
