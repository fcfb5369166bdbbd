"""A tiny torch.distributed job: every rank all_reduces its rank number with gloo on CPU.

    detlaunch --layer torchrun --nproc-per-node 2 examples/allreduce.py
"""

import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    expected = world * (world - 1) / 2
    assert t.item() == expected, (t.item(), expected)
    print(f"rank {rank} of {world}: all_reduce sum = {t.item():g} (chief {os.environ.get('DET_CHIEF_IP')})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
