"""A horovod training script written the way horovod's PyTorch MNIST example is (not a copy): hvd.init,
a DataLoader with a DistributedSampler of hvd.size() replicas, a small conv net, hvd.DistributedOptimizer,
parameters and optimizer state broadcast from rank 0, a few epochs, a test pass whose loss and accuracy are averaged
over the ranks with hvd.allreduce. The data are synthetic MNIST-shaped images (labels a fixed function of
the pixels, so the net can learn them); only the device is CPU (gloo)."""

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = torch.nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = torch.nn.Linear(320, 50)
        self.fc2 = torch.nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        return F.log_softmax(self.fc2(F.relu(self.fc1(x.view(-1, 320)))), dim=1)


def synthetic_mnist(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 1, 28, 28, generator=generator)
    labels = (images.view(n, -1) @ torch.randn(784, 10, generator=torch.Generator().manual_seed(0))).argmax(1)
    return TensorDataset(images, labels)


def metric_average(value: float, name: str) -> float:
    return float(hvd.allreduce(torch.tensor(value), name=name).item())  # averages over the ranks


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(hvd.rank())  # different on purpose: the broadcast must make them equal
    train, test = synthetic_mnist(512, seed=1), synthetic_mnist(128, seed=2)
    train_sampler = DistributedSampler(train, num_replicas=hvd.size(), rank=hvd.rank())
    test_sampler = DistributedSampler(test, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    train_loader = DataLoader(train, batch_size=32, sampler=train_sampler)
    test_loader = DataLoader(test, batch_size=64, sampler=test_sampler)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.5)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    steps = 0
    for epoch in range(2):
        train_sampler.set_epoch(epoch)
        model.train()
        for data, target in train_loader:
            optimizer.zero_grad()
            F.nll_loss(model(data), target).backward()
            optimizer.step()
            steps += 1
    model.eval()
    loss = correct = 0.0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            loss += float(F.nll_loss(output, target, reduction="sum"))
            correct += float(output.argmax(1).eq(target).sum())
    loss = metric_average(loss / len(test_sampler), "avg_loss")
    accuracy = metric_average(correct / len(test_sampler), "avg_accuracy")
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    same = bool(torch.allclose(hvd.allreduce(weights, name="weights"), weights, atol=1e-6))
    print(f"rank {hvd.rank()}/{hvd.size()}: {steps} steps, test set: average loss {loss:.4f}, "
          f"accuracy {100 * accuracy:.1f}%, same weights: {same}", flush=True)


if __name__ == "__main__":
    main()
