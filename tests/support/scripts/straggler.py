"""Synchronous steps in a gloo group: each rank's work in detlaunch.section("step"), then an all_reduce.

SLOW_RANK's work takes twice as long (WORK_S each step; WORK=spin: a busy loop, so a CPU quota
slows it; else sleep). NO_SECTIONS=1: the same work, untimed (detlaunch judges by CPU time).
Every rank prints "rank R step N at T" (wall time). The job stops, on every rank at the same step,
once the STOP file exists (rank 0 sees it; the all_reduce tells the others) or after MAX_STEPS.
"""

import contextlib
import os
import time
from datetime import timedelta

import detlaunch
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank = dist.get_rank()
work = float(os.environ.get("WORK_S", "0.1")) * (2 if str(rank) == os.environ.get("SLOW_RANK") else 1)
spin = os.environ.get("WORK") == "spin"
stop = os.environ.get("STOP", "")
timed = contextlib.nullcontext if os.environ.get("NO_SECTIONS") else detlaunch.section
flag = torch.zeros(1)
for step in range(int(os.environ.get("MAX_STEPS", "200"))):
    with timed("step"):
        if spin:
            end = time.thread_time() + work  # CPU time: under a quota, wall time stretches
            while time.thread_time() < end:
                pass
        else:
            time.sleep(work)
    flag[0] = 1.0 if rank == 0 and stop and os.path.exists(stop) else 0.0
    dist.all_reduce(flag)
    detlaunch.progress(step)
    print(f"rank {rank} step {step} at {time.time():.3f}", flush=True)
    if flag[0] > 0:
        break
dist.destroy_process_group()
