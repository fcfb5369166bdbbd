"""The rank registry over a real Unix socket, driven by a real event loop, in-process (milliseconds)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from detlaunch.outcome import RankStatus
from detlaunch.rank import protocol as rank_protocol
from detlaunch.rank.connection import SupervisorConnection
from detlaunch.rank.options import UsageError
from detlaunch.rank.wrapper import __file__ as WRAPPER
from detlaunch.system.eventloop import Priority
from support.registry_node import Node, readable, serving

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    yield from serving(tmp_path)


def test_the_socket_is_the_users_only(node: Node) -> None:
    assert os.stat(node.path).st_mode & 0o777 == 0o600


def test_a_rank_registers_starts_and_reports(node: Node) -> None:
    link, reply = node.connect(2)
    assert reply == {"t": "ok", "log_dir": None, "console_ranks": [2]}
    assert link is not None and [e.rank for e in node.registered] == [2]
    link.send({"t": "started", "pid": 12345})
    link.send(rank_protocol.exit_message(3, None, ["Traceback", "ValueError: boom"], 7.5))
    node.serve_until(lambda: node.exits)
    assert node.exits == [RankStatus(rank=2, node_rank=1, exit_code=3, tail=("Traceback", "ValueError: boom"),
                                     wall=7.5, host="127.0.0.2")]
    assert node.registry.ranks[2].rank_pid == 12345 and node.registry.all_reported()


@pytest.mark.parametrize(("rank", "job", "why"), [
    (2, "job-2", "it belongs to job 'job-2', this node runs job 'job-1'"),
    (0, "job-1", "rank 0 does not belong to node 1 (its ranks are 2..3)"),
])
def test_a_wrong_registration_is_refused_with_the_reason(node: Node, rank: int, job: str, why: str) -> None:
    _, reply = node.connect(rank, job)
    assert reply == {"t": "reject", "why": why}
    assert node.registry.ranks == {}


def test_a_second_registration_of_a_rank_is_refused(node: Node) -> None:
    node.connect(3)
    _, reply = node.connect(3)
    assert reply["why"] == "rank 3 is already registered on this node"


def test_no_rank_registers_once_the_job_is_stopping(node: Node) -> None:
    node.accepting = False
    _, reply = node.connect(2)
    assert reply["why"] == "the job is stopping"


def test_a_wrapper_that_vanishes_counts_as_sigkilled(node: Node) -> None:
    link, _ = node.connect(2)
    assert link is not None
    node.registry.signal_live(0)  # signal 0: marks the rank as asked to stop, delivers nothing
    link.sock.close()
    node.serve_until(lambda: node.exits)
    (status,) = node.exits
    assert (status.exit_code, status.lost, status.stopped, status.killed) == (137, True, True, False)
    assert "its wrapper was killed before it could report" in status.describe()


def test_a_rank_detlaunch_sigkilled_says_so(node: Node) -> None:
    link, _ = node.connect(2)
    assert link is not None
    node.registry.ranks[2].peer_pid = 2**22 + 1  # no such process: the SIGKILL lands nowhere
    node.registry.kill_live()
    link.sock.close()
    node.serve_until(lambda: node.exits)
    assert node.exits[0].killed and node.exits[0].describe() == "SIGKILLed by detlaunch (it had not stopped when asked)"


def test_a_rank_that_ends_while_the_job_stops_has_its_wrapper_released_at_once(node: Node) -> None:
    """A survivor that dies by itself while the stacks are taken reports after the stop began: its wrapper,
    holding its exit for a failure of its own (wrapper.hold_exit), is let go as soon as its report is in."""
    first, _ = node.connect(2)
    late, _ = node.connect(3)
    assert first is not None and late is not None
    first.send(rank_protocol.exit_message(3, None, [], 7.5))
    node.serve_until(lambda: node.exits)
    node.registry.release()
    assert first.receive() == {"t": rank_protocol.RELEASE}
    assert not readable(late.sock)  # its rank still runs: nothing to release yet
    late.send(rank_protocol.exit_message(134, 6, [], 8.0))
    node.serve_until(lambda: len(node.exits) == 2)
    assert readable(late.sock) and late.receive() == {"t": rank_protocol.RELEASE}


def test_a_rank_that_ended_before_it_was_asked_to_stop_is_not_stopped_by_detlaunch(node: Node) -> None:
    """Its report came after the stop, but its rank had ended before (its wrapper's time says so)."""
    before, _ = node.connect(2)
    after, _ = node.connect(3)
    assert before is not None and after is not None
    asked = time.time()
    node.registry.signal_live(0)  # signal 0: marks the ranks as asked to stop, delivers nothing
    before.send(rank_protocol.exit_message(134, 6, [], asked - 0.5))
    after.send(rank_protocol.exit_message(143, 15, [], time.time()))
    node.serve_until(lambda: len(node.exits) == 2)
    assert {s.rank: s.stopped for s in node.exits} == {2: False, 3: True}


def test_how_the_ranks_script_ended_comes_with_its_report(node: Node) -> None:
    link, _ = node.connect(2)
    assert link is not None
    link.send({**rank_protocol.exit_message(134, 6, [], 7.5), "ended": "finalizing"})
    node.serve_until(lambda: node.exits)
    (status,) = node.exits
    assert status.ended == "finalizing" and RankStatus.from_json(status.to_json()) == status
    assert status.describe() == ("killed by SIGABRT after its script and its atexit handlers had finished (its work "
                                 "was done: Python was finalizing)")


def test_a_crash_in_pythons_teardown_counted_as_finished_comes_as_exit_0_with_its_signal(node: Node) -> None:
    link, _ = node.connect(2)
    assert link is not None
    link.send({**rank_protocol.exit_message(0, None, [], 7.5), "ended": "finalizing", "teardown_signal": 6})
    node.serve_until(lambda: node.exits)
    (status,) = node.exits
    assert not status.failed and status.teardown_signal == 6 and RankStatus.from_json(status.to_json()) == status
    assert status.describe() == ("exit 0 (killed by SIGABRT while Python finalized, after its script and its atexit "
                                 "handlers had finished: counted as finished)")


def test_garbage_closes_the_connection_without_a_report(node: Node) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(node.path)
    sock.sendall(b"not json\n")
    node.serve_until(lambda: readable(sock))
    assert sock.recv(1) == b""
    assert node.exits == [] and node.registry.ranks == {}
    sock.close()


def test_the_wrapper_says_why_it_was_refused(node: Node) -> None:
    errors: list[BaseException] = []

    ended_r, ended_w = socket.socketpair()  # the thread's end, as an event of the loop

    def register() -> None:
        try:
            SupervisorConnection.connect(node.path, "job-1", 9)
        except BaseException as e:
            errors.append(e)
        ended_w.send(b"x")

    node.loop.add_reader(ended_r, Priority.PROBE, lambda: ended_r.recv(1))
    wrapper = threading.Thread(target=register)
    wrapper.start()
    node.serve_until(lambda: errors)
    wrapper.join()
    node.loop.remove(ended_r)
    ended_r.close()
    ended_w.close()
    assert len(errors) == 1 and isinstance(errors[0], UsageError)
    assert str(errors[0]) == "the supervisor refused rank 9: rank 9 does not belong to node 1 (its ranks are 2..3)"


# What the wrapper's common path imported before it was kept lean: json (with re, enum, functools,
# collections) cost every rank about 1.2 MB of its ~12 MB (issue 11's goal).
HEAVY = {"json", "json.decoder", "re", "enum", "functools", "collections", "typing", "dataclasses", "psutil",
         "detlaunch"}


def test_a_wrapper_in_a_job_imports_nothing_heavy(real_processes: None, node: Node) -> None:
    """The real wrapper (python -S, as the supervisor starts it) registers, runs a rank and reports: every
    message, the progress file and the faulthandler file, with none of the modules it used to pull in."""
    env = {**os.environ, "DETLAUNCH_SUPERVISOR": node.path, "PYTHONPROFILEIMPORTTIME": "1"}
    wrapper = subprocess.Popen([sys.executable, "-S", WRAPPER, "--rank", "2", "--job", "job-1", "--", "true"],
                               env=env, stderr=subprocess.PIPE, text=True)
    try:
        node.serve_until(lambda: node.exits)
        _, err = wrapper.communicate(timeout=10)
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
    assert wrapper.returncode == 0 and [(s.rank, s.exit_code) for s in node.exits] == [(2, 0)], err
    assert os.path.exists(os.path.dirname(node.path) + "/progress-2"), "the common path was not taken"
    assert stat.S_ISFIFO(os.stat(os.path.dirname(node.path) + "/flight-2").st_mode)  # flightrec's FIFO
    imported = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if line.startswith("import time:")}
    assert {"protocol", "progress", "faultdump", "flightrec"} <= imported, sorted(imported)
    assert not imported & HEAVY, sorted(imported & HEAVY)
