"""A horovod benchmark written the way horovod's synthetic benchmark is (not a copy): hvd.init, a
model on synthetic batches, hvd.DistributedOptimizer, parameters and optimizer state broadcast from
rank 0, timed iterations averaged over ranks with hvd.allreduce. Only the device is CPU (gloo)."""

import time

import horovod.torch as hvd
import torch


def main() -> None:
    hvd.init()
    torch.manual_seed(hvd.rank())  # different on purpose: the broadcast must make them equal
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    data, target = torch.randn(32, 64), torch.randint(0, 10, (32,))
    rates = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(4):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(data), target).backward()
            optimizer.step()
        rates.append(32 * 4 / (time.perf_counter() - start))
    mean = hvd.allreduce(torch.tensor(sum(rates) / len(rates)), name="rate").item()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    same = bool(torch.allclose(hvd.allreduce(weights, name="w"), weights, atol=1e-6))
    print(f"rank {hvd.rank()}/{hvd.size()}: {mean:.0f} samples/s per rank, same weights: {same}", flush=True)


if __name__ == "__main__":
    main()
