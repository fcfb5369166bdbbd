"""A real ZeRO-2 training of a small model with deepspeed on CPU: deepspeed.initialize, backward, step.

"torch_adam": true keeps deepspeed from JIT-compiling its CPU Adam op (a minute or more, silently:
docs/LAUNCHER_FLAGS.md). Prints the first and last loss and a checksum of the parameters, which
ZeRO-2 keeps identical on every rank. With --deepspeed_config FILE it goes the way of DeepSpeed's
own test model: deepspeed.add_config_arguments, and deepspeed.initialize(args=...), which checks
--local_rank against LOCAL_RANK.
"""

import argparse
import os

import deepspeed
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--steps", type=int, default=30)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()
assert args.local_rank == int(os.environ["LOCAL_RANK"]), (args.local_rank, os.environ["LOCAL_RANK"])
world = int(os.environ["WORLD_SIZE"])
rank = int(os.environ["RANK"])

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
config = {  # the --deepspeed_config file the test writes holds the same
    "train_micro_batch_size_per_gpu": 16,
    "train_batch_size": 16 * world,
    "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
    "zero_optimization": {"stage": 2},
}
if args.deepspeed_config:
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
else:
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
assert engine.zero_optimization_stage() == 2
target = torch.randn(8, 1, generator=torch.Generator().manual_seed(1))
data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
losses = []
for _ in range(args.steps):
    x = torch.randn(16, 8, generator=data)
    loss = torch.nn.functional.mse_loss(engine(x), x @ target)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
checksum = sum(p.detach().double().sum().item() for p in engine.module.parameters())
print(f"rank {rank} of {world}: zero stage 2, loss {losses[0]:.4f} -> {losses[-1]:.4f}, params {checksum:.6f}")
# Without it, torch's exit can abort ("terminate called without an active exception", SIGABRT) while
# a process-group thread is still joinable: seen once in CI after both ranks had printed their result.
torch.distributed.destroy_process_group()
