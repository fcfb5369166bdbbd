"""Small helpers shared by the tests."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from typing import TypeVar

from detlaunch.testing.runner import rank_lines as rank_lines  # the shipped one, re-exported

T = TypeVar("T")


def free_port(host: str = "127.0.0.1") -> int:
    """A free port whose successor is free too: a multi-node job's control port is its master port + 1,
    and an ephemeral port taken by some outgoing connection there would fail the chief at start."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as nxt:
                try:
                    nxt.bind((host, port + 1))
                except OSError:
                    continue
            return port



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
