"""Kubernetes and torchelastic-style environments: MASTER_ADDR, node count, node rank.

PyTorchJob (Kubeflow), JobSet manifests and torchelastic agents describe a job with a
few variables, under several names. The first name that is set wins:

- chief: ``MASTER_ADDR``, ``PET_MASTER_ADDR`` (used as given: a Service name may not
  resolve until every pod is up, and torchrun resolves it itself, retrying).
- rendezvous port: ``MASTER_PORT``, ``PET_MASTER_PORT``; it becomes the default of
  ``--master-port`` (a flag or ``DETLAUNCH_MASTER_PORT`` still wins).
- node count: ``NNODES``, ``PET_NNODES``, ``GROUP_WORLD_SIZE``, ``WORLD_SIZE``.
  ``WORLD_SIZE`` comes last: PyTorchJob sets it to the number of pods only when
  each pod runs one process, and torchelastic sets it to the number of processes.
- node rank: ``NODE_RANK``, ``PET_NODE_RANK``, ``GROUP_RANK``, ``RANK``.
- slots: ``--nproc-per-node``, ``PET_NPROC_PER_NODE``, ``LOCAL_WORLD_SIZE``, one a
  GPU this pod may use (planning/gpus.py: ``NVIDIA_VISIBLE_DEVICES`` limits what a
  privileged pod's /dev/nvidiaN show), 1.

Only the chief's address is known (other pods' addresses are not in the environment);
this node's own is ``--node-addr`` when given. The job id is derived from the chief's
address, port, node count and any ``JOBSET_NAME``/``TORCHELASTIC_RUN_ID``, so every
pod computes the same one without talking to the others.

The provider answers when a chief address and a node count are set; with those but no
node rank, or with an elastic range (``NNODES=1:4``), it says so in one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping

from detlaunch.errors import ClusterError, ConfigError
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.config import Config
from detlaunch.planning.discovery import derived_job_id
from detlaunch.planning.gpus import one_per_gpu, visible_gpus
from detlaunch.planning.hookspecs import hookimpl
from detlaunch.planning.providers.precedence import KUBERNETES_CHIEF_VARS as CHIEF_VARS
from detlaunch.planning.providers.precedence import KUBERNETES_NNODES_VARS as NNODES_VARS
from detlaunch.planning.providers.precedence import first_set as _first
from detlaunch.planning.providers.precedence import job_id_override, nested, should_answer, shown
from detlaunch.planning.providers.precedence import kubernetes_present as present

NAME = "kubernetes"
PORT_VARS = ("MASTER_PORT", "PET_MASTER_PORT")
RANK_VARS = ("NODE_RANK", "PET_NODE_RANK", "GROUP_RANK", "RANK")
SLOTS_VARS = ("PET_NPROC_PER_NODE", "LOCAL_WORLD_SIZE")
JOB_NAME_VARS = ("JOBSET_NAME", "TORCHELASTIC_RUN_ID")




def _count(env: Mapping[str, str], var: str, minimum: int) -> int:
    text = env[var].strip()
    if ":" in text and var in NNODES_VARS:
        raise ClusterError(f"{var}={text} is an elastic range; detlaunch needs a fixed node count: "
                           f"set {var} to one number (e.g. {text.split(':')[-1]})")
    if not (text.isascii() and text.isdigit()) or int(text) < minimum:
        kind = "a positive integer" if minimum else "a non-negative integer"
        raise ClusterError(f"{var}={env[var]!r} is not {kind}")
    return int(text)


def rendezvous_port(env: Mapping[str, str]) -> tuple[int, str] | None:
    """(port, variable) from MASTER_PORT/PET_MASTER_PORT, when this is such an environment."""
    var = _first(env, PORT_VARS)
    if var is None or not present(env):
        return None
    text = env[var].strip()
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) <= 65535:
        raise ConfigError(f"{var}={env[var]!r} is not a port number (1-65535)")
    return int(text), var


def _slots(env: Mapping[str, str], nproc_per_node: int | None) -> tuple[int, str]:
    if nproc_per_node:
        return nproc_per_node, "--nproc-per-node"
    for var in SLOTS_VARS:
        text = env.get(var, "").strip()
        if text and text.isascii() and text.isdigit() and int(text) > 0:
            return int(text), shown(env, var)
        if text and text not in ("auto", "gpu", "cpu"):  # torchrun's own words mean "look at the machine"
            raise ClusterError(f"{var}={text!r} is not a number of ranks; fix it, or give --nproc-per-node N")
    return one_per_gpu(visible_gpus(env))


def read_torch_env(env: Mapping[str, str], nproc_per_node: int | None = None) -> ClusterInfo:
    """The job as this pod's variables describe it (pure: nothing is resolved or contacted)."""
    chief_var, nnodes_var = _first(env, CHIEF_VARS), _first(env, NNODES_VARS)
    if chief_var is None or nnodes_var is None:
        missing = "MASTER_ADDR" if chief_var is None else "NNODES (or WORLD_SIZE)"
        raise ClusterError(f"{missing} is not set: a Kubernetes/torchelastic job needs MASTER_ADDR, NNODES or "
                           "WORLD_SIZE, and NODE_RANK or RANK; or drop --cluster kubernetes")
    rank_var = _first(env, RANK_VARS)
    if rank_var is None:
        raise ClusterError(f"{shown(env, chief_var)} and {shown(env, nnodes_var)} are set, but no node rank: "
                           "set NODE_RANK (or RANK, GROUP_RANK) on every pod")
    nnodes = _count(env, nnodes_var, 1)
    node_rank = _count(env, rank_var, 0)
    if node_rank >= nnodes:
        raise ClusterError(f"{shown(env, rank_var)} is outside {shown(env, nnodes_var)} "
                           f"(valid node ranks: 0..{nnodes - 1})")
    chief = env[chief_var].strip()
    slots, slots_from = _slots(env, nproc_per_node)
    port_var = _first(env, PORT_VARS)
    names = [env[v] for v in JOB_NAME_VARS if env.get(v)]
    addrs: list[str | None] = [None] * nnodes
    addrs[0] = chief
    id_vars = [chief_var, *([port_var] if port_var else []), nnodes_var, *(v for v in JOB_NAME_VARS if env.get(v))]
    sources = {"nodes": shown(env, nnodes_var), "node_rank": shown(env, rank_var), "slots": slots_from,
               "chief": shown(env, chief_var), "job_id": "derived from " + ", ".join(id_vars)}
    return ClusterInfo(
        node_addrs=tuple(addrs), slots=(slots,) * nnodes, node_rank=node_rank, chief_addr=chief,
        job_id=derived_job_id(chief, env.get(port_var or "", ""), nnodes, *names), provider=NAME,
        sources=sources,
    )


