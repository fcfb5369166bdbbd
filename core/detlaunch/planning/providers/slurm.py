"""SLURM: the job's nodes, this node's rank, slots and job id, from what srun and sbatch set.

detlaunch runs once per node (``srun --ntasks-per-node=1 detlaunch ...``) and starts
the ranks itself, so the SLURM step that runs it must have exactly one task per node.

- nodes: ``SLURM_STEP_NODELIST`` inside a step (``SLURM_NODEID`` counts within the
  step, which may use fewer nodes than the job), else ``SLURM_JOB_NODELIST``; the
  compressed host list is expanded (:mod:`.hostlist`) and each name is resolved with
  getaddrinfo (:mod:`.resolve`). The first node is the chief.
- node rank: ``SLURM_NODEID``, checked against ``SLURMD_NODENAME`` when both are set.
- slots, first that is set: ``--nproc-per-node``; one a GPU this node was given
  (``CUDA_VISIBLE_DEVICES``, ``SLURM_STEP_GPUS``, ``SLURM_GPUS_ON_NODE``, ``SLURM_JOB_GPUS``:
  planning/gpus.py); SLURM's task count when above 1 (``SLURM_NTASKS_PER_NODE``, or
  ``SLURM_TASKS_PER_NODE``, ``2(x3),1``, per node, outside a step); one a GPU the machine shows
  (/dev/nvidiaN, limited by ``NVIDIA_VISIBLE_DEVICES``), when nothing above said this node has
  none; then the task count of 1 (the recommended ``--ntasks-per-node=1`` step: one detlaunch a
  node, which says nothing about its ranks), else 1. A SLURM job that asked for
  ``--ntasks-per-node=8`` and no GPU gets 8 ranks a node, even where the machine's GPUs show.
- job id: ``--job-id`` if given, else ``SLURM_JOB_ID``, with ``.STEP`` inside a step
  (SLURM's own notation) so two detlaunch steps of one allocation never share a job
  directory.

Bad input is one ClusterError line: a malformed list, a node id outside it, a missing
variable, a multi-node job started from the batch script (no step), two detlaunch
processes on one node.
"""

from __future__ import annotations

import dataclasses
import glob as globbing
from collections.abc import Mapping

from detlaunch.errors import ClusterError
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.config import Config
from detlaunch.planning.gpus import Glob, device_gpus, given_gpus, one_per_gpu
from detlaunch.planning.hookspecs import hookimpl
from detlaunch.planning.providers.hostlist import expand_counts, expand_hostlist
from detlaunch.planning.providers.precedence import job_id_override, should_answer, shown
from detlaunch.planning.providers.precedence import slurm_present as present
from detlaunch.planning.providers.resolve import resolve_all

NAME = "slurm"
RUN_ONE_PER_NODE = "srun --ntasks-per-node=1 --ntasks=NODES detlaunch ..."



@dataclasses.dataclass(frozen=True)
class SlurmJob:
    """What the variables say, before any name is resolved."""

    nodes: tuple[str, ...]
    node_id: int
    slots: tuple[int, ...]
    job_id: str
    sources: Mapping[str, str]


def _first(env: Mapping[str, str], *names: str) -> str | None:
    return next((n for n in names if env.get(n, "").strip()), None)


def _int(env: Mapping[str, str], name: str) -> int:
    text = env[name].strip()
    if not (text.isascii() and text.isdigit()):
        raise ClusterError(f"{name}={env[name]!r} is not a non-negative integer; is it overwritten in your script?")
    return int(text)


def _node_list(env: Mapping[str, str], in_step: bool) -> tuple[str, list[str]]:
    names = ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST") if in_step else (
        "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    var = _first(env, *names)
    if var is None:
        raise ClusterError(f"SLURM_JOB_ID is set but {names[0]} is not: run detlaunch inside the job "
                           "(srun/sbatch), or unset SLURM_JOB_ID")
    nodes = expand_hostlist(env[var], var)
    seen: set[str] = set()
    for node in nodes:
        if node in seen:
            raise ClusterError(f"{shown(env, var)} lists node {node} twice")
        seen.add(node)
    return var, nodes


def _node_id(env: Mapping[str, str], nodes: list[str], list_var: str, in_step: bool) -> int:
    if not in_step and len(nodes) > 1:
        raise ClusterError(f"this is a {len(nodes)}-node SLURM job, but detlaunch runs outside a job step "
                           f"(no SLURM_STEP_ID: the batch script or an salloc shell): start one detlaunch per "
                           f"node with {RUN_ONE_PER_NODE}")
    if "SLURM_NODEID" not in env:
        if in_step:
            raise ClusterError("SLURM_NODEID is not set inside a SLURM step: is it unset by your script?")
        return 0
    node_id = _int(env, "SLURM_NODEID")
    if node_id >= len(nodes):
        raise ClusterError(f"SLURM_NODEID={node_id} is outside {shown(env, list_var)} ({len(nodes)} node(s): "
                           f"valid 0..{len(nodes) - 1}); do not mix variables of different jobs or steps")
    me = env.get("SLURMD_NODENAME")
    if me and me != nodes[node_id]:
        raise ClusterError(f"SLURMD_NODENAME={me} but SLURM_NODEID={node_id} is {nodes[node_id]} in "
                           f"{shown(env, list_var)}: these come from different jobs or steps; start "
                           "detlaunch with srun from a clean environment")
    return node_id


