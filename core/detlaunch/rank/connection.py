"""The wrapper's end of its node's supervisor socket: registering, then messages both ways.

Part of the per-rank wrapper (``python -S``, stdlib only: see wrapper.py). The messages are
protocol.py's.
"""

from __future__ import annotations

import _socket as socket  # the C module under socket: the same calls, without its enum wrappers (~1 MB)
import os
import sys

try:  # imported as detlaunch.rank.connection
    from . import protocol as rank_protocol
    from .options import UsageError
except ImportError:  # by file, from the wrapper's folder (python -S run_wrapper.py)
    import protocol as rank_protocol  # type: ignore[no-redef]
    from options import UsageError  # type: ignore[no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:  # never at run time: the typing module alone costs about 1 MB
    from typing import Any


class SupervisorConnection:
    """The connection to this node's supervisor (the pid_server role), or None when running alone."""

    @staticmethod
    def connect(path: str | None, job: str, rank: int
                ) -> tuple[SupervisorConnection | None, tuple[int, int], dict[str, Any]]:
        """Register; return the link and the console fds the supervisor hands over.

        Rank output goes straight to the node's console (the supervisor's stdout and
        stderr, passed over the socket), not through the launcher's pipes: no launcher
        re-prefixes it, ships it to another node, or slows it down.
        """
        if not path:
            return None, (1, 2), {}
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        try:
            sock.connect(path)
        except OSError as e:
            raise UsageError(f"cannot reach this node's detlaunch supervisor at {path}: {e.strerror}") from None
        link = SupervisorConnection(sock)
        link.send({"t": rank_protocol.HELLO, "job": job, "rank": rank, "pid": os.getpid()})
        data, fds = recv_fds(sock, 4096, 2)
        link.buffer = data
        reply = link.receive()
        if reply.get("t") != rank_protocol.OK or len(fds) != 2:
            raise UsageError(f"the supervisor refused rank {rank}: {reply.get('why', 'no reason given')}")
        sock.settimeout(None)
        return link, (fds[0], fds[1]), reply

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(rank_protocol.encode(message))

    def receive(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            data = self.sock.recv(4096)
            if not data:
                return {}
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return rank_protocol.decode(line)


def recv_fds(sock: socket.socket, size: int, count: int) -> tuple[bytes, list[int]]:
    """socket.recv_fds: receive up to `size` bytes and up to `count` file descriptors."""
    data, ancillary, _, _ = sock.recvmsg(size, socket.CMSG_LEN(count * 4))
    fds = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i:i + 4], sys.byteorder) for i in range(0, len(payload) - 3, 4)]
    return data, fds
