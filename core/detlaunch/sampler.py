"""CPU % and RSS of a rank's process tree, cheap enough to sample on a timer.

Cheap because it keeps each psutil.Process between samples (no re-lookup; the previous CPU times
are what CPU % is measured against) and finds children through /proc/PID/task/TID/children (only
the tree's own files) instead of scanning every process of the machine, as psutil's
``children(recursive=True)`` does (the fallback on a kernel without those files).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .procs import children_files as _children_files
from .procs import tree_pids as _tree_pids

if TYPE_CHECKING:
    import psutil


@dataclasses.dataclass(frozen=True)
class Usage:
    """A process tree's CPU (percent of one core, since the previous sample; None on the first) and RSS
    (bytes, summed over the tree, so pages shared between a rank and its forked workers count twice)."""

    cpu_percent: float | None
    rss: int
    processes: int


@dataclasses.dataclass
class _Tree:
    taken_at: float
    cpu: dict[int, float]  # pid -> its CPU seconds at the last sample


class ProcessTreeSampler:
    """CPU % and RSS of the process trees under given pids, sampled on a timer."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._procs: dict[int, psutil.Process] = {}
        self._trees: dict[int, _Tree] = {}
        self._tree_pids = _tree_pids if _children_files() else _psutil_tree_pids

    def sample(self, pid: int) -> Usage | None:
        """The tree under `pid` now; None when `pid` has gone."""
        import psutil  # at the first sample, not when detlaunch starts (about 1 MB and 15 ms)

        now = self._clock()
        pids = self._tree_pids(pid)
        if not pids:
            self.forget(pid)
            return None
        cpu: dict[int, float] = {}
        rss = 0
        for p in pids:
            proc = self._procs.get(p)
            try:
                if proc is None:
                    proc = self._procs[p] = psutil.Process(p)
                with proc.oneshot():
                    times = proc.cpu_times()
                    rss += proc.memory_info().rss
                cpu[p] = times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self._procs.pop(p, None)
        if not cpu:
            self.forget(pid)
            return None
        last = self._trees.get(pid)
        percent = None
        if last is not None and now > last.taken_at:
            used = sum(max(0.0, c - last.cpu.get(p, 0.0)) for p, c in cpu.items())  # new children: since birth
            percent = 100.0 * used / (now - last.taken_at)
        for gone in (last.cpu.keys() - cpu.keys()) if last else ():
            self._procs.pop(gone, None)
        self._trees[pid] = _Tree(now, cpu)
        return Usage(percent, rss, len(cpu))

    def sample_all(self, pids: Iterable[int]) -> dict[int, Usage | None]:
        return {pid: self.sample(pid) for pid in pids}

    def forget(self, pid: int) -> None:
        """Drop what is kept for the tree under `pid` (its rank exited)."""
        tree = self._trees.pop(pid, None)
        for p in tree.cpu if tree else (pid,):
            self._procs.pop(p, None)


def _psutil_tree_pids(root: int) -> list[int]:
    """The same through psutil, which scans every process of the machine: the fallback."""
    import psutil

    try:
        return [root, *(c.pid for c in psutil.Process(root).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []
