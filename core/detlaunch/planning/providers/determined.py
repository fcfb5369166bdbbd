"""Determined: the cluster as Determined's harness sees it, and the worker's daemon mark.

Inside a Determined task container, the harness (``determined/_info.py``, 0.38.1) reads
``/run/determined/info/cluster.json`` (master_url, allocation_id, session_token,
slot_ids, task_type, master_cert_file/name) and, for trials, ``rendezvous.json`` next to
it (container_addrs, container_rank, container_slot_counts). This provider reads the same
files. ``DET_CLUSTER_INFO`` names another cluster.json (detlaunch's own variable, for
images that mount the info elsewhere, and for tests; Determined does not set it).

- nodes: container_addrs (a non-trial task is one container at 127.0.0.1, as in the
  harness); node rank: container_rank; chief: container_addrs[0].
- slots: ``--nproc-per-node``, else container_slot_counts (a zero-slot, CPU-only
  container runs one rank).
- job id: ``--job-id``, else the allocation id, which every container shares.

Worker side effect (``detlaunch_job_started``): on a non-chief node whose stage runs only
daemons (sshd, for horovod or deepspeed), the resources (``DET_RESOURCES_ID``) are marked
as a daemon, as the seed's launch layers do, so that the master stops them when the
chief's launcher ends. A worker that runs its own launcher (torchrun) is a real
participant and is not marked, as in Determined's torch_distributed layer.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from detlaunch.errors import ClusterError
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.config import Config
from detlaunch.planning.hookspecs import hookimpl
from detlaunch.planning.providers.precedence import DETERMINED_DEFAULT_INFO as DEFAULT_INFO
from detlaunch.planning.providers.precedence import DETERMINED_INFO_ENV as INFO_ENV
from detlaunch.planning.providers.precedence import determined_present as present
from detlaunch.planning.providers.precedence import job_id_override, should_answer
from detlaunch.planning.stage import Stage, StageContext

if TYPE_CHECKING:  # determined_master imports requests: only when Determined is really there
    from detlaunch.planning.providers.determined_master import Master

NAME = "determined"
RENDEZVOUS = "rendezvous.json"


def info_path(env: Mapping[str, str]) -> str:
    return env.get(INFO_ENV) or DEFAULT_INFO



@dataclasses.dataclass(frozen=True)
class DetInfo:
    """The fields of Determined's cluster info that detlaunch uses."""

    master_url: str
    allocation_id: str
    session_token: str
    task_type: str
    slot_ids: tuple[int, ...]
    container_addrs: tuple[str, ...]
    container_rank: int
    container_slot_counts: tuple[int, ...]
    master_cert_file: str | None = None
    master_cert_name: str | None = None
    path: str = DEFAULT_INFO


