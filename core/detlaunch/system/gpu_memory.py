"""Which processes hold GPU memory, as nvidia-smi says: its CSV read, and the pids of ours in it (pure).

NVML's Python binding is not assumed; `nvidia-smi` is on every machine with NVIDIA's driver. Its pids
are the driver's: the host's (see procs.nspids for how a process of the job is known by them).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection, Mapping

QUERY = ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")


def find_nvidia_smi(env: Mapping[str, str]) -> str | None:
    """nvidia-smi's path on the job's PATH, or None (no NVIDIA GPU here, or no driver tools)."""
    return shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))


def parse_compute_apps(text: str) -> dict[int, int | None] | None:
    """{pid: MiB it holds, over every GPU (None: not reported, e.g. `[N/A]`)} from the output of
    ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`` ({}: none).

    None when it is not that CSV at all ("NVIDIA-SMI has failed because it couldn't communicate with the
    NVIDIA driver", "No devices were found"): nothing can be told. Lines that are not a pid and a number
    (a warning among them) are left out."""
    apps: dict[int, int | None] = {}
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 2 or not fields[0].isdigit():
            continue
        pid, memory = int(fields[0]), int(fields[1]) if fields[1].isdigit() else None
        if pid in apps:  # one line per GPU it uses
            before = apps[pid]
            apps[pid] = None if before is None or memory is None else before + memory
        else:
            apps[pid] = memory
    if lines and not apps:
        return None
    return apps


def holding(apps: Mapping[int, int | None], ours: Collection[int]) -> list[int]:
    """The pids nvidia-smi lists that are `ours` (any of their pids in any namespace), in order. A listed
    pid counts whatever memory it shows: it still has a context on a GPU."""
    return sorted(pid for pid in apps if pid in ours)
