"""Free ports for test jobs: below the kernel's ephemeral range, so nothing else is handed them meanwhile."""

from __future__ import annotations

import os
import random
import socket

FIRST_TEST_PORT = 10000
# Ports that tests or launchers use as defaults (torchrun's 29500, horovod's, a test's fixed ports).
AVOID = ((12340, 12360), (17000, 17010), (29400, 29600))


def free_port(host: str = "127.0.0.1") -> int:
    """A free port, with its successor free too, on `host` and on 127.0.0.1, outside the kernel's
    ephemeral range.

    A test hands the port to a job that binds it a second or more later, and layers derive
    others from it (the control port is the master port + 1; a per-job sshd listens on the same
    --ssh-port on every node, the chief's on 127.0.0.1). A port from bind(("", 0)) is an ephemeral
    one: in that time any outgoing connection on the machine (gloo, ssh, another test's job) may
    be given it, or its odd successor (Linux hands odd ephemeral ports to connect(), even ones to
    bind(0)), and the job fails with "Address already in use". Below the ephemeral range the
    kernel hands out nothing by itself; a random pick keeps concurrent test runs apart, and each
    pytest-xdist worker picks from a share of its own (`worker_ports`), so two workers never hand
    out the same port in the second before a job binds it.
    """
    first, last = worker_ports()
    hosts = dict.fromkeys(["127.0.0.1", host])
    while True:
        port = random.randrange(first, last - 1)
        if any(lo <= port + 1 and port <= hi for lo, hi in AVOID):
            continue
        if all(can_bind(h, p) for h in hosts for p in (port, port + 1)):
            return port


def worker_ports() -> tuple[int, int]:
    """[first, last) of the ports this process picks from: below the ephemeral range, split evenly
    between pytest-xdist's workers (PYTEST_XDIST_WORKER gwN of PYTEST_XDIST_WORKER_COUNT); all of
    it without xdist."""
    low = ephemeral_range()[0]
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    share = (low - FIRST_TEST_PORT) // count
    return FIRST_TEST_PORT + worker * share, FIRST_TEST_PORT + (worker + 1) * share


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (bind to 0, connect), at least 1000 ports above ours."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
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
