"""The chief lost and succeeded: from its loss to every rank of the next attempt running, 4 nodes + 1 spare.

    python -m bench.succession [--reps 3] [--heartbeat 1.0] [--how closed|silent|both]

Five `detlaunch --layer direct --nnodes 4 --spares 1` on 127.0.0.1-5, one rank each (a script that never
imports torch: the figure is detlaunch's own, the ranks' start is nearly nothing). Once the four ranks
run and the spare has joined, the chief (node 0) is lost, two ways:

- closed link: its detlaunch is SIGKILLed (its PID namespace, and its rank, die with it);
- silent: its supervisor (pid 1 of its PID namespace) is SIGSTOPped: its link goes quiet and the nodes
  find it after 5 heartbeats (--heartbeat), the floor of this case.

Node 1 takes over as node 0, nodes 2 and 3 and the spare join it, the spare takes node 1's old place,
and attempt 2 starts. Timed with CLOCK_MONOTONIC from the kill (or stop) to each rank of attempt 2
writing its start time. Issue 26's goal: closed link <= 2 s plus the ranks' own start. Every process is
stopped by its process group at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from .common import free_port

RANK = """\
import os, sys, time
d, rank, attempt = sys.argv[1], os.environ["RANK"], os.environ.get("DETLAUNCH_RESTART_COUNT", "0")
path = os.path.join(d, f"started-{rank}-{attempt}")
with open(path + ".tmp", "w") as f:
    f.write(repr(time.clock_gettime(time.CLOCK_MONOTONIC)))
os.replace(path + ".tmp", path)
if attempt == "0":
    time.sleep(600)
"""


def wait_for(predicate, timeout: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.002)


def once(tmp: Path, how: str, heartbeat: float) -> tuple[float, float]:
    """(loss -> the successor's rank 0 running, loss -> every rank of attempt 2 running), seconds."""
    job = Path(tempfile.mkdtemp(dir=tmp))
    script = job / "rank.py"
    script.write_text(RANK)
    common = [sys.executable, "-m", "detlaunch", "--layer", "direct", "--nnodes", "4", "--spares", "1",
              "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
              "--max-node-restarts", "1", "--restart-backoff", "0", "--heartbeat", str(heartbeat)]
    logs = [open(job / f"node-{n}.log", "wb") for n in range(5)]  # noqa: SIM115 - closed below
    nodes = [subprocess.Popen([*common, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}", str(script),
                               str(job)], stdout=logs[n], stderr=subprocess.STDOUT, start_new_session=True)
             for n in range(5)]
    try:
        wait_for(lambda: all((job / f"started-{r}-0").exists() for r in range(4)))
        wait_for(lambda: b"joined the job" in (job / "node-4.log").read_bytes())
        lost = nodes[0]
        lost_at = time.clock_gettime(time.CLOCK_MONOTONIC)
        if how == "closed link":
            lost.send_signal(signal.SIGKILL)
        else:
            psutil.Process(lost.pid).children()[0].suspend()
        wait_for(lambda: all((job / f"started-{r}-1").exists() for r in range(4)))
        starts = [float((job / f"started-{r}-1").read_text()) for r in range(4)]
        for n in (1, 2, 3, 4):
            if nodes[n].wait(60) != 0:
                raise RuntimeError(f"node {n} failed:\n{(job / f'node-{n}.log').read_text()[-2000:]}")
        return starts[0] - lost_at, max(starts) - lost_at
    finally:
        for proc in nodes:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        for log in logs:
            log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--how", choices=("closed", "silent", "both"), default="both")
    args = parser.parse_args()
    hows = {"closed": ["closed link"], "silent": ["silent"], "both": ["closed link", "silent"]}[args.how]
    with tempfile.TemporaryDirectory() as tmp:
        for how in hows:
            spare, every = [], []
            for rep in range(args.reps):
                load = os.getloadavg()[0]
                a, b = once(Path(tmp), how, args.heartbeat)
                spare.append(a)
                every.append(b)
                print(f"{how} ({rep + 1}/{args.reps}, load {load:.1f}): rank 0 {a:.3f} s, every rank {b:.3f} s",
                      flush=True)
            print(f"{how}: median {statistics.median(spare):.3f} s to rank 0 (the successor's), "
                  f"{statistics.median(every):.3f} s to every rank (heartbeat {args.heartbeat:g} s)", flush=True)


if __name__ == "__main__":
    main()
