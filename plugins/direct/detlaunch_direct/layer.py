"""direct layer: each node's supervisor starts its ranks itself, with the environment torchrun gives them.

    supervisor -> rank wrapper -> script            (one per rank; no launcher process)

torchrun's agent, for a static job, only computes what detlaunch already knows (nodes, slots,
ranks, the chief) and then watches processes the supervisor already watches. This layer gives
each rank the variables torch's ``LocalElasticAgent._start_workers`` sets, with the same values
(``torch/distributed/elastic/agent/server/local_elastic_agent.py``, and ``run.py`` for
``OMP_NUM_THREADS``), so a script written for torchrun cannot tell the difference, but two:

- ``TORCHELASTIC_USE_AGENT_STORE=False``: no agent hosts the rendezvous store, so rank 0's
  ``init_process_group(init_method="env://")`` creates it on ``MASTER_PORT``, as torch does
  outside torchrun. The job link between the nodes' supervisors is the only other coordination.
- ``TORCHELASTIC_ERROR_FILE`` is a path in the job's private temp folder, as under torchrun,
  whose path also holds random folder names.

Built on the public detlaunch API only; importing it imports nothing heavy.
"""

from __future__ import annotations

import argparse
import os

from detlaunch import (
    CPUS_ENV,
    NUMA_BINDING_MODES,
    Check,
    Command,
    Config,
    ConfigError,
    RankWrapper,
    Stage,
    StageContext,
    check_port_free,
    cpu_sets,
    hookimpl,
)

NAME = "direct"
ROLE = "default"  # torchrun's --role default
RUN_ID = "none"  # torchrun's --rdzv-id default, which the torchrun layer keeps
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torch.distributed.elastic.multiprocessing's default

# Read by detlaunch's layer contract suite (detlaunch.testing): the supervisor starts the ranks.
DETLAUNCH_CONTRACT = {"rank_commands": True}


def master_addr(ctx: StageContext) -> str:
    """What torchrun is given by the torchrun layer, and passes on: on one node --master-addr or
    localhost, else the chief."""
    return (ctx.option("master_addr") or "localhost") if ctx.cluster.num_nodes == 1 else ctx.cluster.chief_addr


def rank_env(ctx: StageContext, local_rank: int) -> dict[str, str]:
    """The variables torchrun's agent sets for local rank `local_rank` of this node."""
    c, env = ctx.cluster, ctx.env
    rank = c.first_rank + local_rank
    result = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": str(c.node_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": ROLE,
        "LOCAL_WORLD_SIZE": str(c.local_slots),
        "WORLD_SIZE": str(c.total_slots),
        "GROUP_WORLD_SIZE": str(c.num_nodes),
        "ROLE_WORLD_SIZE": str(c.total_slots),
        "MASTER_ADDR": master_addr(ctx),
        "MASTER_PORT": str(ctx.option("master_port")),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": RUN_ID,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": env.get("TORCHELASTIC_SIGNALS_TO_HANDLE", SIGNALS_TO_HANDLE),
        "TORCHELASTIC_ERROR_FILE": os.path.join(ctx.run_dir, "tmp", f"error-{local_rank}.json"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        # The torchrun layer points TMPDIR at the job's private folder: the same here.
        "TMPDIR": os.path.join(ctx.run_dir, "tmp"),
    }
    if "OMP_NUM_THREADS" not in env and c.local_slots > 1:
        result["OMP_NUM_THREADS"] = "1"  # torchrun's default, so that ranks do not fight for cores
    return result


def _stage(ctx: StageContext) -> Stage:
    if ctx.launcher_args:
        raise ConfigError(f"the {NAME} layer runs no launcher, so nothing takes {' '.join(ctx.launcher_args)!r}: "
                          "put the script's own arguments after it")
    envs = [rank_env(ctx, i) for i in range(ctx.cluster.local_slots)]
    mode = ctx.option("numa_binding")
    if mode:  # each rank's CPUs near its GPU, as torchrun's --numa-binding (its wrapper binds it)
        for env, cpus in zip(envs, cpu_sets(mode, ctx.cluster.local_slots, ctx.env), strict=True):
            env[CPUS_ENV] = cpus
    ranks = tuple(Command(ctx.rank_command, rank=ctx.cluster.first_rank + i, env=env) for i, env in enumerate(envs))
    return Stage(commands=ranks)


@hookimpl
def detlaunch_add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(NAME)
    group.add_argument("--numa-binding", "--numa_binding", choices=NUMA_BINDING_MODES, default=None,
                       help="bind each rank to the CPUs near its GPU (or, without GPUs, to its share of the NUMA "
                            "nodes), as torchrun's --numa-binding: node, socket, exclusive or core-complex")


@hookimpl
def detlaunch_doctor_checks(config: Config) -> list[Check]:
    """torch with gloo, which the ranks import themselves (core checks the master port rank 0 binds)."""
    return Check.torch_distributed()


@hookimpl
def detlaunch_rank_wrappers(ctx: StageContext) -> RankWrapper:
    return RankWrapper(rank_env=("RANK",))


@hookimpl
def detlaunch_environment(ctx: StageContext) -> dict[str, str]:
    return {"USE_TORCH_DISTRIBUTED": "1"}


@hookimpl
def detlaunch_chief_stage(ctx: StageContext) -> Stage:
    # Rank 0 binds the rendezvous store on the master port: refuse a port in use while planning.
    host = (ctx.option("master_addr") or "127.0.0.1") if ctx.cluster.num_nodes == 1 else ctx.cluster.chief_addr
    check_port_free(host, ctx.option("master_port"))
    return _stage(ctx)


@hookimpl
def detlaunch_worker_stage(ctx: StageContext) -> Stage:
    return _stage(ctx)
