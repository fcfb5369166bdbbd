"""How many GPUs this node's ranks may use, and where that count came from: the default --nproc-per-node.

A node's GPUs, the first source that is set (one that lists none means no GPU: the scheduler's task
count, then 1, decides the ranks):

1. ``CUDA_VISIBLE_DEVICES``, read as CUDA reads it (torch's ``_parse_visible_devices`` mirrors it): a
   list of indices ends at the first entry that is not one (``0,-1,2`` is 1 device; ``""`` and ``-1``
   are none) or at an index past the node's devices; ``GPU-...`` and ``MIG-...`` lists end at the
   first entry without that prefix; a repeated entry makes the list empty. Each MIG id is one device.
2. What SLURM gave this node: ``SLURM_STEP_GPUS``, ``SLURM_GPUS_ON_NODE``, ``SLURM_JOB_GPUS``
   (SLURM sets CUDA_VISIBLE_DEVICES too in a step with GPUs; these count where it did not).
3. The device nodes ``/dev/nvidiaN``, limited by the container runtime's ``NVIDIA_VISIBLE_DEVICES``
   (``all``; ``none``, ``void`` or empty: no GPU; a list of indices, ``GPU-`` or ``MIG-`` ids): a
   privileged pod sees every /dev/nvidiaN of its host, but has only the GPUs that list names.
   Where the GPUs are split into MIG instances and only the device nodes tell, the count is
   refused in one line rather than guessed (give --nproc-per-node, or the MIG ids).

Under SLURM a task count above 1 comes before 3 (the device nodes are what the machine has, not what
the job was given); see providers/slurm.py. The device glob is a parameter, so tests fake the machine.
"""

from __future__ import annotations

import dataclasses
import glob as globbing
from collections.abc import Callable, Mapping

from detlaunch.errors import ClusterError

DEVICE_NODES = "/dev/nvidia[0-9]*"
DEVICES_SHOWN = "/dev/nvidiaN"
# A GPU split into MIG instances has its GPU instances here (NVIDIA's MIG guide, "Device Nodes and Capabilities").
MIG_INSTANCES = "/proc/driver/nvidia/capabilities/gpu[0-9]*/mig/gi[0-9]*"
SLURM_GPU_VARS = ("SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS")
NO_DEVICE = ("none", "void", "")
Glob = Callable[[str], list[str]]


@dataclasses.dataclass(frozen=True)
class GpuCount:
    """count GPUs, from `source` (``NAME=value``, or the device nodes, with what was made of it)."""

    count: int
    source: str


def _shown(name: str, value: str, limit: int = 80) -> str:
    return f"{name}={value if len(value) <= limit else value[: limit - 3] + '...'}"


def _ordinal(entry: str) -> int:
    """strtoul as CUDA applies it: the leading digits (``1gpu`` is 1), -1 when there are none or a sign is -."""
    text = entry.strip()
    sign, digits = (text[:1], text[1:]) if text.startswith(("+", "-")) else ("", text)
    n = len(digits) - len(digits.lstrip("0123456789"))
    if n == 0 or sign == "-":
        return -1
    return int(digits[:n])


def cuda_visible_devices(env: Mapping[str, str], device_count: int = 0) -> list[str] | None:
    """The devices CUDA_VISIBLE_DEVICES gives, as CUDA reads it; None when it is not set.

    device_count: the node's devices (its /dev/nvidiaN), when known: an index past them ends the list.
    0: not known (a machine without GPUs, where a test or a CPU job sets the variable): no such end.
    """
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    found: list[str] = []
    for prefix in ("GPU-", "MIG-"):
        if value.startswith(prefix):
            for entry in value.split(","):
                if entry in found:
                    return []
                if not entry.startswith(prefix):
                    break
                found.append(entry)
            return found
    ordinals: list[int] = []
    for entry in value.split(","):
        n = _ordinal(entry)
        if n in ordinals:
            return []
        if n < 0 or (device_count and n >= device_count):
            break
        ordinals.append(n)
    return [str(n) for n in ordinals]


