"""horovod twin of tests/support/scripts/hang.py (HANG=sleep): rank 1 sleeps 300 s before a collective."""

import time

import horovod.torch as hvd
import torch

hvd.init()
rank = hvd.rank()
for step in range(10):
    hvd.allreduce(torch.ones(1), name=f"step{step}")
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(0.05)
if rank == 1:
    time.sleep(300)
hvd.allreduce(torch.ones(1), name="stuck")
print(f"rank {rank} done", flush=True)
