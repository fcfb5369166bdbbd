"""The sampler measures a rank's real process tree: its CPU % and RSS, children included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from detlaunch.observe.sampler import ProcessTreeSampler, _psutil_tree_pids, _tree_pids

BUSY_PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
while True:
    pass
"""


@pytest.fixture
def busy_tree() -> Iterator[tuple[int, int]]:
    """A process burning CPU, with one sleeping child: (parent pid, child pid)."""
    p = subprocess.Popen([sys.executable, "-c", BUSY_PARENT], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout is not None
        yield p.pid, int(p.stdout.readline())
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


@pytest.mark.timeout(30)
def test_the_sampler_measures_the_whole_tree(real_processes: None, busy_tree: tuple[int, int]) -> None:
    parent, child = busy_tree
    assert sorted(_tree_pids(parent)) == sorted(_psutil_tree_pids(parent)) == sorted([parent, child])
    sampler = ProcessTreeSampler()
    first = sampler.sample(parent)
    assert first is not None and first.cpu_percent is None and first.processes == 2 and first.rss > 10_000_000
    time.sleep(0.5)
    second = sampler.sample(parent)
    assert second is not None and second.cpu_percent is not None
    assert 5.0 < second.cpu_percent < 110.0  # one busy thread: up to one core (the machine may be loaded)
    idle = ProcessTreeSampler()
    idle.sample(child)
    time.sleep(0.3)
    usage = idle.sample(child)
    assert usage is not None and usage.processes == 1 and usage.cpu_percent is not None and usage.cpu_percent < 5.0


def test_the_sampler_says_none_once_the_process_has_gone(real_processes: None) -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    sampler = ProcessTreeSampler()
    assert sampler.sample(p.pid) is None
    assert _tree_pids(p.pid) == [] and _psutil_tree_pids(p.pid) == []
