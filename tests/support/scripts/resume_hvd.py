"""horovod twin of resume_ddp.py: trains, checkpoints every step, resumes; see resumable.py.

    detlaunch --layer horovod --nproc-per-node 2 tests/support/scripts/resume_hvd.py --ckpt-dir D \\
        [--crash-step 3 --crash-rank 1 --crash-how kill]

After loading, rank 0's weights and optimizer state are broadcast, as horovod scripts do at start.
"""

from __future__ import annotations

from typing import Any

import horovod.torch as hvd
import torch
from resumable import parse_options, train


class Horovod:
    def __init__(self) -> None:
        hvd.init()
        self.rank = hvd.rank()

    def min(self, value: int) -> int:
        return int(hvd.allreduce(torch.tensor([value]), op=hvd.Min, name="resume_step").item())

    def barrier(self) -> None:
        hvd.barrier()

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        return model, hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def broadcast(model: torch.nn.Module, optimizer: Any) -> None:
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)


if __name__ == "__main__":
    train(parse_options(), Horovod(), after_load=broadcast, hard_exit=True)
