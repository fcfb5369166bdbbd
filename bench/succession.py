"""The chief lost and succeeded: from its loss to every rank of the next attempt running, 4 nodes + 1 spare.

    python -m bench.succession [--reps 3] [--heartbeat 1.0] [--how closed|silent|both] [--netns]

Five `detlaunch --layer direct --nnodes 4 --spares 1`, one rank each (a script that never imports torch:
the figure is detlaunch's own, the ranks' start is nearly nothing). Once the four ranks run and the spare
has joined, the chief (node 0) is lost, two ways:

- closed link: its detlaunch is SIGKILLed (its PID namespace, and its rank, die with it); the nodes run
  on 127.0.0.1-5, or each in a network namespace of its own with `--netns`;
- silent (`--how silent`): its supervisor (pid 1 of its PID namespace) is SIGSTOPped: its link goes quiet
  and the nodes find it after 5 heartbeats (--heartbeat), the floor of this case. The nodes always run
  each in a network namespace of its own (tests/support/netns.py, as tests/node/test_partition.py:
  root only): a stopped chief's rank 0 keeps its store on the master port, which on one shared network
  stack is the successor's port too (docs/RESTARTS.md, "The chief's succession").

Node 1 takes over as node 0, nodes 2 and 3 and the spare join it, the spare takes node 1's old place,
and attempt 2 starts. Timed with CLOCK_MONOTONIC from the kill (or stop) to each rank of attempt 2
printing its start time (bench/spares.py's harness reads every node's output as it arrives: no
polling). Issue 26's goals: closed link <= 2 s plus the ranks' own start; silent: detection plus the
same. Every process is stopped by its process group at the end, then any process still in a node's
network namespace by PID (none may outlive that), and the namespaces are deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
from pathlib import Path

import psutil

from .common import nothing_left
from .spares import lost_node, report

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the machines of tests/node/test_partition.py

from support.netns import lan  # noqa: E402

NODES = 5  # 4 nodes + 1 spare


def lost_chief(tmp: Path, how: str, heartbeat: float, *, netns: bool) -> tuple[float, float]:
    """One run: the chief lost `how`, on loopback addresses or on machines of their own."""
    lose = functools.partial(lost_node, tmp, how, heartbeat, nnodes=NODES - 1, lost=0, watched=0)
    if not netns and how == "closed link":
        return lose()
    with lan(NODES, "10.213.91") as net:
        try:
            return lose(addrs=net.addrs, prefix=net.prefix)
        finally:  # lost_node stopped each node's process group; then whatever is still on a machine, by PID
            for i in range(NODES):
                empty(net.ns(i))


def on_machine(ns: str) -> list[psutil.Process]:
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout.split()
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            found.append(psutil.Process(int(pid)))
    return found


def empty(ns: str) -> None:
    """SIGKILL every process left in network namespace `ns` (a rank's supervisor dies with its node's detlaunch,
    PR_SET_PDEATHSIG, a moment after it) and wait until none is."""
    left = on_machine(ns)
    for proc in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(left, timeout=10)
    if still := on_machine(ns):
        raise RuntimeError(f"processes left in {ns}: {[proc.pid for proc in still]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--how", choices=("closed", "silent", "both"), default="closed")
    parser.add_argument("--netns", action="store_true",
                        help="the closed-link case on machines of their own too (the silent case always is)")
    args = parser.parse_args()
    hows = {"closed": ["closed link"], "silent": ["silent"], "both": ["closed link", "silent"]}[args.how]
    if (args.netns or "silent" in hows) and os.getuid() != 0:
        parser.exit(2, "bench.succession: the nodes' network namespaces need root (--how closed without --netns "
                       "does not)\n")
    # Node 1 takes over as node 0, nodes 2 and 3 and the spare join it, the spare takes node 1's old place.
    with nothing_left():  # SIGTERM and SIGHUP too end it through every finally: no namespace is left
        report(hows, args.reps, args.heartbeat, functools.partial(lost_chief, netns=args.netns),
               "rank 0 (the successor's)")


if __name__ == "__main__":
    main()
