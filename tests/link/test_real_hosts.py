"""Two machines as Debian sets them up: each node in a network namespace of its own, joined by a veth
pair, whose /etc/hosts says ``127.0.1.1 <its own name>`` (``ip netns exec`` puts /etc/netns/NS/hosts in
its place). Each node resolves its own name to loopback: detlaunch must still join them (issue 24)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.helpers import free_port, ip
from support.jobs import SCRIPTS, Launcher

pytestmark = pytest.mark.timeout(240)
NET = "10.213.78"


@pytest.fixture
def two_machines() -> Iterator[dict[str, str]]:
    """{node name: its namespace}; each namespace's veth end is named by its node ("dl" + name)."""
    if os.getuid() != 0:
        pytest.skip("needs root for network namespaces")
    tag = secrets.token_hex(3)
    names = {f"na{tag}": f"dla{tag}", f"nb{tag}": f"dlb{tag}"}
    (a, ns_a), (b, ns_b) = names.items()
    made: list[str] = []
    try:
        for ns in (ns_a, ns_b):
            ip("netns", "add", ns)
            made.append(ns)
        ip("link", "add", f"v{a}", "netns", ns_a, "type", "veth", "peer", "name", f"v{b}", "netns", ns_b)
        for i, (name, ns) in enumerate(names.items(), start=1):
            ip("-n", ns, "addr", "add", f"{NET}.{i}/24", "dev", f"v{name}")
            ip("-n", ns, "link", "set", f"v{name}", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            other = b if name == a else a
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {name}\n"
                                       f"{NET}.{2 if name == a else 1} {other}\n")
        yield names
    finally:
        for ns in made:
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_nodes_whose_own_names_resolve_to_loopback_still_join(launcher: Launcher,
                                                              two_machines: dict[str, str]) -> None:
    (a, ns_a), (b, ns_b) = two_machines.items()
    common = ["--layer", "torchrun", "--hosts", f"{a}:1,{b}:1", "--master-port", str(free_port()),
              "--start-timeout", "60"]
    script = str(SCRIPTS / "master_addr_allreduce.py")
    jobs = [launcher.start(*common, "--node-rank", str(rank), script, prefix=["ip", "netns", "exec", ns])
            for rank, ns in enumerate((ns_a, ns_b))]
    results = [job.wait(120) for job in jobs]
    assert [r.returncode for r in results] == [0, 0], "\n----\n".join(r.output for r in results)
    # the chief's own name was loopback on it: its address instead; the worker reaches the chief by name
    for rank, (r, name, chief) in enumerate(zip(results, (a, b), (f"{NET}.1", a), strict=True)):
        assert (f"[rank={rank}] rank {rank}: all_reduce sum = 2 MASTER_ADDR={chief} GLOO_SOCKET_IFNAME=v{name}"
                in r.stdout), r.output
