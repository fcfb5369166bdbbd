"""The preflight (issue 27): its wall time at 2, 4 and 16 nodes, and detlaunch.section()'s cost: a loop, and a job.

    python -m bench.preflight [--nodes 2 4 16] [--reps 3] [--steps 20000] [--job-steps 2000]

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
3. A job's throughput: `detlaunch --layer direct --nproc-per-node 2` of bench/scripts/section_steps.py (each
   step a small matmul in `detlaunch.section("step")` and an all_reduce in a gloo group: ~1 ms a step here),
   against the same job with SECTIONS=0; rank 0's steps a second, wall time, the runs interleaved.
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

from .common import SCRIPTS, free_port, kill_groups

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


def preflight_once(nodes: int, tmp: Path) -> tuple[float, float, int]:
    """(the chief's preflight seconds, every node started -> every node exited, the nodes it named), one
    `doctor --job` run. Named nodes (exit 69) count: "nodes" sharing this machine's cores may measure apart."""
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
        if any(code not in (0, 69) for code in codes):
            raise RuntimeError(f"exit codes {codes}:\n{(job / 'node-0.log').read_text()[-3000:]}")
        events = [json.loads(line) for line in (job / "logs" / "events.jsonl").read_text().splitlines()]
        (event,) = [e for e in events if e["kind"] == "preflight"]
        return float(event["details"]["seconds"]), wall, len(event["details"]["findings"])
    finally:
        kill_groups(procs)
        for log in logs:
            log.close()


def loop_rate(steps: int, on: bool, tmp: Path) -> float:
    out = subprocess.run([sys.executable, "-c", LOOP, str(steps), str(tmp), "on" if on else "off"],
                         capture_output=True, text=True, check=True, timeout=300)
    return float(out.stdout.strip())


def job_rate(steps: int, on: bool, tmp: Path) -> float:
    """Rank 0's steps a second in a 2-rank job of bench/scripts/section_steps.py, sections on or off."""
    env = {**os.environ, "SECTIONS": "1" if on else "0", "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "detlaunch", "--layer", "direct", "--nproc-per-node", "2",
                             "--master-port", str(free_port()), str(SCRIPTS / "section_steps.py"), str(steps)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        kill_groups([proc])
    text = out.decode(errors="replace")
    rates = [float(line.split("steps/s ")[1]) for line in text.splitlines() if "steps/s " in line]
    if proc.returncode or not rates:
        raise RuntimeError(f"exit code {proc.returncode}:\n{text[-3000:]}")
    return rates[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 16])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--job-steps", type=int, default=2000)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        print(f"load average before: {load:.1f}")
        for n in args.nodes:
            runs = [preflight_once(n, Path(tmp)) for _ in range(args.reps)]
            pre, wall = [r[0] for r in runs], [r[1] for r in runs]
            print(f"preflight, {n} nodes: {statistics.median(pre):.2f} s (runs {', '.join(f'{p:.2f}' for p in pre)}); "
                  f"doctor --job start to every node exited {statistics.median(wall):.2f} s; "
                  f"nodes named (no node is slow here) {', '.join(str(r[2]) for r in runs)}")
        off, on = loop_rate(args.steps, False, Path(tmp)), loop_rate(args.steps, True, Path(tmp))
        print(f"throughput loop ({args.steps} steps of ~{1e6 / off:.1f} us): {off:,.0f} steps/s without sections, "
              f"{on:,.0f} with; section() costs {(1 / on - 1 / off) * 1e6:.2f} us a step, "
              f"{(off / on - 1) * 100:.1f} % of this tiny step")
        rates: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.reps):
            for on in (False, True):
                rates[on].append(job_rate(args.job_steps, on, Path(tmp)))
        job_off, job_on = statistics.median(rates[False]), statistics.median(rates[True])
        print(f"2-rank job ({args.job_steps} steps, matmul + all_reduce): {job_off:,.0f} steps/s without sections "
              f"(runs {', '.join(f'{r:,.0f}' for r in rates[False])}), {job_on:,.0f} with "
              f"(runs {', '.join(f'{r:,.0f}' for r in rates[True])}): {(job_off / job_on - 1) * 100:+.1f} %")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
