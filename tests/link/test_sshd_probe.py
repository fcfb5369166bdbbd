"""The sshd greeting probes (horovod, deepspeed) wait for every peer at once, not one after another.

Three greeting servers on 127.0.0.1, each answering SSH-2.0 a delay D after it accepts, are probed
with the call the supervisor makes (`dial.probe_sshds`, on the real event loop): all are ready
within about one D. Probes waiting in turn would take three. Milliseconds, no processes.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from detlaunch.link.dial import probe_sshds
from detlaunch.system.eventloop import EventLoop

pytestmark = pytest.mark.timeout(30)

DELAY = 0.3  # D: each server's greeting comes this long after it accepted the probe's connection


class SlowGreeter:
    """A listening socket whose one connection gets its SSH greeting after DELAY (a thread: not the loop's)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.accepted_at: float | None = None
        self.reply = b""
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            self.accepted_at = time.monotonic()
            time.sleep(DELAY)  # a slow sshd (test side: the product code under test never sleeps)
            conn.sendall(b"SSH-2.0-OpenSSH_test\r\n")
            conn.settimeout(5)
            self.reply = conn.recv(64)

    def close(self) -> None:
        self.thread.join(5)
        self.listener.close()


def test_three_slow_sshds_are_all_ready_within_about_one_greeting_delay() -> None:
    servers = [SlowGreeter() for _ in range(3)]
    loop = EventLoop()
    ready_at: dict[int, float] = {}
    errors: list[str] = []
    try:
        started = time.monotonic()
        probes = probe_sshds(loop, [("127.0.0.1", s.port) for s in servers],
                             lambda p: ready_at.setdefault(p.port, time.monotonic()), errors.append)
        loop.run(done=lambda: all(p.ready for p in probes) or bool(errors))
        took = time.monotonic() - started
        for p in probes:
            p.close()
    finally:
        loop.close()
        for s in servers:
            s.close()
    assert errors == []
    assert sorted(ready_at) == sorted(s.port for s in servers)
    assert took < 2.5 * DELAY, f"3 probes of {DELAY} s each took {took:.2f} s: they waited in turn"
    assert took >= DELAY  # and each one did wait for its greeting
    accepted = [s.accepted_at for s in servers]
    assert None not in accepted
    assert max(accepted) - min(accepted) < DELAY, "a probe dialed only after another's greeting"  # type: ignore[operator]
    assert all(s.reply.startswith(b"SSH-2.0-detlaunch-probe") for s in servers)  # it says who it is
