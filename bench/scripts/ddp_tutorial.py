"""PyTorch's DDP tutorial script (examples/distributed/ddp-tutorial-series/multinode.py), on CPU, with a crash.

The same structure as the tutorial's multinode.py: torchrun's environment, a Trainer that wraps a
Linear(20, 1) in DDP, a DistributedSampler over a synthetic dataset (its datautils.MyTrainDataset), a
snapshot every `save_every` epochs. The differences: gloo instead of nccl, CPU instead of cuda:LOCAL_RANK,
the snapshot in a given folder, and a crash: with --fail-rank R --fail-epoch E, rank R writes the
CLOCK_MONOTONIC time to --exit-time just before it calls os._exit(3) at the start of epoch E (the case
of issue 23: the other ranks, in a collective, see "Connection reset by peer" and die by themselves).

    torchrun --nproc-per-node 2 ddp_tutorial.py 5 1 --fail-rank 1 --fail-epoch 2 --exit-time DIR/exit-time
"""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup():
    init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path, fail):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.fail = fail
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        rank, at_epoch, exit_time = self.fail
        if self.global_rank == rank and epoch == at_epoch:
            print(f"[CPU{self.global_rank}] failing at epoch {epoch}", file=sys.stderr, flush=True)
            if exit_time:
                with open(exit_time, "w") as f:
                    f.write(repr(time.clock_gettime(time.CLOCK_MONOTONIC)))
            os._exit(3)
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[CPU{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}", flush=True)
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.local_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    train_set = MyTrainDataset(2048)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, pin_memory=False, shuffle=False,
                      sampler=DistributedSampler(dataset))


def main(save_every, total_epochs, batch_size, snapshot_path, fail):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path, fail)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size on each device (default: 32)")
    parser.add_argument("--snapshot", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "snapshot.pt"))
    parser.add_argument("--fail-rank", type=int, default=-1, help="the rank that calls os._exit(3)")
    parser.add_argument("--fail-epoch", type=int, default=2, help="at the start of this epoch")
    parser.add_argument("--exit-time", default="", help="where it writes CLOCK_MONOTONIC just before")
    args, _ = parser.parse_known_args()  # deepspeed adds --local_rank
    main(args.save_every, args.total_epochs, args.batch_size, args.snapshot,
         (args.fail_rank, args.fail_epoch, args.exit_time))
