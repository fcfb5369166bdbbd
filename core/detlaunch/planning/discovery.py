"""Built-in cluster discovery providers: static (flags, host lists) and local (the fallback).

Each provider is an always-on plugin (``detlaunch.plugins`` entry point), the
same way a third party adds SLURM, LSF or PBS. Order: static is ``tryfirst``
(what the user typed wins over what the environment says), scheduler providers
come next, local is ``trylast`` and always answers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from detlaunch.errors import ClusterError, ConfigError
from detlaunch.planning.cluster import ClusterInfo, Host, parse_hostfile, parse_hosts
from detlaunch.planning.config import Config
from detlaunch.planning.gpus import one_per_gpu, visible_gpus
from detlaunch.planning.hookspecs import hookimpl
from detlaunch.system.safefs import random_hex, read_regular_file


def default_slots(config: Config) -> tuple[int, str]:
    """Ranks a node, and where from: --nproc-per-node, else one a GPU this node may use (gpus.py), else 1."""
    given = config.options.get("nproc_per_node")
    return (given, "--nproc-per-node") if given else one_per_gpu(visible_gpus(config.env))


def random_job_id() -> str:
    return "dl-" + random_hex(5)


def job_id_for(config: Config, fallback: str) -> str:
    return config.options.get("job_id") or config.env.get("DETLAUNCH_JOB_ID") or fallback


def derived_job_id(*parts: object) -> str:
    """Every node computes the same id from the same flags, without talking to the others."""
    digest = hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:12]
    return f"dl-{digest}"


def given_link_port(config: Config) -> tuple[int, ...]:
    """The link port when given, as a part of a derived job id (with the master port, always a part).

    Two jobs on the same hosts cannot share these ports, so they get different ids and job directories.
    Without --link-port it is the master port + 1: leaving it out keeps the ids of older versions.
    """
    port = config.options.get("link_port")
    return (port,) if port else ()


def given_hosts(options: Mapping[str, Any]) -> tuple[list[Host], str] | None:
    """The hosts --hosts or --hostfile names, read as discovery reads them, and that flag; None without either.

    Public (``detlaunch.given_hosts``): a launcher flag that narrows them (deepspeed's --include) reads them here.
    """
    if options.get("hosts") is not None and options.get("hostfile") is not None:
        raise ConfigError("give --hosts or --hostfile, not both")
    if options.get("hosts") is not None:
        return parse_hosts(options["hosts"]), "--hosts"
    path = options.get("hostfile")
    if path is None:
        return None
    try:
        text = read_regular_file(path).decode("utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read --hostfile {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read --hostfile {path}: it is not UTF-8 text") from None
    return parse_hostfile(text, path), "--hostfile"


def _wanted(config: Config, name: str) -> bool:
    forced = config.options.get("cluster")
    return forced is None or forced == name


class StaticProvider:
    """Nodes from --hosts/--hostfile, or from torchrun-style --nnodes/--node-rank/--master-addr."""

    name = "static"

    @hookimpl(tryfirst=True)
    def detlaunch_discover_cluster(self, config: Config) -> ClusterInfo | None:
        o = config.options
        if not _wanted(config, self.name):
            return None
        if o.get("hosts") is not None or o.get("hostfile") is not None:  # `--hosts ""` is an error
            return self._from_hosts(config)
        if o.get("nnodes") or o.get("node_rank") is not None or o.get("master_addr"):
            return self._from_flags(config)
        return None

    def _from_hosts(self, config: Config) -> ClusterInfo:
        o = config.options
        read = given_hosts(o)
        assert read is not None
        hosts, source = read
        spares = o.get("spares") or 0
        if o.get("nnodes") and o["nnodes"] + spares != len(hosts):
            given = f"--nnodes {o['nnodes']} and --spares {spares} disagree" if spares else \
                f"--nnodes {o['nnodes']} disagrees"
            raise ConfigError(f"{given} with {source}, which lists {len(hosts)} hosts")
        node_rank = o.get("node_rank")
        if node_rank is None:
            if len(hosts) > 1:
                raise ConfigError(f"{source} lists {len(hosts)} hosts: say which one this node is "
                                  f"with --node-rank 0..{len(hosts) - 1}")
            node_rank = 0
        if not 0 <= node_rank < len(hosts):
            raise ConfigError(f"--node-rank {node_rank} is outside {source} "
                              f"({len(hosts)} hosts: valid ranks 0..{len(hosts) - 1})")
        slots, slots_from = default_slots(config)
        here = hosts[node_rank]
        if o.get("nproc_per_node") and here.slots and here.slots != o["nproc_per_node"]:
            raise ConfigError(f"--nproc-per-node {o['nproc_per_node']} disagrees with {source}, which gives "
                              f"this node ({here.addr}) {here.slots} slots: drop one of them")
        addrs = tuple(h.addr for h in hosts)
        if o.get("master_addr") and o["master_addr"] != addrs[0]:
            raise ConfigError(f"--master-addr {o['master_addr']} disagrees with {source}, whose first host "
                              f"(the chief) is {addrs[0]}: drop --master-addr or list the chief first")
        return ClusterInfo(
            node_addrs=addrs,
            slots=tuple(h.slots or slots for h in hosts),
            node_rank=node_rank,
            chief_addr=addrs[0],
            job_id=job_id_for(config, derived_job_id(*addrs, o.get("master_port"), *given_link_port(config))
                              if len(hosts) > 1 else random_job_id()),
            provider=self.name,
            sources={"nodes": source, "node_rank": "--node-rank", "chief": f"first host of {source}",
                     "slots": source if here.slots else slots_from},
        )

    def _from_flags(self, config: Config) -> ClusterInfo:
        o, env = config.options, config.env
        nnodes = o.get("nnodes") or 1
        spares = o.get("spares") or 0  # node ranks nnodes.. are the spares (planning/spares.py)
        node_rank = o.get("node_rank") or 0
        if not 0 <= node_rank < nnodes + spares:
            with_spares = f" with --spares {spares}" if spares else ""
            raise ConfigError(f"--node-rank {node_rank} is outside --nnodes {nnodes}{with_spares} "
                              f"(valid: 0..{nnodes + spares - 1})")
        chief, chief_source = o.get("master_addr"), "--master-addr"
        if not chief and env.get("DET_CHIEF_IP"):
            chief, chief_source = env["DET_CHIEF_IP"], "DET_CHIEF_IP"
        if not chief:
            if nnodes > 1:
                raise ConfigError("--nnodes > 1 needs the chief's address: --master-addr ADDR")
            chief, chief_source = "127.0.0.1", "default"
        addrs: list[str | None] = [None] * (nnodes + spares)
        addrs[0] = chief
        if node_rank > 0:
            addrs[node_rank] = o.get("node_addr")
        slots, slots_from = default_slots(config)
        return ClusterInfo(
            node_addrs=tuple(addrs),
            slots=(slots,) * (nnodes + spares),
            node_rank=node_rank,
            chief_addr=chief,
            job_id=job_id_for(config, derived_job_id(chief, o.get("master_port"), nnodes, *given_link_port(config))
                              if nnodes > 1 else random_job_id()),
            provider=self.name,
            sources={"nodes": "--nnodes", "node_rank": "--node-rank", "chief": chief_source, "slots": slots_from},
        )


class LocalProvider:
    """One node: this one. Slots from --nproc-per-node, else one a GPU this node may use (gpus.py), else 1."""

    name = "local"

    @hookimpl(trylast=True)
    def detlaunch_discover_cluster(self, config: Config) -> ClusterInfo | None:
        if not _wanted(config, self.name):
            return None
        chief = config.env.get("DET_CHIEF_IP")
        addr = config.options.get("node_addr") or chief or "127.0.0.1"
        slots, slots_from = default_slots(config)
        return ClusterInfo(
            node_addrs=(addr,),
            slots=(slots,),
            node_rank=0,
            chief_addr=chief or addr,
            job_id=job_id_for(config, random_job_id()),
            provider=self.name,
            sources={"nodes": "this machine", "chief": "DET_CHIEF_IP" if chief else "this machine",
                     "slots": slots_from},
        )


static = StaticProvider()
local = LocalProvider()

__all__ = ["static", "local", "visible_gpus", "given_hosts", "ClusterError", "Host"]
