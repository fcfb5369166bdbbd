"""A node's rank registry, served in the test's own process (see Node): for the registry's and the wrapper's tests."""

from __future__ import annotations

import os
import select
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from detlaunch.node.rank_registry import RankEntry, RankRegistry, RankRules
from detlaunch.outcome import RankStatus
from detlaunch.rank import protocol as rank_protocol
from detlaunch.rank.connection import SupervisorConnection, recv_fds
from detlaunch.system.eventloop import EventLoop


def readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


class Node:
    """A node's rank registry on a real Unix socket, served by a real event loop in this process: a wrapper
    (the real one, or a test speaking its protocol) registers and reports as it would to its supervisor."""

    def __init__(self, path: Path, welcome: dict[str, Any] | None = None) -> None:
        self.loop = EventLoop()
        self.accepting = True
        self.exits: list[RankStatus] = []
        self.registered: list[RankEntry] = []
        self.console = os.pipe()
        rules = RankRules(job_id="job-1", node_rank=1, first_rank=2, local_slots=2, check_range=True)
        self.registry = RankRegistry(self.loop, rules, "127.0.0.2", accepting=lambda: self.accepting,
                                     welcome=lambda: {"log_dir": None, "console_ranks": [2], **(welcome or {})},
                                     console_fds=self.console, on_registered=self.registered.append,
                                     on_exit=self.exits.append, trace=lambda _m: None)
        self.path = str(path)
        self.registry.listen(self.path)

    def serve_until(self, what: Any, timeout: float = 10) -> None:
        self.loop.run_until(what, timeout, "the registry's answer")

    def connect(self, rank: int, job: str = "job-1") -> tuple[SupervisorConnection | None, dict[str, Any]]:
        """A wrapper's registration, answered by the registry in a thread-free way: serve, then read."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        sock.sendall(rank_protocol.encode({"t": "hello", "job": job, "rank": rank, "pid": os.getpid()}))
        self.serve_until(lambda: readable(sock))  # the reply (or the close) has come
        link = SupervisorConnection(sock)
        data, fds = recv_fds(sock, 4096, 2)
        link.buffer = data
        reply = link.receive()
        for fd in fds:
            os.close(fd)
        return link, reply

    def close(self) -> None:
        self.registry.close()
        self.loop.close()
        for fd in self.console:
            os.close(fd)


def serving(tmp_path: Path, welcome: dict[str, Any] | None = None) -> Iterator[Node]:
    """A test module's `node` fixture: `yield from serving(tmp_path)`. Node's first rank is 2, its console rank 2."""
    n = Node(tmp_path / "s.sock", welcome)
    yield n
    n.close()
