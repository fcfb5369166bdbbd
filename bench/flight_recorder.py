"""torch's Flight Recorder: what it costs a rank, and what asking for its dump costs.

    python bench/flight_recorder.py [--runs 4] [--calls 5000]

- one gloo all_reduce of 4 floats (world size 1) with TORCH_FR_BUFFER_SIZE=0 and =2000, runs
  interleaved, best of 5 x CALLS each (the recorder's cost per collective), and the rank's RSS growth
  once the ring is full;
- one question to a rank (rank/flightrec.py: FIFO, dump, summary), the rank blocked in read(2).

Standalone (not part of `python -m bench`): every process it starts is its child, waited for.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "core"))

from detlaunch.rank import faultdump, flightrec  # noqa: E402
from detlaunch.stacks.query import FlightQuestion  # noqa: E402

COST = """
import json, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
t = torch.ones(4)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
for _ in range(200):
    dist.all_reduce(t)
before = rss()
best = 1e9
for _ in range(5):
    start = time.perf_counter()
    for _ in range({calls}):
        dist.all_reduce(t)
    best = min(best, (time.perf_counter() - start) / {calls})
print(json.dumps({{"us": best * 1e6, "rss_mb": (rss() - before) / 2**20}}))
"""
BLOCKED = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
for _ in range(3000):
    dist.all_reduce(torch.ones(4))
print("ready", flush=True)
sys.stdin.buffer.read(1)
"""


def cost(size: str, calls: int, port: int) -> dict[str, float]:
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": size}
    out = subprocess.run([sys.executable, "-c", COST.format(port=port, calls=calls)], env=env, check=True,
                         capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.splitlines()[-1])  # type: ignore[no-any-return]


def question(port: int) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        faultdump.prepare(run_dir, 0, env)
        flightrec.prepare(run_dir, 0, env)
        p = subprocess.Popen([sys.executable, "-c", BLOCKED.format(port=port)], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
        try:
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
            took = []
            for _ in range(5):
                q = FlightQuestion({p.pid: flightrec.fifo_path(run_dir, 0)})
                start = time.monotonic()
                q.send(start + 2)
                q.receive(start + 2)
                took.append(time.monotonic() - start)
                assert "groups" in q.summaries[p.pid], q.summaries
            return min(took)
        finally:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--port", type=int, default=29577)
    a = ap.parse_args()
    seen: dict[str, list[dict[str, float]]] = {"0": [], "2000": []}
    for _ in range(a.runs):
        for size in seen:
            seen[size].append(cost(size, a.calls, a.port))
    for size, runs in seen.items():
        us = sorted(r["us"] for r in runs)
        print(f"TORCH_FR_BUFFER_SIZE={size}: {us[0]:.1f}-{us[-1]:.1f} us an all_reduce (best of each run), "
              f"RSS +{max(r['rss_mb'] for r in runs):.2f} MB after {5 * a.calls} more")
    print(f"a question to a rank with 2000 entries (FIFO, dump, summary): {question(a.port) * 1e3:.1f} ms (best of 5)")


if __name__ == "__main__":
    main()
