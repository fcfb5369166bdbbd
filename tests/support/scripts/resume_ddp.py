"""torch DDP (gloo) twin of resume_hvd.py: trains, checkpoints every step, resumes; see resumable.py.

    detlaunch --layer torchrun --nproc-per-node 2 tests/support/scripts/resume_ddp.py --ckpt-dir D \\
        [--crash-step 3 --crash-rank 1 --crash-how kill]
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from resumable import parse_options, train
from torch.nn.parallel import DistributedDataParallel


class Gloo:
    def __init__(self) -> None:
        dist.init_process_group("gloo")
        self.rank = dist.get_rank()

    def min(self, value: int) -> int:
        t = torch.tensor([value])
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def barrier(self) -> None:
        dist.barrier()

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        return DistributedDataParallel(model), optimizer


if __name__ == "__main__":
    options = parse_options()
    comm = Gloo()
    train(options, comm)
    dist.destroy_process_group()
