"""Reaching a peer that may not be up yet: a non-blocking connect, retried with backoff.

Whether a remote port has opened cannot be waited on, so refused attempts are retried after
20 ms, 40 ms, ... up to 0.5 s, on the event loop's timers; the loop itself never blocks.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable, Iterable

from detlaunch.system.eventloop import EventLoop, Priority, Timer

RETRY_FIRST, RETRY_MAX = 0.02, 0.5


class Dialer:
    """Connects to (host, port), calling `on_connected(sock)` once a connection is up.

    `on_error(why)` is called once, for what retrying cannot fix (the name does not resolve).
    """

    def __init__(self, loop: EventLoop, host: str, port: int, on_connected: Callable[[socket.socket], None],
                 on_error: Callable[[str], None], *, source: str | None = None):
        self.loop, self.host, self.port = loop, host, port
        self.on_connected, self.on_error = on_connected, on_error
        self.source = source  # leave from this address (this node's own), when it is one of ours
        self.delay = RETRY_FIRST
        self.sock: socket.socket | None = None
        self.timer: Timer | None = None
        self.stopped = False
        self.reached = False  # the host answered once (a connection, or a refusal): it is there
        self.attempt()

    def attempt(self) -> None:
        self.timer = None
        if self.stopped:
            return
        try:
            family, _, _, _, addr = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0]
        except (socket.gaierror, UnicodeError) as e:  # UnicodeError: a name IDNA cannot encode
            self.stopped = True
            self.on_error(f"cannot resolve {self.host!r}: {getattr(e, 'strerror', None) or e}")
            return
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        if self.source:
            try:
                sock.bind((self.source, 0))
            except OSError:
                self.source = None  # not an address of this machine after all: any source will do
        if (err := sock.connect_ex(addr)) not in (0, errno.EINPROGRESS):
            self.reached = self.reached or err == errno.ECONNREFUSED
            sock.close()
            self.retry()
            return
        self.sock = sock
        self.loop.add_writer(sock, Priority.CHILD_OUTPUT, self._on_writable)

    def _on_writable(self) -> None:
        sock, self.sock = self.sock, None
        assert sock is not None
        self.loop.remove(sock)
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        self.reached = self.reached or err in (0, errno.ECONNREFUSED)
        if err != 0:
            sock.close()
            self.retry()
            return
        self.on_connected(sock)

    def retry(self) -> None:
        if self.stopped:
            return
        self.timer = self.loop.call_later(self.delay, self.attempt)
        self.delay = min(self.delay * 2, RETRY_MAX)

    def stop(self) -> None:
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.sock is not None:
            self.loop.remove(self.sock)
            self.sock.close()
            self.sock = None


class SshdProbe:
    """Waits for one peer's sshd to answer with its greeting (``SSH-...``), then calls `on_ready(probe)`."""

    def __init__(self, loop: EventLoop, host: str, port: int, on_ready: Callable[[SshdProbe], None],
                 on_error: Callable[[str], None]):
        self.loop, self.host, self.port = loop, host, port
        self.on_ready = on_ready
        self.ready = False
        self.sock: socket.socket | None = None
        self.dialer = Dialer(loop, host, port, self._on_connected, on_error)

    def _on_connected(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop.add_reader(sock, Priority.PROBE, self._on_greeting)

    def _on_greeting(self) -> None:
        sock, self.sock = self.sock, None
        assert sock is not None
        self.loop.remove(sock)
        try:
            greeting = sock.recv(64)
            if greeting.startswith(b"SSH-"):
                sock.send(b"SSH-2.0-detlaunch-probe\r\n")  # say who we are: sshd logs no error then
        except OSError:
            greeting = b""
        sock.close()
        if greeting.startswith(b"SSH-"):
            self.ready = True
            self.dialer.stop()
            self.on_ready(self)
        else:
            self.dialer.retry()

    def close(self) -> None:
        self.dialer.stop()
        if self.sock is not None:
            self.loop.remove(self.sock)
            self.sock.close()
            self.sock = None


def probe_sshds(loop: EventLoop, peers: Iterable[tuple[str, int]], on_ready: Callable[[SshdProbe], None],
                on_error: Callable[[str], None]) -> list[SshdProbe]:
    """Probe every peer's sshd at once: a job of N nodes waits for its slowest sshd, not for N in turn."""
    return [SshdProbe(loop, host, port, on_ready, on_error) for host, port in peers]
