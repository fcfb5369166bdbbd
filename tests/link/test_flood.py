"""A connection flood on the chief's link port, from another user, does not keep a node out of the
job nor slow its verdict path: unauthenticated work is bounded per address, in all, and per second."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from detlaunch.link.auth import Admission, admits
from detlaunch.system.eventloop import EventLoop
from support.helpers import free_port
from support.jobs import SCRIPTS, Launcher
from test_rejoin_link import Events, chief_link, run_until, settings, worker_link

FLOOD = textwrap.dedent("""
    import socket, sys, time
    port, deadline = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
    held, made = [], 0
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=0.2, source_address=("127.0.0.5", 0))
            held.append(s)
            made += 1
            if len(held) > 500:
                held.pop(0).close()
        except OSError:
            time.sleep(0.001)
    print(made, flush=True)
""")


def test_admission_bounds_pending_connections_and_their_rate() -> None:
    a = Admission(per_second=10, max_pending=4, max_per_peer=2)
    assert [a.wait(now=0.0) for _ in range(4)] == [0.0] * 4  # a burst up to max_pending
    assert a.wait(now=0.0) == pytest.approx(0.1)  # no token left: 1/10 s for the next
    assert a.wait(now=0.1) == 0.0 and a.wait(now=0.1) > 0
    assert a.wait(now=100.0) == 0.0 and a.tokens == 3  # refilled, capped at max_pending
    known = {"10.0.0.2"}
    assert admits("10.0.0.9", ["10.0.0.9"], known, a) and not admits("10.0.0.9", ["10.0.0.9"] * 2, known, a)
    strangers = ["10.0.0.7", "10.0.0.7", "10.0.0.8", "10.0.0.8"]  # every slot for others held
    assert not admits("10.0.0.9", strangers, known, a)
    assert admits("10.0.0.2", strangers, known, a)  # a node of the job still gets in
    assert not admits("10.0.0.2", [*strangers, "10.0.0.2", "10.0.0.2"], known, a)  # two of its own at most


@pytest.fixture
def other_user() -> Iterator[str]:
    user = f"dl{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "-M", "-s", "/bin/sh", user], check=True)
    uid = pwd.getpwnam(user).pw_uid
    yield user
    for pid in processes_of(uid):  # by PID: whatever the user still runs
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["userdel", user], check=True)


def processes_of(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{entry}/status").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        uids = [line.split()[1] for line in status.splitlines() if line.startswith("Uid:")]
        if uids == [str(uid)]:
            found.append(int(entry))
    return found


@pytest.mark.timeout(240)
def test_a_flood_from_another_user_neither_keeps_a_node_out_nor_hides_the_cause(
        launcher: Launcher, tmp_path: Path, other_user: str) -> None:
    master = free_port()
    control = free_port()
    common = ["--layer", "torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--master-port", str(master), "--link-port", str(control)]
    env = {"FAIL_RANK": "1", "FAIL_CODE": "3", "SLEEP": "120"}
    chief = launcher.start(*common, "--node-rank", "0", "--node-addr", "127.0.0.1", str(SCRIPTS / "ranks.py"), env=env)
    # the flood is on before the worker arrives, and lasts the whole job
    flood = subprocess.Popen(["runuser", "-u", other_user, "--", "/usr/bin/python3", "-c", FLOOD, str(control), "60"],
                             stdout=subprocess.PIPE, text=True, cwd="/", start_new_session=True)
    try:
        worker = launcher.start(*common, "--node-rank", "1", "--node-addr", "127.0.0.2", str(SCRIPTS / "ranks.py"),
                                env=env)
        done = [chief.wait(timeout=180), worker.wait(timeout=60)]
    finally:
        os.killpg(flood.pid, signal.SIGKILL)  # runuser and the flood it started
        flood.wait()
    assert [d.returncode for d in done] == [3, 3], done[0].output + done[1].output
    for d in done:
        assert "detlaunch: job failed: rank 1 on node 1 (127.0.0.2) exited with code 3" in d.stderr, d.output


def test_a_few_addresses_holding_every_pending_slot_do_not_keep_a_node_out(tmp_path: Path) -> None:
    """Security round 2, item 9: 8 addresses x 8 connections held every one of the 64 unauthenticated slots, and a
    node of the job waited in the backlog until they timed out. The job's own addresses are never kept out by
    others' connections; others still share 64 slots, 8 an address (in-process, real sockets on loopback)."""
    loop, port = EventLoop(), free_port()
    chief_events, worker_events = Events(), Events()
    chief = chief_link(loop, settings(0, port, str(tmp_path)), chief_events)
    held: list[socket.socket] = []
    try:
        for a in range(8):
            for _ in range(9):  # one more than an address may hold: refused
                s = socket.socket()
                s.bind((f"127.0.0.{10 + a}", 0))
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                held.append(s)
            run_until(loop, lambda: len(chief.pending) == 8 * (a + 1))  # noqa: B023 - called at once
        extra = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.30", 0))
        held.append(extra)
        worker = worker_link(loop, settings(1, port, str(tmp_path)), worker_events)
        try:
            run_until(loop, lambda: worker.joined, timeout=3)  # well before the pending ones time out
            assert len([p for p in chief.pending if p.peer.startswith("127.0.0.1")]) == 64
            assert all(p.peer != "127.0.0.30" for p in chief.pending)  # a 9th stranger: accepted and closed
        finally:
            worker.close()
    finally:
        for s in held:
            s.close()
        chief.close()
        loop.close()
