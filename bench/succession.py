"""The chief lost and succeeded: from its loss to every rank of the next attempt running, 4 nodes + 1 spare.

    python -m bench.succession [--reps 3] [--heartbeat 1.0] [--how closed|silent|both]

Five `detlaunch --layer direct --nnodes 4 --spares 1` on 127.0.0.1-5, one rank each (a script that never
imports torch: the figure is detlaunch's own, the ranks' start is nearly nothing). Once the four ranks
run and the spare has joined, the chief (node 0) is lost, two ways:

- closed link: its detlaunch is SIGKILLed (its PID namespace, and its rank, die with it);
- silent (`--how silent`): its supervisor (pid 1 of its PID namespace) is SIGSTOPped: its link goes quiet
  and the nodes find it after 5 heartbeats (--heartbeat). On one machine this case does not finish (the
  same limit as its job test: docs/RESTARTS.md, "The chief's succession", "Not yet").

Node 1 takes over as node 0, nodes 2 and 3 and the spare join it, the spare takes node 1's old place,
and attempt 2 starts. Timed with CLOCK_MONOTONIC from the kill (or stop) to each rank of attempt 2
printing its start time (bench/spares.py's harness reads every node's output as it arrives: no
polling). Issue 26's goal: closed link <= 2 s plus the ranks' own start. Every process is stopped by
its process group at the end.
"""

from __future__ import annotations

import argparse
import functools

from .spares import lost_node, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--how", choices=("closed", "silent", "both"), default="closed")
    args = parser.parse_args()
    hows = {"closed": ["closed link"], "silent": ["silent"], "both": ["closed link", "silent"]}[args.how]
    # Node 1 takes over as node 0, nodes 2 and 3 and the spare join it, the spare takes node 1's old place.
    report(hows, args.reps, args.heartbeat, functools.partial(lost_node, nnodes=4, lost=0, watched=0),
           "rank 0 (the successor's)")


if __name__ == "__main__":
    main()
