"""Small helpers shared by the tests."""

from __future__ import annotations

import contextlib
import random
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from detlaunch.testing.runner import rank_lines as rank_lines  # the shipped one, re-exported

T = TypeVar("T")


def free_port(host: str = "127.0.0.1") -> int:
    """A free port, with its successor free too, on `host` and on 127.0.0.1, outside the kernel's
    ephemeral range.

    A test hands the port to a job that binds it a second or more later, and layers derive
    others from it (the link port is the master port + 1; a per-job sshd listens on the same
    --ssh-port on every node, the chief's on 127.0.0.1). A port from bind(("", 0)) is an ephemeral
    one: in that time any outgoing connection on the machine (gloo, ssh, another test's job) may
    be given it, or its odd successor (Linux hands odd ephemeral ports to connect(), even ones to
    bind(0)), and the job fails with "Address already in use". Below the ephemeral range the
    kernel hands out nothing by itself; a random pick keeps concurrent test runs apart.
    """
    low = ephemeral_range()[0]
    hosts = dict.fromkeys(["127.0.0.1", host])
    while True:
        port = random.randrange(FIRST_TEST_PORT, low - 1)
        if any(lo <= port + 1 and port <= hi for lo, hi in AVOID):
            continue
        if all(can_bind(h, p) for h in hosts for p in (port, port + 1)):
            return port


FIRST_TEST_PORT = 10000
AVOID = ((12340, 12360), (17000, 17010), (29400, 29600))  # ports tests or launchers use as defaults


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return max(low, FIRST_TEST_PORT + 1000), high


def can_bind(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


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


@contextlib.contextmanager
def small_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of the test's own at `mount` (created), `size` big (mount's size=, e.g. 8k): a disk that fills."""
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
