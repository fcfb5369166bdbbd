"""A synchronous job's steps for bench/preflight.py: each step a fixed small matmul and an all_reduce in a gloo
group, inside `detlaunch.section("step")` or not (SECTIONS=0). Rank 0 prints the steps a second over the steps
after the warm-up (wall time: the job's throughput, the collective's wait included)."""

import contextlib
import os
import sys
import time

import detlaunch
import torch
import torch.distributed as dist

steps, warm = int(sys.argv[1]), 20
torch.set_num_threads(1)
dist.init_process_group("gloo")
timed = detlaunch.section if os.environ.get("SECTIONS", "1") == "1" else (lambda name: contextlib.nullcontext())
a, grad = torch.rand(96, 96), torch.zeros(1024)
for step in range(warm + steps):
    if step == warm:
        dist.barrier()
        start = time.perf_counter()
    with timed("step"):
        (a @ a).sum().item()
    dist.all_reduce(grad)
    detlaunch.progress(step)
seconds = time.perf_counter() - start
if dist.get_rank() == 0:
    print(f"steps/s {steps / seconds:.1f}", flush=True)
dist.destroy_process_group()
