"""A tiny horovod job: every rank allreduces its rank number (horovod.torch, gloo, CPU).

    detlaunch --layer horovod --nproc-per-node 2 examples/hvd_allreduce.py
"""

import os

import horovod.torch as hvd
import torch


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    total = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum)
    expected = size * (size - 1) / 2
    assert total.item() == expected, (total.item(), expected)
    print(f"rank {rank} of {size}: hvd.allreduce sum = {total.item():g} (chief {os.environ.get('DET_CHIEF_IP')})")
    hvd.shutdown()


if __name__ == "__main__":
    main()
