"""3. Failure teardown: one rank exits 3 while the other sleeps outside any collective.

Measured from the moment the failing rank calls exit (it writes CLOCK_MONOTONIC just
before) until the launcher's exit code has been observed AND every process of the job
is gone (see common.run). Single node, 2 ranks; and 2 "nodes" (127.0.0.1 and 127.0.0.2)
with one rank each, the rank on node 1 failing, for detlaunch's layers.
"""

from __future__ import annotations

import re
from pathlib import Path

from .common import (
    DETLAUNCH,
    PY,
    SCRIPTS,
    Goal,
    NotAvailable,
    Panel,
    Section,
    Stat,
    Table,
    detlaunch_layer,
    free_port,
    interleaved,
    run,
    say,
)
from .launchers import LAUNCHERS, Launcher

RANK = str(SCRIPTS / "rank.py")
NODES = str(SCRIPTS / "nodes.py")
TIMEOUT = 60.0


def on_nodes(layer: str, count: int = 2) -> Launcher:
    """detlaunch --layer LAYER on `count` loopback "nodes" (127.0.0.1, 127.0.0.2, ...), one rank each, side
    by side; nodes.py writes when each node's detlaunch exited to JOB/node-exits."""

    def launcher(n: int, script: list[str], job: Path, env: dict[str, str]) -> list[str]:
        hosts = ["--hosts", ",".join(f"127.0.0.{i + 1}:1" for i in range(count)), "--master-port", str(free_port())]
        detlaunch_layer(layer, env, [*hosts, "--node-rank", str(count - 1), *script])
        node = [DETLAUNCH, "--layer", layer, *hosts]
        argv = [PY, NODES, "--exit-times", str(job / "node-exits")]
        for i in range(count):
            argv += [*(["---"] if i else []), *node, "--node-rank", str(i), *script]
        return argv

    return launcher


CROSS_NODE: dict[str, Launcher] = {
    f"detlaunch --layer {layer}, 2 nodes": on_nodes(layer) for layer in ("torchrun", "horovod", "deepspeed")
}
CASES: dict[str, Launcher] = {**LAUNCHERS, **CROSS_NODE}


def once(name: str, launcher: Launcher, job: Path, env: dict[str, str]) -> tuple[float | None, int | None]:
    """(seconds from the failing rank's exit to the end of the job, the job's exit code); None: timed out."""
    job.mkdir()
    argv = launcher(2, [RANK, "fail", str(job), "2"], job, env)
    r = run(argv, env, timeout=TIMEOUT)
    if r.leaked:
        raise RuntimeError(f"{name} left processes behind: {r.leaked}")
    exit_time = job / "exit-time"
    if not exit_time.exists():
        raise RuntimeError(f"{name}: the failing rank never ran (exit {r.code}):\n{r.stderr[-3000:]}")
    if r.code is None:
        return None, None
    return r.end - float(exit_time.read_text()), r.code


def main(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    codes: dict[str, set[int]] = {name: set() for name in CASES}
    timeouts: dict[str, int] = {name: 0 for name in CASES}
    missing: dict[str, str] = {}
    for rep, name in interleaved(reps, list(CASES)):
        if name in missing:
            continue
        say(f"teardown: {name} ({rep + 1}/{reps})")
        try:
            seconds, code = once(name, CASES[name], tmp / f"teardown-{_slug(name)}-{rep}", env)
        except NotAvailable as e:
            missing[name] = str(e)
            continue
        if seconds is None:
            timeouts[name] += 1
        else:
            samples[name].append(seconds)
            codes[name].add(int(code or 0))

    rows, labels, stats = [], [], []
    goals = []
    for name in CASES:
        where = "2 nodes" if name in CROSS_NODE else "1 node"
        limit = 1.0 if name in CROSS_NODE else 0.5
        if name in missing:
            rows.append([name, where, f"n/a ({missing[name]})", ""])
            if name.startswith("detlaunch"):
                goals.append(Goal(f"failure teardown, {name}", f"<= {limit:g} s", "n/a", None))
            continue
        stat = Stat(samples[name]) if samples[name] else None
        shown = stat.fmt() if stat else "-"
        if timeouts[name]:
            shown += f"; {timeouts[name]} of {reps} runs still not over after {TIMEOUT:g} s"
        rows.append([name, where, shown, ", ".join(map(str, sorted(codes[name]))) or "-"])
        labels.append(name.replace("detlaunch --layer ", "detlaunch ").replace(", ", "\n"))
        stats.append(stat)
        if name.startswith("detlaunch"):
            goals.append(Goal(f"failure teardown, {name}", f"<= {limit:g} s",
                              shown if stat else "timed out",
                              bool(stat and not timeouts[name] and stat.median <= limit)))
    table = Table("Failure teardown: a rank exits 3, the other sleeps outside any collective",
                  ["launcher", "where", "rank exit -> exit code seen and every process gone", "exit code"], rows,
                  ["2 ranks; median (min-max); the clock starts when the failing rank calls exit (CLOCK_MONOTONIC)",
                   "Determined's chain: pid_server --on-fail SIGTERM (its default 3 s grace sleep, 1 s polling), "
                   "as its torch_distributed layer runs it"])
    panel = Panel("Failure teardown (lower is better)", "seconds", labels, stats, goal=0.5)
    return Section("teardown", [table], [panel], goals)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
