"""A worker node halfway through joining when the job ends, in one event loop on loopback
(milliseconds): the chief waits for the handshake, a worker's words before the welcome wait for it
(the chief would take them for a failed authentication), and a handshake that fails lets a worker
whose part is over end."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
from detlaunch.eventloop import EventLoop
from detlaunch.joblink import SECRET_FILE, ChiefLink, WorkerLink
from detlaunch.report import RankStatus
from helpers import free_port
from test_rejoin_link import Events, plan, run_until

pytestmark = pytest.mark.timeout(30)


def from_file(p: Any) -> Any:
    """The plan, with the secret in the shared job dir (the default) rather than in the environment."""
    p.environ = {}
    return p


def test_a_worker_done_before_its_welcome_says_goodbye_after_it_and_gets_the_verdict(tmp_path: Any) -> None:
    loop, port = EventLoop(), free_port()
    chief_events, worker_events = Events(), Events()
    chief = ChiefLink(loop, from_file(plan(0, port, str(tmp_path))), chief_events)
    chief.expected = {1}
    worker = WorkerLink(loop, from_file(plan(1, port, str(tmp_path))), worker_events)
    run_until(loop, lambda: bool(chief.pending))  # connected, not welcomed yet
    status = RankStatus(rank=1, node_rank=1, exit_code=0)
    worker.rank_exited(status)  # its part of the job is over before the welcome
    worker.finish(None, [status])
    assert not chief.ready_to_finish() and not worker.closed  # each waits for the handshake
    run_until(loop, lambda: chief.ready_to_finish() and bool(chief.nodes))
    assert chief.remote_ranks == {1: status} and "node_lost" not in chief_events.names()
    chief.finish(None, [])
    run_until(loop, lambda: worker.closed)
    assert "link_failed_to_start" not in worker_events.names() and chief.closed
    for link in (worker, chief):
        link.close()
    loop.close()


def test_a_failed_handshake_lets_a_worker_whose_part_is_over_end(tmp_path: Any) -> None:
    loop, port = EventLoop(), free_port()
    chief = ChiefLink(loop, from_file(plan(0, port, str(tmp_path))), Events())
    os.unlink(tmp_path / SECRET_FILE)  # the chief's secret is gone when the worker looks for it
    worker_events = Events()
    worker = WorkerLink(loop, from_file(plan(1, port, str(tmp_path))), worker_events)
    worker.finish(None, [])
    run_until(loop, lambda: "link_failed_to_start" in worker_events.names())
    assert "cannot read the job secret" in worker_events.seen[-1][1] and worker.closed
    assert worker_events.names().count("link_failed_to_start") == 1
    for link in (worker, chief):
        link.close()
    loop.close()


def test_a_connection_that_comes_once_the_end_is_in_sight_does_not_hold_it(tmp_path: Any) -> None:
    loop, port = EventLoop(), free_port()
    chief = ChiefLink(loop, from_file(plan(0, port, str(tmp_path))), Events())
    assert chief.ready_to_finish()  # node 1 never dialed: nothing to wait for
    silent = socket.create_connection(("127.0.0.1", port))  # says nothing, stays
    try:
        run_until(loop, lambda: bool(chief.pending))
        assert chief.ready_to_finish()
    finally:
        silent.close()
        chief.close()
        loop.close()
