"""torchrun layer: every node runs ``torch.distributed.run`` with the rank wrapper in front of the script.

As Determined's torch_distributed layer does with pid_client + wrap_rank: the
launcher is the same on the chief and on workers; only --node-rank differs.
Built on the public detlaunch API only. Importing it does not import torch.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from detlaunch import (
    Check,
    Command,
    Config,
    RankWrapper,
    Stage,
    StageContext,
    check_port_free,
    hookimpl,
)
from detlaunch.launcher_flags import add_launcher_flags, check_launcher_args

from .flags import TABLE

NAME = "torchrun"
# torchrun's own restarts are per node (pytorch/pytorch#108158): detlaunch's --max-restarts restarts the
# whole job (torchrun's spelling maps onto it, see flags.py), so torchrun itself runs with --max-restarts 0.
# torchrun SIGKILLs its workers (the rank wrappers) this long after its own SIGTERM to them (30 s by default,
# detlaunch's grace too): set past detlaunch's --grace-period (torchrun's --shutdown-timeout maps onto it), so
# that detlaunch's deadline is the one that counts, and its report says what it did.
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
SHUTDOWN_AFTER_GRACE = 5  # seconds


def torchrun_argv(ctx: StageContext) -> list[str]:
    """The torchrun command for this node; torchrun's own flags come before ``--no-python``."""
    c = ctx.cluster
    master = (ctx.option("master_addr") or "localhost") if c.num_nodes == 1 else c.chief_addr
    argv = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(c.num_nodes),
        "--nproc-per-node", str(c.local_slots),
        "--node-rank", str(c.node_rank),
        "--master-addr", master,
        "--master-port", str(ctx.option("master_port")),
        "--max-restarts", "0",
    ]
    if c.num_nodes > 1 and c.node_addr:
        argv += ["--local-addr", c.node_addr]
    argv += list(ctx.launcher_args)
    argv += ["--no-python", *ctx.rank_command]
    return argv


def _stage(ctx: StageContext) -> Stage:
    check_launcher_args(TABLE, ctx.launcher_args, NAME)
    # torchrun leaves torchelastic_* folders in the temp dir: give it the job's private one.
    tmp = os.path.join(ctx.run_dir, "tmp")
    # With restarts on, the next attempt's torchrun waits ahead of time, past `import torch`.
    shutdown = math.ceil(float(ctx.option("grace_period") or 0)) + SHUTDOWN_AFTER_GRACE
    env = {"TMPDIR": tmp, SHUTDOWN_TIMEOUT_ENV: str(shutdown)}
    return Stage(commands=(Command(tuple(torchrun_argv(ctx)), name=NAME, env=env,
                                   standby="torch.distributed.run:main"),))


@hookimpl
def detlaunch_add_options(parser: argparse.ArgumentParser) -> None:
    add_launcher_flags(parser, TABLE, NAME)


@hookimpl
def detlaunch_doctor_checks(config: Config) -> list[Check]:
    return Check.torch_distributed()


def import_time_env(ctx: StageContext) -> dict[str, str]:
    """What torchrun adds to its workers' environment that torch reads at import: OMP_NUM_THREADS=1 for
    more than one worker a node where it is unset (torch/distributed/run.py). The rest it adds (RANK,
    LOCAL_RANK, MASTER_*, TORCHELASTIC_*...) is read later, in the rank: warm ranks (RankWrapper.warm_env)."""
    if "OMP_NUM_THREADS" not in ctx.env and ctx.cluster.local_slots > 1:
        return {"OMP_NUM_THREADS": "1"}
    return {}


@hookimpl
def detlaunch_rank_wrappers(ctx: StageContext) -> RankWrapper:
    return RankWrapper(rank_env=("RANK",), warm_env=import_time_env(ctx))


@hookimpl
def detlaunch_environment(ctx: StageContext) -> dict[str, str]:
    return {"USE_TORCH_DISTRIBUTED": "1"}


@hookimpl
def detlaunch_chief_stage(ctx: StageContext) -> Stage:
    host = (ctx.option("master_addr") or "127.0.0.1") if ctx.cluster.num_nodes == 1 else ctx.cluster.chief_addr
    check_port_free(host, ctx.option("master_port"))
    return _stage(ctx)


@hookimpl
def detlaunch_worker_stage(ctx: StageContext) -> Stage:
    return _stage(ctx)
