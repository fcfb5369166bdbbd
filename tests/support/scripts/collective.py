"""A rank that sits inside a gloo all_reduce while FAIL_RANK (after the TRIGGER fifo) exits FAIL_CODE."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=600))
rank = dist.get_rank()
dist.barrier()
if os.environ.get("FAIL_RANK") == str(rank):
    print(f"rank {rank} waiting", flush=True)
    with open(os.environ["TRIGGER"], "rb") as fifo:
        fifo.read(1)
    print(f"something broke in rank {rank}", file=sys.stderr, flush=True)
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
print(f"rank {rank} sleeping", flush=True)  # the survivors' last line: inside the collective
dist.all_reduce(torch.ones(1))
print(f"rank {rank} done", flush=True)
