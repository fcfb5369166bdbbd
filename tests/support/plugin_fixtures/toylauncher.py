"""The toy layer's launcher: toylauncher.py FIRST_RANK COUNT -- COMMAND...

Starts COUNT copies of COMMAND with TOY_RANK=FIRST_RANK.., forwards SIGTERM/SIGINT to them,
and exits with the first non-zero exit code (0 when every rank succeeded).
"""

import os
import signal
import subprocess
import sys

first, count = int(sys.argv[1]), int(sys.argv[2])
command = sys.argv[sys.argv.index("--") + 1:]
children = [subprocess.Popen(command, env={**os.environ, "TOY_RANK": str(first + i)}) for i in range(count)]


def forward(signum, _frame):
    for child in children:
        if child.poll() is None:
            child.send_signal(signum)


signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
codes = [child.wait() for child in children]
sys.exit(next((c if c > 0 else 128 - c for c in codes if c != 0), 0))
