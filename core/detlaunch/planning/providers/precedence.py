"""Which scheduler's provider answers: forced by --cluster, else the first present, in `SCHEDULERS` order.

Determined can run inside SLURM or Kubernetes, and SLURM users often export MASTER_ADDR/WORLD_SIZE
for torch, so a later scheduler defers to an earlier one whose variables are present; a nested
detlaunch (DET_CHIEF_IP set) lets none answer unless forced. Each provider asks `should_answer`.
"""


from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from detlaunch.errors import ConfigError
from detlaunch.planning.config import Config
from detlaunch.planning.plugin_manager import disabled_names

SCHEDULERS = ("determined", "slurm", "kubernetes")
HOST_FLAGS = (("hosts", "--hosts"), ("hostfile", "--hostfile"), ("nnodes", "--nnodes"),
              ("node_rank", "--node-rank"), ("master_addr", "--master-addr"))


# What each scheduler is recognised by: its providers read the rest of its variables.
DETERMINED_INFO_ENV = "DET_CLUSTER_INFO"
DETERMINED_DEFAULT_INFO = "/run/determined/info/cluster.json"
KUBERNETES_CHIEF_VARS = ("MASTER_ADDR", "PET_MASTER_ADDR")
KUBERNETES_NNODES_VARS = ("NNODES", "PET_NNODES", "GROUP_WORLD_SIZE", "WORLD_SIZE")


def first_set(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    """The first of `names` set (not blank) in env."""
    return next((n for n in names if env.get(n, "").strip()), None)


def determined_present(env: Mapping[str, str]) -> bool:
    """Inside a Determined task: the harness's cluster info file exists (or DET_CLUSTER_INFO is set)."""
    return bool(env.get(DETERMINED_INFO_ENV)) or os.path.exists(DETERMINED_DEFAULT_INFO)


def slurm_present(env: Mapping[str, str]) -> bool:
    """Inside a SLURM job: sbatch, salloc and srun all set the job id."""
    return bool(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))


def kubernetes_present(env: Mapping[str, str]) -> bool:
    """A chief address and a node count: the least a torch-style job environment sets."""
    return first_set(env, KUBERNETES_CHIEF_VARS) is not None and first_set(env, KUBERNETES_NNODES_VARS) is not None


PRESENT: dict[str, Callable[[Mapping[str, str]], bool]] = {
    "determined": determined_present, "slurm": slurm_present, "kubernetes": kubernetes_present}


def outranked_by(name: str, env: Mapping[str, str]) -> str | None:
    """The built-in scheduler before `name` whose environment is present here, if any."""
    disabled = disabled_names(env)
    for earlier in SCHEDULERS[: SCHEDULERS.index(name)]:
        if earlier not in disabled and PRESENT[earlier](env):
            return earlier
    return None


def should_answer(config: Config, name: str, present: bool) -> bool:
    """Whether provider `name` answers: forced by --cluster, or present and not outranked.

    When forced, a host flag is a contradiction the user must resolve (static, which
    would read it, does not run when another provider is forced).
    """
    forced = config.options.get("cluster")
    if forced is not None:
        if forced != name:
            return False
        given = [flag for dest, flag in HOST_FLAGS if config.options.get(dest) not in (None, "")]
        if given:
            raise ConfigError(f"--cluster {name} takes the nodes from {name}, but {given[0]} was given "
                              f"too: drop {given[0]}, or drop --cluster to use the flags")
        return True
    if nested(config.env):
        return False
    return present and outranked_by(name, config.env) is None


def nested(env: Mapping[str, str]) -> bool:
    """Started inside another launch layer's job, whose scheduler variables it merely inherited."""
    return bool(env.get("DET_CHIEF_IP"))


def shown(env: Mapping[str, str], name: str, limit: int = 80) -> str:
    """``NAME=value`` for ClusterInfo.sources, shortened when the value is long."""
    value = env.get(name, "")
    if len(value) > limit:
        value = value[: limit - 3] + "..."
    return f"{name}={value}"


def job_id_override(config: Config) -> str | None:
    """The job id the user set (``--job-id`` or ``DETLAUNCH_JOB_ID``), which beats the scheduler's."""
    value = config.options.get("job_id") or config.env.get("DETLAUNCH_JOB_ID")
    return str(value) if value else None
