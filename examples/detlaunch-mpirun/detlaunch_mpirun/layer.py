"""mpirun layer: ``detlaunch --layer mpirun`` runs the ranks with Open MPI's ``mpirun`` on one node.

    supervisor -> mpirun --allow-run-as-root --oversubscribe --bind-to none -np N -> rank wrapper -> script

- The rank comes from ``OMPI_COMM_WORLD_RANK`` (Open MPI sets it for each process it starts).
- ``--allow-run-as-root``: mpirun refuses to run as root without it (containers often are root).
- ``--oversubscribe``: more ranks than cores is allowed (a CPU test job); ``--bind-to none``: the
  default core binding would pin oversubscribed ranks to the same cores (``--mpi-bind-to`` changes it).
- Stop signal: SIGTERM. mpirun answers SIGTERM (or SIGINT) by sending SIGTERM to every process
  it started, SIGKILL after a short grace, and removing its session directory. SIGKILL would
  leave both behind: orphaned ranks (the supervisor reaps them, but late) and an ``ompi.*``
  session folder in TMPDIR, which is why TMPDIR is also pointed at the job's private folder.
- Fail-fast: when a rank exits non-zero, its wrapper has already told the supervisor (whose
  report wins); mpirun aborts the other ranks on its own too.
- One node only: Open MPI reaches other nodes through ssh and its own ``orted`` daemons, which
  this small example does not set up. A job of several nodes is refused in one line, and the
  contract suite is told so through ``DETLAUNCH_CONTRACT``.

Imports nothing but the public ``detlaunch`` API and the standard library.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal

from detlaunch import Command, ConfigError, RankWrapper, Stage, StageContext, hookimpl

NAME = "mpirun"
RANK_ENV = ("OMPI_COMM_WORLD_RANK",)
BIND_CHOICES = ("none", "hwthread", "core", "l1cache", "l2cache", "l3cache", "socket", "numa", "board")

# Read by detlaunch's layer contract suite (detlaunch.testing): what this layer cannot do.
DETLAUNCH_CONTRACT = {"multi_node": False, "needs": ("mpirun",)}


def mpirun_argv(mpirun: str, ranks: int, bind_to: str, launcher_args: tuple[str, ...],
                rank_command: tuple[str, ...]) -> tuple[str, ...]:
    """The mpirun command for `ranks` local ranks; the user's launcher arguments come before the ranks'."""
    return (mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", bind_to, "-np", str(ranks),
            *launcher_args, *rank_command)


def _one_node_only(ctx: StageContext) -> ConfigError:
    return ConfigError(f"the {NAME} layer runs on one node, but this job has {ctx.cluster.num_nodes}: "
                       "use --layer horovod or --layer deepspeed for several nodes")


def _mpirun(ctx: StageContext) -> str:
    found = shutil.which("mpirun", path=ctx.env.get("PATH", os.defpath))
    if found is None:
        raise ConfigError("the mpirun layer needs Open MPI's mpirun on PATH (Debian: apt-get install openmpi-bin)")
    return found


@hookimpl
def detlaunch_add_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("mpirun layer (also read from the config file's [mpirun] section)")
    g.add_argument("--mpi-bind-to", choices=BIND_CHOICES, default="none",
                   help="mpirun --bind-to (default none: ranks may outnumber cores)")


@hookimpl
def detlaunch_rank_wrappers(ctx: StageContext) -> RankWrapper:
    return RankWrapper(rank_env=RANK_ENV)


@hookimpl
def detlaunch_environment(ctx: StageContext) -> dict[str, str]:
    # Python ranks fork (data loader workers); Open MPI warns about every fork unless told not to.
    return {"OMPI_MCA_mpi_warn_on_fork": "0"}


@hookimpl
def detlaunch_chief_stage(ctx: StageContext) -> Stage:
    if ctx.cluster.num_nodes > 1:
        raise _one_node_only(ctx)
    argv = mpirun_argv(_mpirun(ctx), ctx.cluster.local_slots, ctx.option("mpi_bind_to", "none"),
                       ctx.launcher_args, ctx.rank_command)
    mpirun = Command(argv, name=NAME, stop_signal=signal.SIGTERM, env={"TMPDIR": os.path.join(ctx.run_dir, "tmp")})
    # Inside a SLURM allocation, SLURM_JOBID would make mpirun start the ranks through srun.
    return Stage(commands=(mpirun,), unset_env=("SLURM_JOBID",))


@hookimpl
def detlaunch_worker_stage(ctx: StageContext) -> Stage:
    raise _one_node_only(ctx)  # a node rank > 0 means a job of several nodes
