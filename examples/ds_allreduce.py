"""A tiny DeepSpeed job: every rank all_reduces its rank number through deepspeed.comm (CPU, gloo).

    detlaunch --layer deepspeed --nproc-per-node 2 examples/ds_allreduce.py
"""

import os

import deepspeed
import deepspeed.comm as dist
import torch


def main() -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    expected = world * (world - 1) / 2
    assert t.item() == expected, (t.item(), expected)
    print(f"rank {rank} of {world}: deepspeed.comm.all_reduce sum = {t.item():g} "
          f"(chief {os.environ.get('DET_CHIEF_IP')})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
