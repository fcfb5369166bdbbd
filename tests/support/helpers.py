"""Small helpers shared by the tests."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psutil
from detlaunch.testing import free_port as free_port  # the shipped ones, re-exported
from detlaunch.testing.runner import rank_lines as rank_lines

T = TypeVar("T")


def ip(*args: str) -> None:
    """iproute2, for the tests' network namespaces and veth pairs."""
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def report_line(stderr: str) -> str:
    m = re.search(r"^detlaunch: job failed: .*$", stderr, re.M)
    assert m, f"no root-cause line in:\n{stderr}"
    return m.group(0)


def wait_until(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Call `probe` every 50 ms until it returns something truthy (tests only: the product never polls)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def descendants_where(pid: int, keep: Callable[[psutil.Process], bool]) -> list[psutil.Process]:
    """The processes below `pid` that `keep` accepts. A process that exits between the listing and the look (an
    ssh-keygen, a short-lived helper of the job's) is none of them, not an error of the test."""
    found = []
    for proc in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            if keep(proc):
                found.append(proc)
    return found


@contextlib.contextmanager
def small_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of the test's own at `mount` (created), `size` big (mount's size=, e.g. 8k): a disk that fills."""
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
