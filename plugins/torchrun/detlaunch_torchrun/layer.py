"""torchrun layer: every node runs ``torch.distributed.run`` with the rank wrapper in front of the script.

As Determined's torch_distributed layer does with pid_client + wrap_rank: the
launcher is the same on the chief and on workers; only --node-rank differs.
Built on the public detlaunch API only. Importing it does not import torch.
"""

from __future__ import annotations

import os
import sys

from detlaunch import Command, ConfigError, RankWrapper, Stage, StageContext, check_port_free, hookimpl

NAME = "torchrun"
# torchrun's own restarts are per node (pytorch/pytorch#108158); detlaunch's --max-restarts restarts the
# whole job, so torchrun itself always runs with --max-restarts 0.
OWN_RESTART_FLAGS = ("--max-restarts", "--max_restarts")


def check_launcher_args(args: tuple[str, ...]) -> None:
    """Refuse torchrun's restart flag: it would be silently defeated by the job-wide stop on a failure."""
    for arg in args:
        if arg.split("=", 1)[0] in OWN_RESTART_FLAGS:
            raise ConfigError(f"{arg.split('=', 1)[0]} among torchrun's arguments: give detlaunch's "
                              "--max-restarts N (before the command, it restarts the whole job on every node)")


def torchrun_argv(ctx: StageContext) -> list[str]:
    """The torchrun command for this node; torchrun's own flags come before ``--no-python``."""
    c = ctx.cluster
    check_launcher_args(ctx.launcher_args)
    master = "localhost" if c.num_nodes == 1 else c.chief_addr
    argv = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(c.num_nodes),
        "--nproc-per-node", str(c.local_slots),
        "--node-rank", str(c.node_rank),
        "--master-addr", master,
        "--master-port", str(ctx.option("master_port", 29500)),
        "--max-restarts", "0",
    ]
    if c.num_nodes > 1 and c.node_addr:
        argv += ["--local-addr", c.node_addr]
    argv += list(ctx.launcher_args)
    argv += ["--no-python", *ctx.rank_command]
    return argv


def _stage(ctx: StageContext) -> Stage:
    # torchrun leaves torchelastic_* folders in the temp dir: give it the job's private one.
    tmp = os.path.join(ctx.run_dir, "tmp")
    return Stage(commands=(Command(tuple(torchrun_argv(ctx)), name=NAME, env={"TMPDIR": tmp}),))


@hookimpl
def detlaunch_rank_wrappers(ctx: StageContext) -> RankWrapper:
    return RankWrapper(rank_env=("RANK",))


@hookimpl
def detlaunch_environment(ctx: StageContext) -> dict[str, str]:
    return {"USE_TORCH_DISTRIBUTED": "1"}


@hookimpl
def detlaunch_chief_stage(ctx: StageContext) -> Stage:
    host = "127.0.0.1" if ctx.cluster.num_nodes == 1 else ctx.cluster.chief_addr
    check_port_free(host, ctx.option("master_port", 29500))
    return _stage(ctx)


@hookimpl
def detlaunch_worker_stage(ctx: StageContext) -> Stage:
    return _stage(ctx)
