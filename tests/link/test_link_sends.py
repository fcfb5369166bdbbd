"""Sends on the job link never block the loop; a peer that stops reading is lost, not waited for.
The chief's open-files limit. Milliseconds, no processes but one interpreter for the hard limit."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import time

import pytest
from detlaunch.link.fdlimit import SPARE, ensure_open_files
from detlaunch.link.membership import Membership
from detlaunch.link.messages import CHIEF, WORKER, Challenge, Members, RankExit, encode
from detlaunch.link.wire import HEARTBEAT, MAX_UNAUTHENTICATED, MAX_UNSENT, PeerConnection, together
from detlaunch.outcome import RankStatus
from detlaunch.system.eventloop import EventLoop, Priority


def test_a_reader_can_also_be_told_when_its_file_takes_more_data() -> None:
    loop = EventLoop()
    a, b = socket.socketpair()
    seen: list[str] = []
    loop.add_reader(a, Priority.RANK_REPORT, lambda: seen.append("read " + a.recv(10).decode()))
    loop.on_writable(a, lambda: seen.append("writable"))
    b.send(b"x")
    loop.run_once(timeout=1)
    assert seen == ["writable", "read x"]  # both in one batch
    loop.on_writable(a, None)
    seen.clear()
    loop.run_once(timeout=0.05)
    assert seen == []  # nothing to read, and no longer watched for writes
    a.close()
    b.close()
    loop.close()


def connection(loop: EventLoop) -> tuple[PeerConnection, socket.socket, list[PeerConnection]]:
    mine, theirs = socket.socketpair()
    mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    closed: list[PeerConnection] = []
    return PeerConnection(loop, mine, WORKER, lambda _c, _m: None, closed.append), theirs, closed


def test_a_peer_that_stops_reading_never_blocks_a_send_and_is_lost_past_the_bound() -> None:
    loop = EventLoop()
    conn, theirs, closed = connection(loop)
    message = json.dumps({"t": "stop", "failure": {"what": "x" * 1000}}).encode()
    slowest, sent = 0.0, 0
    while not conn.closed:
        t0 = time.monotonic()
        conn.send_encoded(message)
        slowest = max(slowest, time.monotonic() - t0)
        sent += 1
    assert slowest < 0.05  # the old blocking send waited up to 5 s here
    assert sent > MAX_UNSENT // 1100  # everything up to the bound was taken
    assert closed == [conn] and "bytes of the link unread (stopped, or hung)" in conn.why
    theirs.close()
    loop.close()


def test_what_could_not_be_sent_at_once_arrives_whole_and_in_order() -> None:
    loop = EventLoop()
    conn, theirs, closed = connection(loop)
    for i in range(300):
        conn.send_encoded(json.dumps({"t": "n", "i": i, "pad": "y" * 500}).encode())
    assert conn.writing and conn.unsent  # the kernel took only part: the rest waits for the loop
    theirs.setblocking(False)
    received = b""
    deadline = time.monotonic() + 10
    while received.count(b"\n") < 300 and time.monotonic() < deadline:
        loop.run_once(timeout=0.01)
        try:
            received += theirs.recv(1 << 16)
        except BlockingIOError:
            pass
    assert [json.loads(raw)["i"] for raw in received.splitlines()] == list(range(300))
    loop.run_once(timeout=0.01)
    assert not conn.unsent and not conn.writing and closed == []
    conn.close()
    theirs.close()
    loop.close()


def test_what_is_sent_together_waits_for_the_end_and_goes_out_in_one_write() -> None:
    """wire.together: a lost node's stop and the membership naming its replacement reach each node in one write
    (nothing is sent inside; everything, in order, at the end)."""
    loop = EventLoop()
    conn, theirs, closed = connection(loop)
    theirs.setblocking(False)
    with together([conn]):
        conn.send_encoded(b'{"t": "a"}')
        conn.send_encoded(b'{"t": "b"}')
        with pytest.raises(BlockingIOError):
            theirs.recv(1 << 16)  # nothing yet
        assert conn.held
    assert not conn.held and theirs.recv(1 << 16) == b'{"t": "a"}\n{"t": "b"}\n' and closed == []
    conn.send_encoded(b'{"t": "c"}')  # after it, at once as ever
    assert theirs.recv(1 << 16) == b'{"t": "c"}\n'
    conn.close()
    theirs.close()
    loop.close()


def test_what_follows_the_line_that_authenticates_is_not_counted_as_unauthenticated() -> None:
    """A worker joining a chief of 1024 nodes reads the welcome and a ~20 KB membership in one recv: the bytes
    after the welcome are a trusted peer's (before, the whole read counted: the connection closed in silence
    and the node hung in DIALING, 22-224 of 1024 in bench/scale_sim --chief-case). Before it, the bound holds,
    line by line, and its close is said."""
    loop = EventLoop()
    got: list[object] = []
    closed: list[PeerConnection] = []

    def on_message(conn: PeerConnection, m: object) -> None:
        got.append(m)
        conn.trusted()  # as the welcome's MAC, checked, does

    a, b = socket.socketpair()
    PeerConnection(loop, a, CHIEF, on_message, closed.append)
    big = Membership(nodes=tuple(f"10.1.{i // 250}.{i % 250}" for i in range(1025)), live=tuple(range(1025)))
    b.sendall(encode(Challenge(job="j", nonce="n")) + b"\n" + encode(Members(m=big)) + b"\n")
    loop.run_once(timeout=1)
    assert got == [Challenge(job="j", nonce="n"), Members(m=big)] and closed == []
    c, d = socket.socketpair()
    flood = PeerConnection(loop, c, CHIEF, lambda _c, _m: None, closed.append)  # never authenticated
    d.sendall((HEARTBEAT + b"\n") * (MAX_UNAUTHENTICATED // len(HEARTBEAT) + 1))
    loop.run_once(timeout=1)
    assert closed == [flood] and flood.why == f"it sent over {MAX_UNAUTHENTICATED} bytes before authenticating"
    for s in (a, b, c, d):
        s.close()
    loop.close()


def test_heartbeats_are_sent_and_skipped_without_parsing() -> None:
    loop = EventLoop()
    got: list[object] = []
    a, b = socket.socketpair()
    PeerConnection(loop, a, WORKER, lambda _c, m: got.append(m), lambda _c: None)
    exit_message = RankExit(status=RankStatus(rank=1, node_rank=1, exit_code=3))
    b.sendall(HEARTBEAT + b"\n" + encode(exit_message) + b"\n" + HEARTBEAT + b"\n" + b'{"t": "hb", "n": 1}\n')
    loop.run_once(timeout=1)
    assert got == [exit_message]
    a.close()
    b.close()
    loop.close()


def test_the_chief_raises_its_open_files_soft_limit_as_far_as_needed() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2000 + SPARE:
        pytest.skip(f"this machine's hard limit is {hard}")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert ensure_open_files(2000) == 2000 + SPARE
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (2000 + SPARE, hard)
        assert ensure_open_files(10) == 2000 + SPARE  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_hard_limit_too_low_for_the_job_is_one_clear_error(real_processes: None) -> None:
    code = ("import resource\nfrom detlaunch.errors import LaunchError\n"
            "from detlaunch.link.fdlimit import ensure_open_files\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))\n"
            "try:\n    ensure_open_files(1023)\nexcept LaunchError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.strip() == ("this job needs 1087 open files on the chief (one per node, and its own), but the "
                                   "limit is 512 (ulimit -Hn): raise it, or run fewer nodes per chief")
