"""Stacks and heartbeats: what they cost.

    python bench/stacks.py [--reps 5] [--ranks 2 16 64]

- collect_stacks wall time for N sleeping Python processes on this node (goal: <= 1 s at 16);
- one detlaunch.progress() call, mapped to a real file and without detlaunch (goal: <= 5 us);
- one read_progress() (what the supervisor pays per rank and look).

Standalone (not part of `python -m bench` yet): every process it starts is killed by PID.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "core"))

from detlaunch.progress import create_progress_file, read_progress  # noqa: E402
from detlaunch.stacks.pyspy import ProcessStack, collect_stacks, find_py_spy  # noqa: E402

SLEEPER = "import time\ndef wait():\n    print('ready', flush=True)\n    time.sleep(600)\nwait()\n"


def spread(samples: list[float], unit: float = 1.0) -> str:
    s = [x * unit for x in samples]
    return f"median {statistics.median(s):.3f} (min {min(s):.3f}, max {max(s):.3f})"


def bench_collect(counts: list[int], reps: int) -> None:
    py_spy = find_py_spy()
    if py_spy is None:
        print("collect_stacks: n/a (py-spy is not installed)")
        return
    for n in counts:
        procs = [subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
                 for _ in range(n)]
        try:
            for p in procs:
                assert p.stdout and p.stdout.readline() == "ready\n"
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                got = collect_stacks([p.pid for p in procs], budget=30, py_spy=py_spy)
                times.append(time.perf_counter() - t0)
                bad = [r for r in got.values() if not isinstance(r, ProcessStack)]
                assert not bad, bad[:3]
            goal = "  (goal <= 1 s)" if n == 16 else ""
            print(f"collect_stacks, {n:3d} sleeping processes: {spread(times)} s{goal}")
        finally:
            for p in procs:
                p.kill()
                p.wait()


def bench_progress() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = create_progress_file(d, 0)
        code = ("import timeit, detlaunch\nfrom detlaunch.progress import progress\nprogress(0)\n"
                "n = 1_000_000\nfor stmt in ('progress(7)', 'progress()', 'detlaunch.progress(7)'):\n"
                "    t = min(timeit.repeat(stmt, globals=globals(), number=n, repeat=5)) / n\n"
                "    print(f'{stmt:24s} {t * 1e9:5.0f} ns')\n")
        env = {**os.environ, "PYTHONPATH": str(ROOT / "core")}
        for label, extra in (("mapped to a file", {"DETLAUNCH_PROGRESS_FILE": path}), ("without detlaunch", {})):
            env.pop("DETLAUNCH_PROGRESS_FILE", None)
            out = subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True,
                                 text=True, check=True).stdout
            for line in out.splitlines():
                print(f"progress, {label:17s}: {line}  (goal <= 5000 ns)")
        beat = read_progress(path)
        assert beat is not None and beat.count > 1_000_000
        t = min(timeit.repeat(lambda: read_progress(path), number=2000, repeat=5)) / 2000
        print(f"read_progress: {t * 1e6:.1f} us per read")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 16, 64])
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus, python {sys.version.split()[0]}")
    bench_progress()
    bench_collect(args.ranks, args.reps)


if __name__ == "__main__":
    main()
