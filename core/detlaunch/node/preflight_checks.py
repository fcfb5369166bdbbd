"""The preflight's built-in checks: a compute check on the node and a network check in its pair.

They come through the public ``detlaunch_preflight_checks`` hook like any plugin's (the check child,
node/preflight_child.py, registers this module), and run only in that child: torch is imported there,
never in the launcher. Both are small and fixed, so that their figures compare across nodes: a slow
node is one whose fixed work took longer.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from detlaunch.planning.hookspecs import hookimpl  # detlaunch.hookimpl, as any plugin's checks use it
from detlaunch.planning.preflight import PreflightCheck
from detlaunch.planning.preflight import PreflightFigure as Figure
from detlaunch.planning.preflight import PreflightPeer as Peer

MATMUL_SIZE = 384  # a fixed matmul: 2 x 384^3 flops a call
MATMUL_CALLS = 8  # a chunk: ~12 ms of a core here
CHUNKS = 10  # the best chunk counts: a moment of contention on a shared machine is not the node's speed
TRANSFER_FLOATS = 2 * 1024 * 1024  # 8 MiB a transfer: enough to measure bandwidth, not latency
TRANSFERS = 4


def compute(peer: Peer | None) -> Figure:
    """GFLOP/s of a fixed matmul on the node's device (CUDA when there is one, else the CPU): its best chunk; on
    the CPU, times the share of a CPU the node's cgroups allow (`cpu_share`), the speed it can sustain.

    Short chunks, the best of many, keep a moment of contention out of the figure (nodes that share a machine
    take turns); but a chunk shorter than a CFS period runs at full speed under a CPU quota (a node with a fifth
    of a CPU measured 12 ms chunks at full speed here), so the quota, read from the node's cgroups, counts too.
    """
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(1)  # a core's speed: comparable across nodes, and nodes sharing a machine do not collide
    a = torch.rand(MATMUL_SIZE, MATMUL_SIZE, device=device)
    b = torch.rand(MATMUL_SIZE, MATMUL_SIZE, device=device)
    (a @ b).sum().item()  # warm-up: the first call pays for allocation and kernel choice
    chunks = []
    for _ in range(CHUNKS):
        start = time.perf_counter()
        for _ in range(MATMUL_CALLS):
            c = a @ b
        c.sum().item()  # waits for a GPU's queue
        chunks.append(time.perf_counter() - start)
    best = min(chunks)
    detail = f"{device}, best of {CHUNKS} chunks {best:.3f} s"
    share = cpu_share() if device == "cpu" else None
    if share is not None and share < 1:
        detail += f"; a CPU quota of {share:.2g} CPU (cgroup)"
    return Figure(True, 2 * MATMUL_SIZE ** 3 * MATMUL_CALLS / best / 1e9 * min(share or 1.0, 1.0), detail)


def cpu_share(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """The share of a CPU this process may use under its cgroups' CPU quotas (v2 `cpu.max`, v1
    `cpu.cfs_quota_us` / `cpu.cfs_period_us`): the smallest on the way up from its cgroup; None: no quota."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    shares = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        v1 = "cpu" in controllers.split(",")
        if controllers and not v1:
            continue
        base = Path(root) / controllers if v1 else Path(root)
        if v1 and not base.is_dir():
            base = Path(root) / "cpu"
        here = Path(path.lstrip("/"))
        for folder in (base / d for d in (here, *here.parents)):
            share = _quota(folder, v1)
            if share is not None:
                shares.append(share)
    return min(shares) if shares else None


def _quota(folder: Path, v1: bool) -> float | None:
    try:
        if v1:
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
        else:
            limit, period_text = (folder / "cpu.max").read_text().split()
            if limit == "max":
                return None
            quota, period = int(limit), int(period_text)
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def network(peer: Peer | None) -> Figure:
    """MB/s of an all-reduce in the node's group: a real torch.distributed group on the job's backend."""
    if peer is None:
        return Figure(True, None, "no other node")
    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=peer.timeout)
    try:
        store = dist.TCPStore(  # type: ignore[attr-defined]
            peer.master_addr, peer.master_port, peer.size, peer.rank == 0, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - a group that cannot form is this check's finding
        return Figure(False, None, f"no group with node(s) {peer.nodes}: {type(e).__name__}: {e}"[:300])
    broken = start_alone(peer.backend)  # this node's own torch.distributed, before its partners wait on it
    try:
        failed = [n for n in group_starts(store, peer, broken, timeout) if n != peer.nodes[peer.rank]]
        if broken:
            return Figure(False, None, f"cannot start a {peer.backend} group on this node: {broken}"[:300])
        if failed:  # a partner's own failure names that node, not this one (planning/preflight.py)
            return Figure(True, None, f"not measured: node(s) {failed} cannot start a {peer.backend} group")
        dist.init_process_group(peer.backend, store=store, rank=peer.rank, world_size=peer.size, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - a group that cannot form is this check's finding
        return Figure(False, None, f"no group with node(s) {peer.nodes}: {type(e).__name__}: {e}"[:300])
    try:
        device = "cuda" if peer.backend == "nccl" else "cpu"
        data = torch.ones(TRANSFER_FLOATS, device=device)
        dist.all_reduce(data)  # warm-up: the connections are made here
        dist.barrier()
        start = time.perf_counter()
        for _ in range(TRANSFERS):
            dist.all_reduce(data)
        data.sum().item()
        seconds = time.perf_counter() - start
        dist.barrier()
    finally:
        dist.destroy_process_group()
    size = data.element_size() * data.numel()
    return Figure(True, size * TRANSFERS / seconds / 1e6, f"{seconds:.3f} s for {TRANSFERS} x {size >> 20} MiB")


def start_alone(backend: str) -> str:
    """Whether this node's torch starts a group on `backend` at all (a group of one: no peer to wait for): ""
    when it does, else why not. A node whose environment is wrong (a missing interface in GLOO_SOCKET_IFNAME,
    a backend its build lacks) fails here at once, where in a pair its partners would wait for it until the
    group's timeout and be named with it."""
    import torch
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,  # type: ignore[attr-defined]
                                timeout=timedelta(seconds=30))
        try:
            dist.all_reduce(torch.zeros(1, device="cuda" if backend == "nccl" else "cpu"))
        finally:
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - whatever stops it is the finding
        return f"{type(e).__name__}: {e}".strip() or type(e).__name__
    return ""


def group_starts(store: Any, peer: Peer, broken: str, timeout: timedelta) -> list[int]:
    """Every node of the group says whether it started a group alone (`broken`: why not): the nodes that did
    not. The store's server (group rank 0) waits until every node has read, so that it outlives their reads."""
    store.set(f"preflight-start/{peer.rank}", broken)
    started = [f"preflight-start/{r}" for r in range(peer.size)]
    store.wait(started, timeout)
    failed = [peer.nodes[r] for r in range(peer.size) if store.get(started[r])]
    store.set(f"preflight-read/{peer.rank}", "")
    if peer.rank == 0:
        store.wait([f"preflight-read/{r}" for r in range(peer.size)], timeout)
    return failed


@hookimpl
def detlaunch_preflight_checks(config: Any) -> list[PreflightCheck]:
    return [PreflightCheck("compute", compute, "GFLOP/s"),
            PreflightCheck("network", network, "MB/s", pairwise=True)]
