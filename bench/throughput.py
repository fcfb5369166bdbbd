"""1. Log throughput through the per-rank wrapper, output to /dev/null.

Each stream runs bare, through detlaunch's rank wrapper (standalone, no supervisor) and
through Determined's wrap_rank; the unbuffered line streams also run as a whole one-rank
job (detlaunch --layer torchrun vs bare torchrun). Time is from start to the last process
gone. "x bare" is the throughput ratio: bare time / time (1.0 = no cost).

Buffered streams write 8 KB blocks (a script's default when stdout is a pipe); unbuffered
ones write each line with its own syscall, which is how ranks run under detlaunch (it
starts a .py script with ``python -u``) and under any launcher that sets PYTHONUNBUFFERED.
"""

from __future__ import annotations

from collections.abc import Callable

from .common import (
    DET_PY,
    DETLAUNCH,
    PY,
    SCRIPTS,
    WRAPPER,
    Goal,
    Panel,
    Section,
    Stat,
    Table,
    free_port,
    interleaved,
    run,
    say,
)

EMIT = str(SCRIPTS / "emit.py")


def bare(cmd: list[str]) -> list[str]:
    return cmd


def detlaunch_wrapper(cmd: list[str]) -> list[str]:
    return [PY, "-S", WRAPPER, "--rank", "0", "--", *cmd]


def determined_wrap_rank(cmd: list[str]) -> list[str]:
    return [DET_PY, "-m", "determined.launch.wrap_rank", "0", "--", *cmd]


def bare_torchrun_job(cmd: list[str]) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), "--max-restarts", "0", "--no-python", *cmd]


def detlaunch_torchrun_job(cmd: list[str]) -> list[str]:
    return [DETLAUNCH, "--layer", "torchrun", "--nproc-per-node", "1", "--master-port", str(free_port()), *cmd]


WRAPPERS: dict[str, Callable[[list[str]], list[str]]] = {
    "bare": bare,
    "detlaunch wrapper": detlaunch_wrapper,
    "Determined wrap_rank": determined_wrap_rank,
}
JOBS: dict[str, Callable[[list[str]], list[str]]] = {
    "bare torchrun": bare_torchrun_job,
    "detlaunch --layer torchrun": detlaunch_torchrun_job,
}


def streams(quick: bool) -> list[tuple[str, list[str], bool]]:
    """(name, emitter argv, unbuffered)."""
    sizes = [(200_000, "200k")] if quick else [(200_000, "200k"), (2_000_000, "2M")]
    found = []
    for n, label in sizes:
        found.append((f"{label} lines, buffered", [PY, EMIT, "lines", str(n)], False))
        found.append((f"{label} lines, unbuffered", [PY, EMIT, "lines", str(n)], True))
    found.append(("200k \\r progress updates", [PY, EMIT, "progress", "200000"], False))
    return found


def measure(cases: dict[str, Callable[[list[str]], list[str]]], stream: list[str], unbuffered: bool,
            env: dict[str, str], reps: int) -> dict[str, Stat]:
    env = {**env, "PYTHONUNBUFFERED": "1"} if unbuffered else env
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _, name in interleaved(reps, list(cases)):
        samples[name].append(run(cases[name](stream), env, timeout=300).check(0).duration)
    return {name: Stat(s) for name, s in samples.items()}


def ratio(reference: Stat, other: Stat) -> float:
    return reference.median / other.median


def main(env: dict[str, str], reps: int, quick: bool) -> Section:
    wrapper_rows, job_rows, goals = [], [], []
    labels, bars = [], []
    for name, stream, unbuffered in streams(quick):
        say(f"throughput: {name}")
        big = int(stream[-1]) >= 1_000_000
        n = min(reps, 3) if big else reps  # the 2M streams take long; 3 repetitions give median and spread
        stats = measure(WRAPPERS, stream, unbuffered, env, n)
        vs_bare = ratio(stats["bare"], stats["detlaunch wrapper"])
        vs_det = ratio(stats["Determined wrap_rank"], stats["detlaunch wrapper"])
        det_vs_bare = ratio(stats["bare"], stats["Determined wrap_rank"])
        wrapper_rows.append([name, *(s.fmt() for s in stats.values()),
                             f"{vs_bare:.2f}x", f"{det_vs_bare:.2f}x", f"{vs_det:.1f}x"])
        goals.append(Goal(f"wrapper throughput, {name}", ">= 0.5x bare", f"{vs_bare:.2f}x", vs_bare >= 0.5))
        goals.append(Goal(f"wrapper throughput, {name}", ">= 2.5x Determined", f"{vs_det:.1f}x", vs_det >= 2.5))
        labels += [f"{name}\ndetlaunch", f"{name}\nDetermined"]
        bars += [Stat([stats["bare"].median / s for s in stats["detlaunch wrapper"].samples]),
                 Stat([stats["bare"].median / s for s in stats["Determined wrap_rank"].samples])]
        if unbuffered:
            say(f"throughput: {name}, whole one-rank job")
            jobs = measure(JOBS, stream, unbuffered, env, n)
            job_ratio = ratio(jobs["bare torchrun"], jobs["detlaunch --layer torchrun"])
            job_rows.append([name, *(s.fmt() for s in jobs.values()), f"{job_ratio:.2f}x"])
    tables = [
        Table("Log throughput through the per-rank wrapper (output to /dev/null)",
              ["stream", "bare", "detlaunch wrapper", "Determined wrap_rank", "detlaunch x bare",
               "Determined x bare", "detlaunch vs Determined"], wrapper_rows,
              ["time: median (min-max) from start until every process is gone; "
               "'x bare' = bare time / time (throughput ratio, 1.0 = free)",
               "'detlaunch vs Determined' cannot exceed 1 / 'Determined x bare': a wrapper that cost nothing "
               "would take the bare time",
               "wrapper: `python -S core/detlaunch/rank/run_wrapper.py --rank 0 -- CMD` standalone; "
               "Determined: `python -m determined.launch.wrap_rank 0 -- CMD` (determined 0.38.1)"]),
        Table("Log throughput through a whole one-rank torchrun job (script run with `python -u`)",
              ["stream", "bare torchrun", "detlaunch --layer torchrun", "detlaunch x bare torchrun"], job_rows,
              ["includes the launch itself (torchrun's agent imports torch: about 2-3 s here)"]),
    ]
    panels = [Panel("Log throughput, ratio to the bare script (higher is better)", "x bare", labels, bars,
                    goal=0.5)]
    return Section("throughput", tables, panels, goals)
