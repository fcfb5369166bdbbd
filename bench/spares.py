"""A lost node replaced by a spare: from the loss to every rank of the next attempt running, 3 nodes + 1 spare.

    python -m bench.spares [--reps 3] [--heartbeat 1.0]

Four `detlaunch --layer direct --nnodes 3 --spares 1` on 127.0.0.1-4, one rank each (a script that never
imports torch: the figure is detlaunch's own, the ranks' start is nearly nothing). Once the three ranks
run and the spare has joined, node 2 is lost, two ways:

- closed link: its detlaunch is SIGKILLed (its PID namespace, and its rank, die with it);
- silent: its supervisor (pid 1 of its PID namespace) is SIGSTOPped: its link goes quiet and the chief
  finds it after 5 heartbeats (--heartbeat), the floor of this case.

Timed with CLOCK_MONOTONIC from the kill (or stop) to each rank of attempt 2 printing its start time,
the spare's rank 2 included; the bench reads every node's output as it arrives (select(), no polling).
Every process is stopped by its process group at the end.
"""

from __future__ import annotations

import argparse
import functools
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from .common import free_port, kill_groups

RANK = """\
import os, sys, time
rank, attempt = os.environ["RANK"], os.environ.get("DETLAUNCH_RESTART_COUNT", "0")
print(f"STARTED {rank} {attempt} {time.clock_gettime(time.CLOCK_MONOTONIC)!r}", flush=True)
if attempt == "0":
    time.sleep(600)
"""


class Output:
    """Every node's output (its ranks' lines and its own, in one pipe), read as it arrives: the bench sleeps in
    select() until a line comes, never polls. Each node's output also goes to its log, for a failure's message."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
        self.selector = selectors.DefaultSelector()
        self.lines: list[list[str]] = [[] for _ in procs]
        self.rest = [b""] * len(procs)
        self.ended: set[int] = set()  # nodes whose output is over (their detlaunch exited)
        self.logs = logs
        for n, proc in enumerate(procs):
            assert proc.stdout is not None
            self.selector.register(proc.stdout, selectors.EVENT_READ, n)

    def until(self, done: Callable[[], bool], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError("timed out; each node's last lines:\n" + "\n".join(
                    f"--- node {n}:\n" + "\n".join(lines[-6:]) for n, lines in enumerate(self.lines)))
            for key, _ in self.selector.select(left):
                data = os.read(key.fd, 65536)
                n = key.data
                if not data:
                    self.selector.unregister(key.fileobj)
                    self.ended.add(n)
                    continue
                with open(self.logs[n], "ab") as log:
                    log.write(data)
                *whole, self.rest[n] = (self.rest[n] + data).split(b"\n")
                self.lines[n] += [line.decode(errors="replace") for line in whole]

    def started(self, attempt: int) -> dict[int, float]:
        """Each rank's start time in `attempt` (0: the first), by rank, as its lines say so far."""
        out = {}
        for lines in self.lines:
            for line in lines:
                words = line.split("STARTED ", 1)[-1].split() if "STARTED " in line else []
                if len(words) == 3 and words[1] == str(attempt):
                    out[int(words[0])] = float(words[2])
        return out

    def said(self, node: int, text: str) -> bool:
        return any(text in line for line in self.lines[node])


def lost_node(tmp: Path, how: str, heartbeat: float, *, nnodes: int, lost: int, watched: int,
              addrs: Sequence[str] = (), prefix: Callable[[int], list[str]] = lambda n: []) -> tuple[float, float]:
    """`nnodes` nodes and one spare (node `nnodes`); once every rank runs and the spare has joined, node `lost` is
    lost (`how`). Returns (loss -> rank `watched` of attempt 2 running, loss -> every rank of attempt 2 running),
    seconds. Node n runs at `addrs[n]` (127.0.0.n+1 by default) behind `prefix(n)` (`ip netns exec NS`: a
    machine of its own). bench/succession.py loses the chief with it."""
    job = Path(tempfile.mkdtemp(dir=tmp))
    script = job / "rank.py"
    script.write_text(RANK)
    addrs = addrs or [f"127.0.0.{n + 1}" for n in range(nnodes + 1)]
    common = [sys.executable, "-m", "detlaunch", "--layer", "direct", "--nnodes", str(nnodes), "--spares", "1",
              "--nproc-per-node", "1", "--master-addr", addrs[0], "--master-port", str(free_port()),
              "--max-node-restarts", "1", "--restart-backoff", "0", "--heartbeat", str(heartbeat)]
    nodes = [subprocess.Popen([*prefix(n), *common, "--node-rank", str(n), "--node-addr", addrs[n], str(script)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
             for n in range(nnodes + 1)]
    logs = [job / f"node-{n}.log" for n in range(nnodes + 1)]
    out = Output(nodes, logs)
    survivors = set(range(nnodes + 1)) - {lost}
    try:
        out.until(lambda: len(out.started(0)) == nnodes and out.said(nnodes, "joined the job"))
        # No wait for the chief's next share of the membership: a spare that joined has the last one at once.
        lost_at = time.clock_gettime(time.CLOCK_MONOTONIC)
        if how == "closed link":
            nodes[lost].send_signal(signal.SIGKILL)
        else:
            psutil.Process(nodes[lost].pid).children()[0].suspend()
        out.until(lambda: len(out.started(1)) == nnodes)
        starts = out.started(1)
        out.until(lambda: survivors <= out.ended, 60)
        for n in sorted(survivors):
            if nodes[n].wait(60) != 0:
                raise RuntimeError(f"node {n} failed:\n{logs[n].read_text()[-2000:]}")
        return starts[watched] - lost_at, max(starts.values()) - lost_at
    finally:
        kill_groups(nodes)


def report(hows: Sequence[str], reps: int, heartbeat: float, measure: Callable[[Path, str, float], tuple[float, float]],
           watched: str) -> None:
    """Run `measure` `reps` times for each way of losing a node; print each run and the medians."""
    with tempfile.TemporaryDirectory() as tmp:
        for how in hows:
            first, every = [], []
            for rep in range(reps):
                load = os.getloadavg()[0]
                a, b = measure(Path(tmp), how, heartbeat)
                first.append(a)
                every.append(b)
                print(f"{how} ({rep + 1}/{reps}, load {load:.1f}): {watched} {a:.3f} s, every rank {b:.3f} s",
                      flush=True)
            print(f"{how}: median {spread(first)} to {watched}, {spread(every)} to every rank "
                  f"(heartbeat {heartbeat:g} s)", flush=True)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s (min-max {min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    args = parser.parse_args()
    report(("closed link", "silent"), args.reps, args.heartbeat,
           functools.partial(lost_node, nnodes=3, lost=2, watched=2), "the spare's rank")


if __name__ == "__main__":
    main()
