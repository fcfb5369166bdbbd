"""CPU % and RSS of a rank's process tree, cheap enough to sample on a timer.

Cheap because it reads only the tree's own /proc files: its children through
/proc/PID/task/TID/children (instead of scanning every process of the machine, as psutil's
``children(recursive=True)`` does: the fallback on a kernel without those files), and each
process's CPU times and RSS from one read of /proc/PID/stat (what psutil reads; psutil itself
would cost the supervisor about 1 MB). The previous CPU times are what CPU % is measured against.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

from detlaunch.system.procs import children_files as _children_files
from detlaunch.system.procs import tree_pids as _tree_pids

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


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
        self._trees: dict[int, _Tree] = {}
        self._tree_pids = _tree_pids if _children_files() else _psutil_tree_pids

    def sample(self, pid: int) -> Usage | None:
        """The tree under `pid` now; None when `pid` has gone."""
        now = self._clock()
        pids = self._tree_pids(pid)
        if not pids:
            self.forget(pid)
            return None
        cpu: dict[int, float] = {}
        rss = 0
        for p in pids:
            usage = _cpu_and_rss(p)
            if usage is not None:
                cpu[p], bytes_resident = usage
                rss += bytes_resident
        if not cpu:
            self.forget(pid)
            return None
        last = self._trees.get(pid)
        percent = None
        if last is not None and now > last.taken_at:
            used = sum(max(0.0, c - last.cpu.get(p, 0.0)) for p, c in cpu.items())  # new children: since birth
            percent = 100.0 * used / (now - last.taken_at)
        self._trees[pid] = _Tree(now, cpu)
        return Usage(percent, rss, len(cpu))

    def forget(self, pid: int) -> None:
        """Drop what is kept for the tree under `pid` (its rank exited)."""
        self._trees.pop(pid, None)


def _cpu_and_rss(pid: int) -> tuple[float, int] | None:
    """(CPU seconds, user + system, and resident bytes) of one process; None when it has gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold anything
        # fields[0] is the state (field 3 of proc(5)): utime 14, stime 15, rss 24 (pages)
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, int(fields[21]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return None


def _psutil_tree_pids(root: int) -> list[int]:
    """The same through psutil, which scans every process of the machine: the fallback."""
    import psutil

    try:
        return [root, *(c.pid for c in psutil.Process(root).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []
