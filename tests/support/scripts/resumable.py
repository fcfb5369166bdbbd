"""A small data-parallel training loop that checkpoints every step and resumes: the restart tests' job.

Shared by resume_ddp.py (torch DDP over gloo) and resume_hvd.py (horovod); they differ only in
their collectives. The pattern is the torchrun tutorial's snapshot resume (pytorch/examples,
distributed/ddp-tutorial-series): load a snapshot if there is one, save one as training goes. Here
every rank saves its own (CKPT_DIR/rank-R.pt, written then renamed), so nodes need no shared
filesystem, and it does so every step.

A failure can be injected at the start of step N (--crash-step N) on one rank (--crash-rank R), on
the attempts listed in --crash-attempts (restart counts, read from DETLAUNCH_RESTART_COUNT, else
TORCHELASTIC_RESTART_COUNT; default "0": the first attempt only). Every step starts with a barrier,
so when a rank fails there, every rank has saved the step before: the next attempt resumes with all
checkpoints at the same step (it checks, and exits 1 saying so when they disagree).

Lines to assert on: "rank R attempt A starts at step S" and "rank R done: N steps, weights W"; the
weights of a job that failed and resumed equal those of one that never failed (the data of each
step depends on the step and the rank only).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import torch

CRASH_HOWS = ("exit", "raise", "kill", "hang", "import")


class Collectives(Protocol):
    rank: int

    def min(self, value: int) -> int: ...

    def barrier(self) -> None: ...

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]: ...


def restart_count() -> int:
    for name in ("DETLAUNCH_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        if os.environ.get(name):
            return int(os.environ[name])
    return 0


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--local_rank", type=int, help="passed by deepspeed's launcher (detlaunch --layer deepspeed too)")
    p.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR"),
                   help="where each rank keeps its checkpoint (default: $CKPT_DIR)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--crash-step", type=int, help="fail at the start of this step (1 is the first)")
    p.add_argument("--crash-rank", type=int, default=0)
    p.add_argument("--crash-attempts", default="0", help="restart counts that fail, comma-separated, or 'all'")
    p.add_argument("--crash-at", default="", help="RESTART_COUNT:RANK,...: the rank that fails on each of these "
                   "attempts (instead of --crash-rank and --crash-attempts)")
    p.add_argument("--crash-how", choices=CRASH_HOWS, default="exit",
                   help="exit with --crash-code, raise RuntimeError, SIGKILL itself, hang, or import a missing module")
    p.add_argument("--crash-code", default="3", help="exit code(s) for 'exit': one per attempt, the last repeats")
    p.add_argument("--show-world", action="store_true", help="also say the world each attempt sees, as torchrun's "
                   "elastic agent shows it (WORLD_SIZE, GROUP_WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RESTART_COUNT)")
    p.add_argument("--crash-message", default="injected failure at step {step}",
                   help="what the failure says; {step}, {rank} and {attempt} are filled in")
    opts = p.parse_args(argv)
    if not opts.ckpt_dir:
        p.error("give --ckpt-dir or set CKPT_DIR")
    return opts


def crash(opts: argparse.Namespace, rank: int, step: int, hard_exit: bool) -> None:
    """Fail as asked. hard_exit: leave with os._exit even for 'raise' (horovod's atexit shutdown would
    otherwise fail every other rank before this one has ended, and a survivor would look like the cause)."""
    attempt = restart_count() + 1
    message = opts.crash_message.format(step=step, rank=rank, attempt=attempt)
    print(f"rank {rank} attempt {attempt} fails at step {step} ({opts.crash_how})", flush=True)
    sys.stderr.flush()
    if opts.crash_how == "exit":
        codes = [int(c) for c in opts.crash_code.split(",")]
        print(message, file=sys.stderr, flush=True)
        os._exit(codes[min(attempt - 1, len(codes) - 1)])
    if opts.crash_how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if opts.crash_how == "hang":
        threading.Event().wait()
    try:
        if opts.crash_how == "import":
            __import__("a_module_this_job_forgot_to_install")
        raise RuntimeError(message)
    except Exception:
        if not hard_exit:
            raise
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def crashes_now(opts: argparse.Namespace, rank: int, step: int) -> bool:
    if opts.crash_at:
        return step == opts.crash_step and f"{restart_count()}:{rank}" in opts.crash_at.split(",")
    attempts = opts.crash_attempts.strip().lower()
    this = attempts == "all" or str(restart_count()) in attempts.split(",")
    return this and rank == opts.crash_rank and step == opts.crash_step


def train(opts: argparse.Namespace, comm: Collectives, after_load: Callable[[Any, Any], None] | None = None,
          hard_exit: bool = False) -> None:
    rank, attempt = comm.rank, restart_count() + 1
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    optimizer: Any = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = comm.wrap(net, optimizer)
    os.makedirs(opts.ckpt_dir, exist_ok=True)
    path = os.path.join(opts.ckpt_dir, f"rank-{rank}.pt")
    done = 0
    if os.path.exists(path):
        state = torch.load(path)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        done = state["step"]
    agreed = comm.min(done)
    if agreed != done:
        print(f"rank {rank}: checkpoints disagree: mine is at step {done}, another rank's at step {agreed}",
              file=sys.stderr, flush=True)
        sys.exit(1)
    if after_load is not None:
        after_load(net, optimizer)
    print(f"rank {rank} attempt {attempt} starts at step {done}", flush=True)
    if opts.show_world:
        world = " ".join(f"{k}={os.environ.get(k)}" for k in ("WORLD_SIZE", "GROUP_WORLD_SIZE", "GROUP_RANK",
                                                              "TORCHELASTIC_RESTART_COUNT"))
        print(f"rank {rank} attempt {attempt} world {world}", flush=True)
    for step in range(done + 1, opts.steps + 1):
        comm.barrier()  # every rank has saved step - 1
        if crashes_now(opts, rank, step):
            crash(opts, rank, step, hard_exit)
        data = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(8, 4, generator=data)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        loss.backward()
        optimizer.step()
        tmp = f"{path}.tmp"
        torch.save({"step": step, "model": net.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
        os.replace(tmp, path)
        print(f"rank {rank} step {step}/{opts.steps} loss {loss.item():.4f}", flush=True)
    weights = ",".join(f"{w:.6f}" for w in torch.cat([p.detach().flatten() for p in net.parameters()]).tolist())
    print(f"rank {rank} done: {opts.steps} steps, weights {weights}", flush=True)
