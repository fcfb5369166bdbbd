"""Which CPUs each local rank is bound to under ``--numa-binding``: torch's modes, without torch.

torchrun's ``--numa-binding`` (torch/numa/binding.py) binds each worker to the CPUs near the GPU
whose index is its local rank; it asks CUDA for the GPU's PCI address, which a supervisor that never
imports torch cannot do. The same modes here read the same facts from sysfs alone:

- ``node``: every CPU of the NUMA node of the rank's device;
- ``socket``: every CPU of the NUMA nodes of that node's socket;
- ``exclusive``: the node's physical cores divided evenly among the devices on that node, the lowest
  devices getting one more where they do not divide (hyperthreads stay with their core);
- ``core-complex``: one L3-sharing group of cores a device, a different one each where there are enough.

The rank's device is its GPU (the local rank-th of CUDA_VISIBLE_DEVICES, as a physical index, in
PCI bus order: nvidia-smi's, and CUDA's under CUDA_DEVICE_ORDER=PCI_BUS_ID) with its NUMA node read
from ``/sys/bus/pci/devices/ADDR/numa_node``. On a node without NVIDIA GPUs (a CPU job), local ranks
are spread over the NUMA nodes in contiguous blocks and each block's ranks count as that node's
devices. Only CPUs this process may run on are handed out (a cgroup's or SLURM's limits hold).
Pure but for reading files under `root`; the rank wrapper applies the result (rank/affinity.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping

from detlaunch.errors import ConfigError
from detlaunch.planning.gpus import cuda_visible_devices
from detlaunch.rank.affinity import ENV as CPUS_ENV
from detlaunch.rank.affinity import parse_cpu_list

NUMA_BINDING_MODES = ("node", "socket", "exclusive", "core-complex")  # torchrun's --numa-binding
__all__ = ["CPUS_ENV", "NUMA_BINDING_MODES", "cpu_sets", "format_cpu_list"]


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"``, as sysfs and taskset write CPU lists."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = None
    for cpu in [*ordered, None]:
        if start is not None and (cpu is None or cpu != prev + 1):  # type: ignore[operator]
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if cpu is not None and start is None:
            start = cpu
        prev = cpu
    return ",".join(out)


class Topology:
    """The machine's NUMA nodes, cores, sockets, caches and NVIDIA GPUs, as sysfs and procfs say."""

    def __init__(self, root: str = "/", allowed: set[int] | None = None) -> None:
        self.root = root
        self.allowed = allowed if allowed is not None else set(os.sched_getaffinity(0))

    def _read(self, *parts: str) -> str:
        with open(os.path.join(self.root, *parts)) as f:
            return f.read().strip()

    def numa_nodes(self) -> list[int]:
        base = os.path.join(self.root, "sys/devices/system/node")
        try:
            names = os.listdir(base)
        except FileNotFoundError:
            return [0]  # a kernel without NUMA: one node holds every CPU
        nodes = sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit())
        return nodes or [0]

    def node_cpus(self, node: int) -> set[int]:
        try:
            cpus = parse_cpu_list(self._read("sys/devices/system/node", f"node{node}", "cpulist"))
        except FileNotFoundError:
            cpus = set(self.allowed) if node == 0 else set()
        return cpus & self.allowed

    def _cpu_file(self, cpu: int, *parts: str) -> str | None:
        try:
            return self._read("sys/devices/system/cpu", f"cpu{cpu}", *parts)
        except FileNotFoundError:
            return None

    def core_of(self, cpu: int) -> int:
        """The lowest logical CPU on `cpu`'s physical core: the core's name."""
        siblings = self._cpu_file(cpu, "topology", "core_cpus_list") or self._cpu_file(
            cpu, "topology", "thread_siblings_list")
        return min(parse_cpu_list(siblings)) if siblings else cpu

    def socket_of(self, cpu: int) -> int:
        return int(self._cpu_file(cpu, "topology", "physical_package_id") or 0)

    def last_cache_of(self, cpu: int) -> frozenset[int]:
        """The CPUs sharing `cpu`'s last-level cache (its core complex)."""
        best: tuple[int, str] | None = None
        for index in range(8):
            level = self._cpu_file(cpu, "cache", f"index{index}", "level")
            shared = self._cpu_file(cpu, "cache", f"index{index}", "shared_cpu_list")
            if level is not None and shared and (best is None or int(level) >= best[0]):
                best = (int(level), shared)
        return frozenset(parse_cpu_list(best[1])) if best else frozenset({cpu})

    def gpu_numa_nodes(self) -> list[int]:
        """Each NVIDIA GPU's NUMA node, in PCI bus order (nvidia-smi's indices); [] without GPUs."""
        try:
            addresses = sorted(os.listdir(os.path.join(self.root, "proc/driver/nvidia/gpus")))
        except FileNotFoundError:
            return []
        nodes = []
        for address in addresses:
            try:
                nodes.append(max(int(self._read("sys/bus/pci/devices", address.lower(), "numa_node")), 0))
            except (FileNotFoundError, ValueError):
                nodes.append(0)  # a single-node machine often says -1 or nothing
        return nodes


