"""Runs one command per "node" side by side (a two-node job on one machine); exits when all have.

    nodes.py CMD1... --- CMD2... [--- ...]

Exit code: the first non-zero one, in node order (0 when all succeed).
"""

import subprocess
import sys

commands, current = [], []
for arg in sys.argv[1:]:
    if arg == "---":
        commands.append(current)
        current = []
    else:
        current.append(arg)
commands.append(current)
procs = [subprocess.Popen(cmd) for cmd in commands]
codes = [p.wait() for p in procs]
sys.exit(next((c if c > 0 else 128 - c for c in codes if c), 0))
