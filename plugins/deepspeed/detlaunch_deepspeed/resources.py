"""deepspeed's choice of hosts and devices: ``--include``/``--exclude``, and ``--num_nodes``/``--num_gpus`` over a
hostfile, as deepspeed's runner makes it (deepspeed/launcher/runner.py: parse_resource_filter,
apply_num_nodes_and_gpus). Pure functions.

The pool is every host of ``--hostfile`` (or ``--hosts``) with its slots 0..N-1; without either, ``localhost``:
this node, whichever it is. Then, in deepspeed's syntax, ``NODE_SPEC[@NODE_SPEC...]`` with
``NODE_SPEC = NAME[:SLOT[,SLOT...]]``:

- ``--include``: only those hosts; a bare name with all its slots, else the slots listed;
- ``--exclude``: every host but those; a bare name leaves, else it loses the slots listed (and leaves with none);
- they exclude each other and ``--num_nodes``/``--num_gpus``; those keep the first N hosts, slots 0..G-1 of each.

The hosts left are the job's nodes, in the pool's order, each with one rank a slot. A slot is a device of the
node: an index into its own devices (its CUDA_VISIBLE_DEVICES as CUDA reads it, else the GPUs 0, 1...), as
deepspeed's indices are under detlaunch (rank_shim.py). A node whose slots are picked runs with
CUDA_VISIBLE_DEVICES set to them, as a node started with that variable would (planning/gpus.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from detlaunch import ConfigError, given_hosts

DEVICES = "deepspeed_devices"  # the option the conversion sets: each node's devices, "host:1,3@host2:0"
EVERY_NODE = "*"  # in DEVICES, without a hostfile: whichever node this is
LOCALHOST = "localhost"  # deepspeed's name for the node without a hostfile

Pool = list[tuple[str, int | None]]  # (host, slots; None where the host list gives none: this node's default)
Picked = list[tuple[str, list[int] | None]]  # (host, its slots; None: all of them, however many that is)


def parse_node_config_list(text: str, flag: str) -> dict[str, list[int]]:
    """``host1:0,1@host2`` -> {host1: [0, 1], host2: []}: the slots of each host, sorted, without repeats."""
    out: dict[str, list[int]] = {}
    for spec in text.split("@"):
        host, sep, slots = spec.partition(":")
        if ":" in slots:
            raise ConfigError(f"{flag} {text}: {spec!r} has more than one ':' (write host:0,1@host2)")
        numbers = []
        for slot in slots.split(",") if sep else ():
            if not slot.strip().isdigit():
                raise ConfigError(f"{flag} {text}: {slot!r} in {spec!r} is not a device number (write host:0,1)")
            numbers.append(int(slot))
        out[host] = sorted(set(out.get(host, []) + numbers))
    return out


def _check_known(flag: str, text: str, pool: Mapping[str, int | None], host: str, slots: list[int],
                 source: str) -> None:
    if host not in pool:
        raise ConfigError(f"{flag} {text}: {host or repr(host)} is not a host of {source} "
                          f"({', '.join(pool)})")
    have = pool[host]
    missing = [s for s in slots if have is not None and s >= have]
    if missing and have is not None:
        raise ConfigError(f"{flag} {text}: {host} has no device {missing[0]} ({source} gives it {have} slots: "
                          f"0..{have - 1})")


def resource_filter(pool: Pool, include: str = "", exclude: str = "", source: str = "--hostfile") -> Picked:
    """The hosts and slots left of `pool` by --include or --exclude, in the pool's order (deepspeed's rules)."""
    if include and exclude:
        raise ConfigError("--include and --exclude exclude each other (as in deepspeed): give one of them")
    if not (include or exclude):
        return [(host, None) for host, _ in pool]
    flag, text = ("--include", include) if include else ("--exclude", exclude)
    slots_of = dict(pool)
    picked: dict[str, list[int] | None] = {} if include else {h: None for h, _ in pool}
    for host, slots in parse_node_config_list(text, flag).items():
        _check_known(flag, text, slots_of, host, slots, source)
        if include:
            picked[host] = slots or None
            continue
        if slots and slots_of[host] is None:
            raise ConfigError(f"{flag} {text}: {source} gives {host} no slot count to take devices from: "
                              f"write {host}:N there")
        have = picked[host]
        all_slots = list(range(slots_of[host] or 0)) if have is None else have
        picked[host] = [s for s in all_slots if s not in slots] if slots else []
    left = [(host, picked[host]) for host, _ in pool if host in picked and picked[host] != []]
    if not left:
        raise ConfigError(f"{flag} {text} leaves no device of {source} to run on")
    return left


def first_nodes_and_gpus(picked: Picked, num_nodes: int | None, num_gpus: int | None) -> Picked:
    """--num_nodes N: the first N hosts; --num_gpus G: slots 0..G-1 of each (deepspeed's apply_num_nodes_and_gpus)."""
    if num_nodes:
        picked = picked[:num_nodes]
    if num_gpus:
        picked = [(host, list(range(num_gpus))) for host, _ in picked]
    return picked


def devices_option(picked: Picked, every_node: bool = False) -> str:
    """DEVICES's value: the hosts whose slots were picked, and those slots (``*`` for every node)."""
    return "@".join(f"{EVERY_NODE if every_node else host}:{','.join(map(str, slots))}"
                    for host, slots in picked if slots is not None)


def hosts_option(picked: Picked, pool: Pool) -> str:
    """--hosts's value for the hosts picked: each with its slots (the pool's count where all were kept)."""
    counts = dict(pool)
    entries = []
    for host, slots in picked:
        shown = f"[{host}]" if ":" in host else host
        count = counts[host] if slots is None else len(slots)
        entries.append(shown if count is None else f"{shown}:{count}")
    return ",".join(entries)


def _number(value: str, flag: str) -> int:
    if not value.strip().isdigit() or int(value) < 1:
        raise ConfigError(f"{flag} {value}: give a whole number, 1 or more")
    return int(value)


def options_for(options: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """What deepspeed's --include/--exclude/--num_nodes/--num_gpus (`given`, by the table's first names) mean
    in detlaunch's options: the nodes (``hosts``, replacing --hostfile) or, without a host list, this node's
    ranks (``nproc_per_node``) and nodes (``nnodes``); and DEVICES where devices were picked."""
    include, exclude = given.get("-i") or "", given.get("-e") or ""
    nodes, gpus = given.get("--num_nodes"), given.get("--num_gpus")
    if include and exclude:
        raise ConfigError("--include and --exclude exclude each other (as in deepspeed): give one of them")
    if (include or exclude) and (nodes is not None or gpus is not None):
        raise ConfigError(f"{'--include' if include else '--exclude'} picks the hosts and devices, --num_nodes and "
                          "--num_gpus count them (deepspeed refuses both too): give one of them")
    hosts = given_hosts(options)
    if hosts is None:  # deepspeed's pool without a hostfile is localhost: this node, whichever it is
        if not (include or exclude):
            return {key: n for key, n in (("nnodes", nodes), ("nproc_per_node", gpus)) if n is not None}
        return _this_node(include, exclude)
    pool: Pool = [(h.addr, h.slots) for h in hosts[0]]
    picked = resource_filter(pool, include, exclude, hosts[1])
    picked = first_nodes_and_gpus(picked, None if nodes is None else _number(nodes, "--num_nodes"),
                                  None if gpus is None else _number(gpus, "--num_gpus"))
    out: dict[str, Any] = {"hosts": hosts_option(picked, pool), "hostfile": None}
    if any(slots is not None for _, slots in picked):
        out[DEVICES] = devices_option(picked)
    return out


def _this_node(include: str, exclude: str) -> dict[str, Any]:
    """--include localhost:1,3 without a host list: every node runs 2 ranks, on its devices 1 and 3."""
    if exclude:
        raise ConfigError(f"--exclude {exclude}: without --hostfile or --hosts, detlaunch counts a node's devices "
                          "when it plans, after reading the flags: name the devices to use, --include localhost:0,1")
    specs = parse_node_config_list(include, "--include")
    other = next((host for host in specs if host != LOCALHOST), None)
    if other is not None:
        raise ConfigError(f"--include {include}: {other or repr(other)} is not a host of the job: without "
                          "--hostfile or --hosts the one host is localhost (this node); give the hosts with --hostfile")
    slots = specs[LOCALHOST]
    if not slots:
        return {}
    return {"nproc_per_node": len(slots), DEVICES: devices_option([(LOCALHOST, slots)], every_node=True)}


def node_devices(value: str | None, node_addr: str | None) -> list[int] | None:
    """This node's slots in DEVICES (None: not picked, the node keeps its devices)."""
    for spec in value.split("@") if value else ():
        host, _, slots = spec.rpartition(":")  # the last ':': a host may be an IPv6 address
        if host in (EVERY_NODE, node_addr):
            return [int(s) for s in slots.split(",")]
    return None


def visible_devices_for(slots: Sequence[int], own: Sequence[str] | None, own_text: str = "") -> str:
    """CUDA_VISIBLE_DEVICES for a node's picked slots: those of its own devices (`own`: its CUDA_VISIBLE_DEVICES as
    CUDA reads it; None: unset, the slots are the GPUs' numbers)."""
    if own is None:
        return ",".join(map(str, slots))
    past = [s for s in slots if s >= len(own)]
    if past:
        raise ConfigError(f"deepspeed's device {past[0]} on this node: it has {len(own)} "
                          f"(CUDA_VISIBLE_DEVICES={own_text}): pick among 0..{len(own) - 1}")
    return ",".join(own[s] for s in slots)
