"""7. `--layer direct` against bare torchrun: the same 2-rank torch script (a gloo all_reduce).

- time: from the start to the exit code seen and every process gone;
- memory: while the job runs (sampled every 0.1 s), what the launcher adds on the node, at its
  largest: for detlaunch, its own processes (detlaunch, its supervisor, the rank wrappers); for
  torchrun, its agent (which imports torch). The ranks are the same in both. PSS (shared pages
  divided among the processes sharing them) is what those processes cost together; RSS summed
  counts the Python interpreter's pages once per process (4 for detlaunch, 1 for torchrun).
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from .common import (
    DETLAUNCH,
    PY,
    ROOT,
    Goal,
    Panel,
    Section,
    Stat,
    Table,
    free_port,
    interleaved,
    live_descendants,
    run,
    say,
)

SCRIPT = str(ROOT / "examples" / "allreduce.py")
CASES = {
    "detlaunch --layer direct": lambda: [DETLAUNCH, "--layer", "direct", "--nproc-per-node", "2",
                                         "--master-port", str(free_port()), SCRIPT],
    "bare torchrun": lambda: [PY, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                              "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--max-restarts", "0",
                              SCRIPT],
}


def launcher_memory_mb() -> tuple[float, float]:
    """(RSS, PSS) in MB of the launcher's own processes now: detlaunch's (and its wrappers), or torchrun's agent."""
    rss = pss = 0
    for p in live_descendants():
        try:
            argv = p.cmdline()
            ours = any(a.endswith("/detlaunch") or a.endswith("run_wrapper.py") or a == "torch.distributed.run"
                       for a in argv[:3]) or argv[1:3] == ["-m", "detlaunch"]
            if ours:
                info = p.memory_full_info()
                rss, pss = rss + info.rss, pss + info.pss
        except (psutil.NoSuchProcess, IndexError):
            pass
    return rss / 2**20, pss / 2**20


def main(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    times: dict[str, list[float]] = {name: [] for name in CASES}
    peaks: dict[str, list[float]] = {name: [] for name in CASES}
    pss_peaks: dict[str, list[float]] = {name: [] for name in CASES}
    for rep, name in interleaved(reps, list(CASES)):
        say(f"direct: {name} ({rep + 1}/{reps})")
        peak = [0.0, 0.0]

        def sample(peak: list[float] = peak) -> None:
            rss, pss = launcher_memory_mb()
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)

        job_env = {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"}  # as a user runs it
        times[name].append(run(CASES[name](), job_env, timeout=180, tick=sample, tick_every=0.1).check(0).duration)
        peaks[name].append(peak[0])
        pss_peaks[name].append(peak[1])
    t = {n: Stat(s) for n, s in times.items()}
    m = {n: Stat(s) for n, s in peaks.items()}
    p = {n: Stat(s) for n, s in pss_peaks.items()}
    ratio = t["detlaunch --layer direct"].median / t["bare torchrun"].median
    own = p["detlaunch --layer direct"].median
    table = Table("--layer direct vs bare torchrun: 2 ranks of examples/allreduce.py (gloo), one node",
                  ["launcher", "start -> every process gone", "launcher's own PSS at its largest", "RSS summed"],
                  [[n, t[n].fmt(), p[n].fmt("MB", 1), m[n].fmt("MB", 1)] for n in CASES],
                  ["median (min-max)", f"{os.cpu_count()} cores; detlaunch: detlaunch + supervisor + 2 wrappers"])
    goals = [Goal("--layer direct vs bare torchrun, start to every process gone", "<= 0.60x", f"{ratio:.2f}x",
                  ratio <= 0.60),
             Goal("--layer direct: detlaunch's own processes per node (PSS)", "<= 30 MB", f"{own:.1f} MB", own <= 30)]
    panel = Panel("2-rank torch job, start to every process gone (lower is better)", "seconds",
                  list(CASES), list(t.values()))
    return Section("direct", [table], [panel], goals)
