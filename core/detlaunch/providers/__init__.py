"""Cluster discovery where users run: one provider per scheduler, each its own always-on plugin.

Every provider implements ``detlaunch_discover_cluster(config)`` (a firstresult hook) and
is registered through the ``detlaunch.plugins`` entry point group, exactly as a third
party would add LSF or PBS. A provider answers only when its own variables are present
(or when ``--cluster NAME`` names it), and returns None otherwise.

Order, first answer wins (docs/DISCOVERY.md says the same for users):

1. ``static`` (tryfirst, core): ``--hosts``/``--hostfile``, or torchrun-style
   ``--nnodes``/``--node-rank``/``--master-addr``. What the user typed describes the
   whole cluster; no scheduler variable is merged into it.
2. Schedulers, most specific first: ``determined`` (its cluster info file), ``slurm``
   (``SLURM_JOB_ID``), ``kubernetes`` (``MASTER_ADDR`` + ``NNODES``/``WORLD_SIZE``...).
   Determined can run inside SLURM or Kubernetes, and SLURM users often export
   ``MASTER_ADDR``/``WORLD_SIZE`` for torch, so a later one defers to an earlier one whose
   variables are present. That rule lives here (:data:`SCHEDULERS`), not in pluggy's
   registration order, which follows entry point names.
3. ``local`` (trylast, core): this machine alone.

A detlaunch started inside another launch layer's job (``DET_CHIEF_IP`` is set, as
every layer exports it) is nested: the scheduler variables it sees were inherited from
the outer job (a torchrun rank has ``MASTER_ADDR``/``WORLD_SIZE``, a SLURM task its
``SLURM_*``), so no scheduler answers unless forced, and local trusts ``DET_CHIEF_IP``.

Precedence when sources disagree: ``--cluster NAME`` forces one provider (and a host
flag given with it is an error, not silently ignored); inside a scheduler provider, a flag
beats the scheduler's variable for what the flag names (``--nproc-per-node`` for slots,
``--job-id``/``DETLAUNCH_JOB_ID`` for the job id, ``--node-addr`` for this node's
address), and ``ClusterInfo.sources`` says which one won.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..config import Config
from ..errors import ConfigError
from ..plugins import disabled_names

SCHEDULERS = ("determined", "slurm", "kubernetes")
HOST_FLAGS = (("hosts", "--hosts"), ("hostfile", "--hostfile"), ("nnodes", "--nnodes"),
              ("node_rank", "--node-rank"), ("master_addr", "--master-addr"))


def _detectors() -> dict[str, Callable[[Mapping[str, str]], bool]]:
    from . import determined, kubernetes, slurm  # here: those modules import this one

    return {"determined": determined.present, "slurm": slurm.present, "kubernetes": kubernetes.present}


def outranked_by(name: str, env: Mapping[str, str]) -> str | None:
    """The built-in scheduler before `name` whose environment is present here, if any."""
    detectors, disabled = _detectors(), disabled_names(env)
    for earlier in SCHEDULERS[: SCHEDULERS.index(name)]:
        if earlier not in disabled and detectors[earlier](env):
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
