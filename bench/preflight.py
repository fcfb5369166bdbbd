"""The preflight (issue 27): its wall time at 2 and 4 nodes, and detlaunch.section()'s cost in a throughput loop.

    python -m bench.preflight [--nodes 2 4] [--reps 2] [--steps 20000]

1. `detlaunch doctor --job --layer direct` on N "nodes" (127.0.0.1..N, one detlaunch each): the whole
   preflight (a check child per node and round: torch imported, the compute check, the pairs' all-reduce)
   and nothing else, no rank. Two figures: the chief's `preflight` event's `seconds` (from the first
   round's question to the verdict), and the command's wall time, every node started to every node
   exited (start, link, preflight, end). Every process is stopped by its process group at the end.
2. A throughput loop in a fresh Python under detlaunch (a progress file named in DETLAUNCH_PROGRESS_FILE,
   as a rank has it): steps of a fixed small piece of work (~20 us of Python), each in
   `with detlaunch.section("step")`, against the same loop without it. Best of 5 runs, CPU time
   (process_time: on a shared machine, wall time is mostly the other processes' turn). The overhead
   at real step sizes follows from the per-call cost (bench/stragglers.py measures it alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from .common import free_port, kill_groups

LOOP = """
import os, sys, time
import detlaunch
from detlaunch.rank.progress import create_progress_file
os.environ["DETLAUNCH_PROGRESS_FILE"] = create_progress_file(sys.argv[2], 0)
steps, on = int(sys.argv[1]), sys.argv[3] == "on"
section = detlaunch.section
def work():
    return sum(range(300))
best = []
for _ in range(5):
    t = time.process_time()
    if on:
        for _ in range(steps):
            with section("step"):
                work()
    else:
        for _ in range(steps):
            work()
    best.append(time.process_time() - t)
print(steps / min(best))
"""


def preflight_once(nodes: int, tmp: Path) -> tuple[float, float]:
    """(the chief's preflight seconds, every node started -> every node exited), one `doctor --job` run."""
    job = Path(tempfile.mkdtemp(dir=tmp))
    common = [sys.executable, "-m", "detlaunch", "doctor", "--job", "--layer", "direct", "--nnodes", str(nodes),
              "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
              "--job-id", f"bench-preflight-{uuid.uuid4().hex[:8]}", "--log-dir", str(job / "logs")]
    logs = [open(job / f"node-{n}.log", "wb") for n in range(nodes)]  # noqa: SIM115 - closed below
    started = time.monotonic()
    procs = [subprocess.Popen([*common, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}"],
                              stdout=logs[n], stderr=subprocess.STDOUT, start_new_session=True)
             for n in reversed(range(nodes))]
    try:
        codes = [p.wait(300) for p in procs]
        wall = time.monotonic() - started
        if any(codes):
            raise RuntimeError(f"exit codes {codes}:\n{(job / 'node-0.log').read_text()[-3000:]}")
        events = [json.loads(line) for line in (job / "logs" / "events.jsonl").read_text().splitlines()]
        (event,) = [e for e in events if e["kind"] == "preflight"]
        return float(event["details"]["seconds"]), wall
    finally:
        kill_groups(procs)
        for log in logs:
            log.close()


def loop_rate(steps: int, on: bool, tmp: Path) -> float:
    out = subprocess.run([sys.executable, "-c", LOOP, str(steps), str(tmp), "on" if on else "off"],
                         capture_output=True, text=True, check=True, timeout=300)
    return float(out.stdout.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20000)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        print(f"load average before: {load:.1f}")
        for n in args.nodes:
            runs = [preflight_once(n, Path(tmp)) for _ in range(args.reps)]
            pre, wall = [r[0] for r in runs], [r[1] for r in runs]
            print(f"preflight, {n} nodes: {statistics.median(pre):.2f} s (runs {', '.join(f'{p:.2f}' for p in pre)}); "
                  f"doctor --job start to every node exited {statistics.median(wall):.2f} s")
        off, on = loop_rate(args.steps, False, Path(tmp)), loop_rate(args.steps, True, Path(tmp))
        print(f"throughput loop ({args.steps} steps of ~{1e6 / off:.1f} us): {off:,.0f} steps/s without sections, "
              f"{on:,.0f} with; section() costs {(1 / on - 1 / off) * 1e6:.2f} us a step, "
              f"{(off / on - 1) * 100:.1f} % of this tiny step")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