def _device_nodes(topo: Topology, local_slots: int, env: Mapping[str, str]) -> list[int]:
    """Each local rank's device's NUMA node: its GPU's, or its block's on a machine without GPUs."""
    gpu_nodes = topo.gpu_numa_nodes()
    if not gpu_nodes:
        numa = [n for n in topo.numa_nodes() if topo.node_cpus(n)] or [0]
        return [numa[i * len(numa) // local_slots] for i in range(local_slots)]
    visible = cuda_visible_devices(env, len(gpu_nodes))
    entries = visible if visible is not None else [str(i) for i in range(len(gpu_nodes))]
    if len(entries) < local_slots:
        raise ConfigError(f"--numa-binding: {local_slots} ranks on this node but {len(entries)} GPU(s) visible "
                          "to bind them near: one rank a GPU, or drop --numa-binding")
    nodes = []
    for entry in entries[:local_slots]:
        if not entry.isdigit() or int(entry) >= len(gpu_nodes):
            raise ConfigError(f"--numa-binding: cannot tell which GPU {entry!r} (CUDA_VISIBLE_DEVICES) is: name "
                              "GPUs by index to bind ranks near them, or drop --numa-binding")
        nodes.append(gpu_nodes[int(entry)])
    return nodes


def _split(groups: list[frozenset[int]], share: int, shares: int) -> set[int]:
    """The `share`-th of `shares` even parts of `groups` (the first parts one group larger)."""
    per, extra = divmod(len(groups), shares)
    if per < 1:
        raise ConfigError(f"--numa-binding exclusive: {len(groups)} physical core(s) for {shares} ranks on one "
                          "NUMA node: use --numa-binding node, or fewer ranks")
    start = share * per + min(share, extra)
    return set().union(*groups[start:start + per + (1 if share < extra else 0)])


def _grouped(cpus: set[int], key: Callable[[int], object]) -> list[frozenset[int]]:
    groups: dict[object, set[int]] = {}
    for cpu in sorted(cpus):
        groups.setdefault(key(cpu), set()).add(cpu)
    return [frozenset(g) for g in sorted(groups.values(), key=min)]


def cpu_sets(mode: str, local_slots: int, env: Mapping[str, str], topo: Topology | None = None) -> list[str]:
    """Each local rank's CPUs under `mode`, as CPU lists ("0-7,16-23") for the rank wrapper."""
    if mode not in NUMA_BINDING_MODES:
        raise ConfigError(f"--numa-binding {mode!r}: one of {', '.join(NUMA_BINDING_MODES)}")
    topo = topo or Topology()
    device_nodes = _device_nodes(topo, local_slots, env)
    result = []
    for i, node in enumerate(device_nodes):
        peers = [j for j, n in enumerate(device_nodes) if n == node]
        if mode == "node":
            cpus = topo.node_cpus(node)
        elif mode == "socket":
            socket = topo.socket_of(min(topo.node_cpus(node) or {0}))
            cpus = set().union(*(topo.node_cpus(n) for n in topo.numa_nodes()
                                 if topo.node_cpus(n) and topo.socket_of(min(topo.node_cpus(n))) == socket))
        elif mode == "exclusive":
            cpus = _split(_grouped(topo.node_cpus(node), topo.core_of), peers.index(i), len(peers))
        else:  # core-complex
            complexes = _grouped(topo.node_cpus(node), lambda cpu: min(topo.last_cache_of(cpu)))
            cpus = set(complexes[peers.index(i) % len(complexes)])
        if not cpus:
            raise ConfigError(f"--numa-binding {mode}: no CPU this job may use is on NUMA node {node} "
                              f"(local rank {i}'s): drop --numa-binding")
        result.append(format_cpu_list(cpus))
    return result