def _load(path: str, what: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ClusterError(f"Determined {what} {path} does not exist: run inside a Determined task, "
                           f"point {INFO_ENV} at cluster.json, or drop --cluster determined") from None
    except (OSError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise ClusterError(f"cannot read Determined {what} {path}: {reason}") from None
    if not isinstance(data, dict):
        raise ClusterError(f"Determined {what} {path} is not a JSON object")
    return data


def _field(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: str) -> Any:
    if key not in data or data[key] is None:
        raise ClusterError(f"Determined cluster info {path} has no {key!r}: is it from Determined 0.38 or later?")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ClusterError(f"Determined cluster info {path}: {key!r} should be {getattr(kind, '__name__', kind)}, "
                           f"got {value!r}")
    return value


def _int_list(data: Mapping[str, Any], key: str, path: str) -> tuple[int, ...]:
    value = _field(data, key, list, path)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise ClusterError(f"Determined cluster info {path}: {key!r} should list non-negative integers, got {value}")
    return tuple(value)


def read_det_info(env: Mapping[str, str]) -> DetInfo:
    """Determined's cluster info as the harness reads it (pure apart from reading the two files)."""
    path = info_path(env)
    info = _load(path, "cluster info")
    task_type = _field(info, "task_type", str, path)
    slot_ids = _int_list(info, "slot_ids", path)
    token = info.get("session_token") or env.get("DET_SESSION_TOKEN")
    if not isinstance(token, str) or not token:
        raise ClusterError(f"Determined cluster info {path} has no session_token (nor DET_SESSION_TOKEN)")
    if task_type == "TRIAL":
        rv_path = os.path.join(os.path.dirname(path), RENDEZVOUS)
        rv = _load(rv_path, "rendezvous info")
        addrs = tuple(_field(rv, "container_addrs", list, rv_path))
        rank = _field(rv, "container_rank", int, rv_path)
        counts = _int_list(rv, "container_slot_counts", rv_path)
        if not addrs or not all(isinstance(a, str) and a for a in addrs):
            raise ClusterError(f"Determined rendezvous info {rv_path}: container_addrs should list addresses")
        if len(counts) != len(addrs):
            raise ClusterError(f"Determined rendezvous info {rv_path}: {len(addrs)} container_addrs but "
                               f"{len(counts)} container_slot_counts")
        if not 0 <= rank < len(addrs):
            raise ClusterError(f"Determined rendezvous info {rv_path}: container_rank {rank} is outside the "
                               f"{len(addrs)} containers (valid 0..{len(addrs) - 1})")
    else:  # only trials rendezvous; the harness treats anything else as one local container
        addrs, rank, counts = ("127.0.0.1",), 0, (len(slot_ids),)
    return DetInfo(
        master_url=_canonical_url(_field(info, "master_url", str, path)),
        allocation_id=_field(info, "allocation_id", str, path), session_token=token, task_type=task_type,
        slot_ids=slot_ids, container_addrs=addrs, container_rank=rank, container_slot_counts=counts,
        master_cert_file=info.get("master_cert_file"), master_cert_name=info.get("master_cert_name"), path=path,
    )


def _canonical_url(url: str) -> str:
    from detlaunch.planning.providers.determined_master import canonical_url

    return canonical_url(url)


def master_for(info: DetInfo, env: Mapping[str, str]) -> Master:
    """How to reach the master: DET_MASTER_CERT_FILE/NAME first, as certs.default_load reads them."""
    from detlaunch.planning.providers.determined_master import Master

    cert_file = env.get("DET_MASTER_CERT_FILE") or info.master_cert_file
    verify: bool | str = True
    if cert_file and cert_file.lower() == "noverify":
        verify = False
    elif cert_file:
        if not os.path.isfile(cert_file):
            raise ClusterError(f"DET_MASTER_CERT_FILE={cert_file}: no such file")
        verify = cert_file
    cert_name = env.get("DET_MASTER_CERT_NAME") or info.master_cert_name or None
    return Master(url=info.master_url, token=info.session_token, verify=verify, cert_name=cert_name)


class DeterminedProvider:
    """The ``determined`` discovery provider and worker-side daemon marking (see the module docstring)."""

    name = NAME

    @hookimpl
    def detlaunch_discover_cluster(self, config: Config) -> ClusterInfo | None:
        if not should_answer(config, NAME, present(config.env)):
            return None
        info = read_det_info(config.env)
        where = "cluster info" if info.task_type != "TRIAL" else RENDEZVOUS
        sources = {"nodes": f"container_addrs of {where}" if info.task_type == "TRIAL" else
                   f"task_type={info.task_type}: one container",
                   "node_rank": f"container_rank={info.container_rank}"}
        nproc = config.options.get("nproc_per_node")
        if nproc:
            slots, sources["slots"] = (nproc,) * len(info.container_addrs), "--nproc-per-node"
        else:
            slots = tuple(max(1, c) for c in info.container_slot_counts)
            sources["slots"] = f"container_slot_counts={list(info.container_slot_counts)}" + (
                " (0 slots: one CPU rank)" if 0 in info.container_slot_counts else "")
        sources["chief"] = "container_addrs[0]"
        job_id = job_id_override(config)
        sources["job_id"] = "--job-id" if job_id else f"allocation_id of {info.path}"
        return ClusterInfo(
            node_addrs=info.container_addrs, slots=slots, node_rank=info.container_rank,
            chief_addr=info.container_addrs[0], job_id=job_id or info.allocation_id, provider=NAME,
            sources=sources,
        )

    @hookimpl
    def detlaunch_job_started(self, ctx: StageContext, stage: Stage) -> None:
        c = ctx.cluster
        if c.provider != NAME or c.is_chief or not stage.commands:
            return
        if not all(cmd.daemon for cmd in stage.commands):
            return  # this node runs a launcher of its own: a participant, not a daemon
        env = ctx.config.env
        resources_id = env.get("DET_RESOURCES_ID")
        if not resources_id:
            raise ClusterError("DET_RESOURCES_ID is not set, so this worker cannot be marked as a daemon: "
                               "Determined sets it in every task container; is this one?")
        info = read_det_info(env)
        from detlaunch.planning.providers.determined_master import mark_daemon

        mark_daemon(master_for(info, env), info.allocation_id, resources_id)


determined = DeterminedProvider()
