"""A DDP training script written the way PyTorch's DDP tutorials write them (not a copy of any):
env:// rendezvous from torchrun's variables, LOCAL_RANK for the device, a DistributedSampler over
a synthetic dataset, DDP-wrapped model, a few epochs; every rank checks it ends with the same weights.
Runs unchanged under any launcher that sets torchrun's environment; only the device is CPU (gloo)."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    dist.init_process_group(backend="gloo")  # nccl on GPUs; nothing else changes
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    inputs = torch.randn(256, 20)
    data = TensorDataset(inputs, inputs @ torch.randn(20, 1))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DDP(torch.nn.Linear(20, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    first = last = None
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            first = float(loss) if first is None else first
            last = float(loss)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    same = all(torch.equal(g, weights) for g in gathered)
    print(f"rank {rank}/{world} local {local_rank}: loss {first:.3f} -> {last:.3f}, same weights: {same}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
