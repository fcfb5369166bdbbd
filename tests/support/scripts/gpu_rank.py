"""Attempt 1: each rank says its pid, waits for the file GO, then fails (exit 3). Attempt 2: each rank says
when it started. With a stub nvidia-smi (tests/support/nvidia_smi.py) that lists attempt 1's pids.

    gpu_rank.py GO
"""

import os
import sys
import time

go = sys.argv[1]
rank, attempt = int(os.environ["RANK"]), int(os.environ["DETLAUNCH_RESTART_COUNT"]) + 1
if attempt > 1:
    print(f"rank {rank} attempt {attempt} starts at {time.time():.6f}", flush=True)
    sys.exit(0)
print(f"rank {rank} pid {os.getpid()}", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
sys.exit(3)
