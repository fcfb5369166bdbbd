"""Runs one command per "node" side by side (a multi-node job on one machine); exits when all have.

    nodes.py [--exit-times FILE] CMD1... --- CMD2... [--- ...]

Exit code: the first non-zero one, in node order (0 when all succeed). With --exit-times, FILE gets
{"exits": [...], "codes": [...]} in node order: when each node's command exited (CLOCK_MONOTONIC, as
the bench reads it, seen the moment it was reaped) and its exit code.
"""

import json
import os
import subprocess
import sys
import time

args = sys.argv[1:]
times_file = None
if args[:1] == ["--exit-times"]:
    times_file, args = args[1], args[2:]
commands, current = [], []
for arg in args:
    if arg == "---":
        commands.append(current)
        current = []
    else:
        current.append(arg)
commands.append(current)
procs = [subprocess.Popen(cmd) for cmd in commands]
node_of = {p.pid: i for i, p in enumerate(procs)}
exits, codes = [0.0] * len(procs), [0] * len(procs)
while node_of:
    pid, status = os.wait()  # whichever node ends first: each exit is timed when it happens
    if pid in node_of:
        i = node_of.pop(pid)
        exits[i], codes[i] = time.clock_gettime(time.CLOCK_MONOTONIC), os.waitstatus_to_exitcode(status)
if times_file:
    with open(times_file, "w") as f:
        json.dump({"exits": exits, "codes": codes}, f)
sys.exit(next((c if c > 0 else 128 - c for c in codes if c), 0))
