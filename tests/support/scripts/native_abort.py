"""A rank that dies as torch's NCCL watchdog kills one: a recorded stderr text, then SIGABRT (os.abort()).

argv[1]: what each attempt does, comma-separated (by DETLAUNCH_RESTART_COUNT; the last one repeats):
a recorded text's path (tests/support/native_stderr/*.txt) to print and abort, or "ok" to exit 0.
"""

import os
import sys

plan = sys.argv[1].split(",")
attempt = int(os.environ.get("DETLAUNCH_RESTART_COUNT", "0"))
step = plan[min(attempt, len(plan) - 1)]
if step == "ok":
    print(f"attempt {attempt + 1} ok", flush=True)
    sys.exit(0)
with open(step) as recorded:
    sys.stderr.write(recorded.read())
sys.stderr.flush()
os.abort()