def _check_one_per_node(env: Mapping[str, str], nodes: list[str], node_id: int) -> None:
    var = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if var is None:
        return
    counts = expand_counts(env[var], var)
    if len(counts) != len(nodes):
        raise ClusterError(f"{shown(env, var)} gives {len(counts)} count(s) for {len(nodes)} node(s)")
    if counts[node_id] != 1:
        raise ClusterError(f"SLURM runs {counts[node_id]} detlaunch processes on node {nodes[node_id]} "
                           f"({shown(env, var)}); detlaunch starts the ranks itself, so run one per node: "
                           f"{RUN_ONE_PER_NODE} (and --nproc-per-node N for N ranks per node)")


def _positive(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name, "").strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit()):
        raise ClusterError(f"{name}={text!r} is not a number of slots; fix it, or give --nproc-per-node N")
    return int(text) or None


def _tasks(env: Mapping[str, str], n: int, in_step: bool) -> tuple[tuple[int, ...], str] | None:
    """SLURM's task count a node: the job's SLURM_NTASKS_PER_NODE, or SLURM_TASKS_PER_NODE outside a step."""
    value = _positive(env, "SLURM_NTASKS_PER_NODE")
    if value:
        return (value,) * n, shown(env, "SLURM_NTASKS_PER_NODE")
    if not in_step and env.get("SLURM_TASKS_PER_NODE", "").strip():
        counts = expand_counts(env["SLURM_TASKS_PER_NODE"], "SLURM_TASKS_PER_NODE")
        if len(counts) != n:
            raise ClusterError(f"{shown(env, 'SLURM_TASKS_PER_NODE')} gives {len(counts)} count(s) "
                               f"for {n} node(s)")
        if min(counts) > 0:
            return tuple(counts), shown(env, "SLURM_TASKS_PER_NODE")
    return None


def _slots(env: Mapping[str, str], nodes: list[str], in_step: bool, nproc_per_node: int | None,
           glob: Glob = globbing.glob) -> tuple[tuple[int, ...], str]:
    n = len(nodes)
    if nproc_per_node:
        return (nproc_per_node,) * n, "--nproc-per-node"
    given = given_gpus(env, glob)  # CUDA_VISIBLE_DEVICES, else SLURM_STEP_GPUS, SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS
    if given is not None and given.count:
        return (given.count,) * n, given.source
    tasks = _tasks(env, n, in_step)
    if tasks and max(tasks[0]) > 1:  # the user's own task count: 1 is the one-detlaunch-a-node step itself
        return tasks
    if given is None:  # nothing said whether this node has GPUs: the ones the machine shows
        devices = device_gpus(env, glob)
        if devices.count:
            return (devices.count,) * n, devices.source
    if tasks:
        return tasks
    return (1,) * n, one_per_gpu(given or device_gpus(env, glob))[1]


def read_slurm_env(env: Mapping[str, str], nproc_per_node: int | None = None,
                   glob: Glob = globbing.glob) -> SlurmJob:
    """The SLURM job as this node sees it, from its variables alone (pure: no name is resolved)."""
    job_var = _first(env, "SLURM_JOB_ID", "SLURM_JOBID")
    if job_var is None:
        raise ClusterError("SLURM_JOB_ID is not set: run detlaunch inside a SLURM job (srun, sbatch), "
                           "or drop --cluster slurm")
    step_var = _first(env, "SLURM_STEP_ID", "SLURM_STEPID")
    in_step = step_var is not None
    list_var, nodes = _node_list(env, in_step)
    node_id = _node_id(env, nodes, list_var, in_step)
    if in_step:
        _check_one_per_node(env, nodes, node_id)
    slots, slots_from = _slots(env, nodes, in_step, nproc_per_node, glob)
    job_id = env[job_var].strip()
    job_from = shown(env, job_var)
    if step_var is not None:
        job_id, job_from = f"{job_id}.{env[step_var].strip()}", f"{job_from}, {shown(env, step_var)}"
    return SlurmJob(
        nodes=tuple(nodes), node_id=node_id, slots=slots, job_id=job_id,
        sources={"nodes": shown(env, list_var),
                 "node_rank": shown(env, "SLURM_NODEID") if "SLURM_NODEID" in env else "default (0)",
                 "slots": slots_from, "job_id": job_from},
    )


def _addresses(names: tuple[str, ...], addrs: tuple[str, ...]) -> str:
    pairs = [f"{n}={a}" for n, a in zip(names, addrs, strict=True)]
    return "getaddrinfo: " + ", ".join(pairs[:8]) + (f", ... ({len(pairs)} nodes)" if len(pairs) > 8 else "")


class SlurmProvider:
    """The ``slurm`` discovery provider (see the module docstring)."""

    name = NAME

    @hookimpl
    def detlaunch_discover_cluster(self, config: Config) -> ClusterInfo | None:
        if not should_answer(config, NAME, present(config.env)):
            return None
        job = read_slurm_env(config.env, config.options.get("nproc_per_node"))
        sources = dict(job.sources)
        addrs = list(resolve_all(job.nodes, sources["nodes"]))
        sources["addresses"] = _addresses(job.nodes, tuple(addrs))
        if config.options.get("node_addr"):
            sources["node_addr"] = f"--node-addr (over {job.nodes[job.node_id]}={addrs[job.node_id]})"
            addrs[job.node_id] = config.options["node_addr"]
        job_id = job_id_override(config)
        if job_id:
            sources["job_id"] = f"--job-id (over {sources['job_id']})"
        sources["chief"] = f"first node of {sources['nodes'].split('=')[0]} ({job.nodes[0]})"
        return ClusterInfo(
            node_addrs=tuple(addrs), slots=job.slots, node_rank=job.node_id, chief_addr=addrs[0],
            job_id=job_id or job.job_id, provider=NAME, sources=sources,
        )


slurm = SlurmProvider()
