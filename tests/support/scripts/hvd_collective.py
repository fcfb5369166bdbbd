"""horovod twin of collective.py: survivors sit in hvd.allreduce while FAIL_RANK dies with FAIL_CODE.

The failing rank leaves with os._exit, as a crash would. With sys.exit, horovod's atexit
shutdown tells every other rank first ("Horovod has been shut down"): they fail and end
while the failing rank is still shutting down, so the first rank to END is a survivor.
"""

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
    os._exit(int(os.environ.get("FAIL_CODE", "3")))
print(f"rank {rank} sleeping", flush=True)  # the survivors' last line: inside the collective
hvd.allreduce(torch.ones(1), name="stuck")
print(f"rank {rank} done", flush=True)