class KubernetesProvider:
    """The ``kubernetes`` discovery provider (see the module docstring)."""

    name = NAME

    @hookimpl
    def detlaunch_add_options(self, parser: argparse.ArgumentParser) -> None:
        # MASTER_PORT becomes --master-port's default: flags, DETLAUNCH_MASTER_PORT and the
        # config file are applied after this hook, so each of them still wins over it.
        # Not when nested: then MASTER_PORT is the outer torchrun's own store, already taken.
        found = None if nested(os.environ) else rendezvous_port(os.environ)
        if found:
            parser.set_defaults(master_port=found[0])

    @hookimpl
    def detlaunch_discover_cluster(self, config: Config) -> ClusterInfo | None:
        if not should_answer(config, NAME, present(config.env)):
            return None
        info = read_torch_env(config.env, config.options.get("nproc_per_node"))
        sources = dict(info.sources)
        found = rendezvous_port(config.env)
        if found:
            port, var = found
            used = config.options.get("master_port")
            sources["master_port"] = shown(config.env, var) if used == port else (
                f"--master-port {used} (over {shown(config.env, var)})")
        addrs = list(info.node_addrs)
        if config.options.get("node_addr"):
            addrs[info.node_rank] = config.options["node_addr"]
            sources["node_addr"] = "--node-addr"
        job_id = job_id_override(config)
        if job_id:
            sources["job_id"] = f"--job-id (over {sources['job_id']})"
        return dataclasses.replace(info, node_addrs=tuple(addrs), job_id=job_id or info.job_id, sources=sources)


kubernetes = KubernetesProvider()
