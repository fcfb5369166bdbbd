"""horovod twin of collective.py: survivors sit in hvd.allreduce while FAIL_RANK exits FAIL_CODE."""

import os
import sys

import horovod.torch as hvd
import torch

hvd.init()
rank = hvd.rank()
hvd.allreduce(torch.zeros(1), name="warmup")
if os.environ.get("FAIL_RANK") == str(rank):
    print(f"rank {rank} waiting", flush=True)
    with open(os.environ["TRIGGER"], "rb") as fifo:
        fifo.read(1)
    print(f"something broke in rank {rank}", file=sys.stderr, flush=True)
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
print(f"rank {rank} sleeping", flush=True)  # the survivors' last line: inside the collective
hvd.allreduce(torch.ones(1), name="stuck")
print(f"rank {rank} done", flush=True)
