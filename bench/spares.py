"""A lost node replaced by a spare: from the loss to every rank of the next attempt running, 3 nodes + 1 spare.

    python -m bench.spares [--reps 3] [--heartbeat 1.0]

Four `detlaunch --layer direct --nnodes 3 --spares 1` on 127.0.0.1-4, one rank each (a script that never
imports torch: the figure is detlaunch's own, the ranks' start is nearly nothing). Once the three ranks
run and the spare has joined, node 2 is lost, two ways:

- closed link: its detlaunch is SIGKILLed (its PID namespace, and its rank, die with it);
- silent: its supervisor (pid 1 of its PID namespace) is SIGSTOPped: its link goes quiet and the chief
  finds it after 5 heartbeats (--heartbeat), the floor of this case.

Timed with CLOCK_MONOTONIC from the kill (or stop) to each rank of attempt 2 writing its start time,
the spare's rank 2 included. Every process is stopped by its process group at the end.
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
    """(loss -> the spare's rank running, loss -> every rank of attempt 2 running), seconds."""
    job = Path(tempfile.mkdtemp(dir=tmp))
    script = job / "rank.py"
    script.write_text(RANK)
    common = [sys.executable, "-m", "detlaunch", "--layer", "direct", "--nnodes", "3", "--spares", "1",
              "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
              "--max-node-restarts", "1", "--restart-backoff", "0", "--heartbeat", str(heartbeat)]
    logs = [open(job / f"node-{n}.log", "wb") for n in range(4)]  # noqa: SIM115 - closed below
    nodes = [subprocess.Popen([*common, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}", str(script),
                               str(job)], stdout=logs[n], stderr=subprocess.STDOUT, start_new_session=True)
             for n in range(4)]
    try:
        wait_for(lambda: all((job / f"started-{r}-0").exists() for r in range(3)))
        wait_for(lambda: b"joined the job" in (job / "node-3.log").read_bytes())
        lost = nodes[2]
        lost_at = time.clock_gettime(time.CLOCK_MONOTONIC)
        if how == "closed link":
            lost.send_signal(signal.SIGKILL)
        else:
            psutil.Process(lost.pid).children()[0].suspend()
        wait_for(lambda: all((job / f"started-{r}-1").exists() for r in range(3)))
        starts = [float((job / f"started-{r}-1").read_text()) for r in range(3)]
        for n in (0, 1, 3):
            if nodes[n].wait(60) != 0:
                raise RuntimeError(f"node {n} failed:\n{(job / f'node-{n}.log').read_text()[-2000:]}")
        return starts[2] - lost_at, max(starts) - lost_at
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for how in ("closed link", "silent"):
            spare, every = [], []
            for rep in range(args.reps):
                load = os.getloadavg()[0]
                a, b = once(Path(tmp), how, args.heartbeat)
                spare.append(a)
                every.append(b)
                print(f"{how} ({rep + 1}/{args.reps}, load {load:.1f}): spare's rank {a:.3f} s, every rank {b:.3f} s",
                      flush=True)
            print(f"{how}: median {statistics.median(spare):.3f} s to the spare's rank, "
                  f"{statistics.median(every):.3f} s to every rank (heartbeat {args.heartbeat:g} s)", flush=True)


if __name__ == "__main__":
    main()
