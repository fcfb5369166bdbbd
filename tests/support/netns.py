"""Machines with network stacks of their own on one host: each node in a network namespace, all joined by a
switch (a bridge, in a namespace of its own so that the host's firewall never sees the traffic).

A node in its own namespace has its own ports (a stopped chief's rank 0 keeps the master port only on its
own address) and can be cut off for real: `split` moves some nodes' cables to a second switch, a
partition in which each side still reaches its own nodes and nothing of the other (no FIN, no RST).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import subprocess
from collections.abc import Iterable, Iterator

import pytest

from support.helpers import ip


@dataclasses.dataclass
class Lan:
    tag: str
    switch: str  # the namespace holding the bridges and the nodes' cable ends
    addrs: list[str]  # node i's address

    def ns(self, i: int) -> str:
        return f"dl-{self.tag}-{i}"

    def prefix(self, i: int) -> list[str]:
        """Run a command as machine i (`Launcher.start(prefix=...)`)."""
        return ["ip", "netns", "exec", self.ns(i)]

    def cable(self, i: int) -> str:
        return f"dlc{self.tag}{i}"

    def split(self, side: Iterable[int]) -> None:
        """A partition: machines `side` on a switch of their own, the others on the first."""
        for i in side:
            ip("-n", self.switch, "link", "set", self.cable(i), "master", f"br{self.tag}b")


@contextlib.contextmanager
def lan(count: int, net: str = "10.213.90") -> Iterator[Lan]:
    """`count` machines at net.1, net.2, ... (skips without root)."""
    if os.getuid() != 0:
        pytest.skip("needs root for network namespaces")
    tag = secrets.token_hex(2)
    net_ = Lan(tag, f"dl-{tag}-sw", [f"{net}.{i + 1}" for i in range(count)])
    made: list[str] = []
    try:
        for ns in (net_.switch, *(net_.ns(i) for i in range(count))):
            ip("netns", "add", ns)
            made.append(ns)
        for bridge in (f"br{tag}a", f"br{tag}b"):
            ip("-n", net_.switch, "link", "add", bridge, "type", "bridge")
            ip("-n", net_.switch, "link", "set", bridge, "up")
        for i in range(count):
            end = f"dln{tag}{i}"
            ip("link", "add", end, "netns", net_.ns(i), "type", "veth", "peer", "name", net_.cable(i),
               "netns", net_.switch)
            ip("-n", net_.switch, "link", "set", net_.cable(i), "master", f"br{tag}a")
            ip("-n", net_.switch, "link", "set", net_.cable(i), "up")
            ip("-n", net_.ns(i), "addr", "add", f"{net_.addrs[i]}/24", "dev", end)
            ip("-n", net_.ns(i), "link", "set", end, "up")
            ip("-n", net_.ns(i), "link", "set", "lo", "up")
        yield net_
    finally:  # deleting a namespace deletes its end of each veth pair, and so the pair
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