def _from_cuda(env: Mapping[str, str], device_count: int) -> GpuCount | None:
    devices = cuda_visible_devices(env, device_count)
    if devices is None:
        return None
    value = env["CUDA_VISIBLE_DEVICES"]
    listed = [e for e in value.split(",") if e.strip()]
    note = "" if len(devices) == len(listed) else f": {len(devices)} device(s) as CUDA reads it"
    if devices and devices[0].startswith("MIG-"):
        note = f": {len(devices)} MIG device(s)"
    return GpuCount(len(devices), _shown("CUDA_VISIBLE_DEVICES", value) + note)


def _from_slurm(env: Mapping[str, str]) -> GpuCount | None:
    for name in SLURM_GPU_VARS:
        value = env.get(name, "").strip()
        if not value:
            continue
        if name == "SLURM_GPUS_ON_NODE":
            if not (value.isascii() and value.isdigit()):
                raise ClusterError(f"{name}={value!r} is not a number of GPUs; fix it, or give --nproc-per-node N")
            return GpuCount(int(value), _shown(name, value))
        return GpuCount(len({e.strip() for e in value.split(",") if e.strip()}), _shown(name, value))
    return None


def given_gpus(env: Mapping[str, str], glob: Glob = globbing.glob) -> GpuCount | None:
    """The GPUs this node was given (CUDA_VISIBLE_DEVICES, else SLURM's); None when nothing says."""
    cuda = _from_cuda(env, len(glob(DEVICE_NODES))) if "CUDA_VISIBLE_DEVICES" in env else None
    return cuda or _from_slurm(env)


def device_gpus(env: Mapping[str, str], glob: Glob = globbing.glob) -> GpuCount:
    """The GPUs the machine shows (its /dev/nvidiaN), limited by NVIDIA_VISIBLE_DEVICES."""
    nodes = len(glob(DEVICE_NODES))
    limit = env.get("NVIDIA_VISIBLE_DEVICES")
    if limit is not None and limit.strip().lower() != "all":
        value = limit.strip()
        if value.lower() in NO_DEVICE:
            return GpuCount(0, _shown("NVIDIA_VISIBLE_DEVICES", limit))
        entries = {e.strip() for e in value.split(",") if e.strip()}
        if any(e.startswith("MIG-") or ":" in e for e in entries):  # MIG-<uuid>, or GPU:MIG indices
            return GpuCount(len(entries), _shown("NVIDIA_VISIBLE_DEVICES", limit) + f": {len(entries)} MIG device(s)")
        return GpuCount(min(len(entries), nodes),
                        _shown("NVIDIA_VISIBLE_DEVICES", limit) + f": {min(len(entries), nodes)} of {nodes} "
                        f"{DEVICES_SHOWN}")
    if nodes:
        mig = sorted(glob(MIG_INSTANCES))
        if mig:
            raise ClusterError(f"this node's GPUs are split into MIG instances ({mig[0]}): detlaunch does not "
                               "guess how many ranks they take; give --nproc-per-node N, or list the MIG devices "
                               "in CUDA_VISIBLE_DEVICES (nvidia-smi -L)")
    return GpuCount(nodes, f"{nodes} {DEVICES_SHOWN}")


def visible_gpus(env: Mapping[str, str], glob: Glob = globbing.glob) -> GpuCount:
    """The GPUs this node's ranks may use, first source that is set (see the module docstring)."""
    return given_gpus(env, glob) or device_gpus(env, glob)


def one_per_gpu(gpus: GpuCount) -> tuple[int, str]:
    """(ranks, where from): one rank a GPU, or 1 where there is none."""
    return (gpus.count, gpus.source) if gpus.count > 0 else (1, f"default (1), no GPU: {gpus.source}")


__all__ = ["GpuCount", "cuda_visible_devices", "given_gpus", "device_gpus", "visible_gpus", "one_per_gpu"]
