"""jax layer: ``detlaunch --layer jax`` starts each JAX process itself, with jax.distributed's variables.

    supervisor -> rank wrapper -> script          (one per slot; no launcher process)

JAX needs no launcher: every process calls ``jax.distributed.initialize()``, and process 0
hosts the coordinator the others connect to. So each node's supervisor starts the node's
processes itself, one ``Command(rank=N)`` per slot, each with:

- ``JAX_COORDINATOR_ADDRESS``: the chief's address and ``--master-port`` (process 0 listens there);
- ``JAX_NUM_PROCESSES``: every slot of the job; ``JAX_PROCESS_ID``: this process's global rank.

A script passes them on, ``jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"],
int(os.environ["JAX_NUM_PROCESSES"]), int(os.environ["JAX_PROCESS_ID"]))`` (recent JAX reads
them by itself). The rank wrapper reads the rank from ``JAX_PROCESS_ID``. Everything else
(prefixes, fail-fast, the report, signals, ``--dry-run``) is detlaunch's, as for any layer.

Imports nothing but the public ``detlaunch`` API (and never JAX: planning must stay cheap).
"""

from __future__ import annotations

from detlaunch import Command, RankWrapper, Stage, StageContext, check_port_free, hookimpl

RANK_ENV = ("JAX_PROCESS_ID",)

# Read by detlaunch's layer contract suite (detlaunch.testing): the supervisor starts the processes.
DETLAUNCH_CONTRACT = {"rank_commands": True}


def coordinator(ctx: StageContext) -> str:
    return f"{ctx.cluster.chief_addr}:{ctx.option('master_port')}"


def process_env(ctx: StageContext, rank: int) -> dict[str, str]:
    return {"JAX_COORDINATOR_ADDRESS": coordinator(ctx), "JAX_NUM_PROCESSES": str(ctx.cluster.total_slots),
            "JAX_PROCESS_ID": str(rank)}


def _stage(ctx: StageContext) -> Stage:
    c = ctx.cluster
    ranks = range(c.first_rank, c.first_rank + c.local_slots)
    return Stage(commands=tuple(Command(ctx.rank_command, rank=r, env=process_env(ctx, r)) for r in ranks))


@hookimpl
def detlaunch_rank_wrappers(ctx: StageContext) -> RankWrapper:
    return RankWrapper(rank_env=RANK_ENV)


@hookimpl
def detlaunch_chief_stage(ctx: StageContext) -> Stage:
    check_port_free(ctx.cluster.chief_addr, ctx.option("master_port"))  # process 0's coordinator
    return _stage(ctx)


@hookimpl
def detlaunch_worker_stage(ctx: StageContext) -> Stage:
    return _stage(ctx)
