"""Every rank does a real collective (gloo all_reduce; horovod's allreduce under horovodrun), prints its result,
and rank ABORT_RANK (default 1) then crashes in Python's teardown for sure: a C exit handler (on_exit(3)) that
aborts once Python has finalized, as torch's gloo threads abort a rank about 1 run in 6."""

import ctypes
import os

import torch

if "HOROVOD_RANK" in os.environ:  # horovodrun
    import horovod.torch as hvd

    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    total = int(hvd.allreduce(torch.ones(1), op=hvd.Sum).item())
else:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ones = torch.ones(1)
    dist.all_reduce(ones)
    total = int(ones.item())
    dist.destroy_process_group()
print(f"rank {rank} of {world}: sum {total}", flush=True)
if rank == int(os.environ.get("ABORT_RANK", "1")):
    libc = ctypes.CDLL(None)
    libc.on_exit(libc.abort, None)
