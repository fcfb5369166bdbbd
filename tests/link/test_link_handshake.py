"""A worker node halfway through joining when the job ends, in one event loop on loopback
(milliseconds): the chief waits for the handshake, a worker's words before the welcome wait for it
(the chief would take them for a failed authentication), and a handshake that fails lets a worker
whose part is over end."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from detlaunch.link.chief import ChiefLink
from detlaunch.link.settings import LinkSettings
from detlaunch.link.worker import WorkerLink
from detlaunch.outcome import RankStatus
from detlaunch.system.eventloop import EventLoop
from detlaunch.system.jobdir import SECRET_FILE
from support.helpers import free_port
from test_rejoin_link import Events, chief_link, run_until, settings, worker_link

pytestmark = pytest.mark.timeout(30)


class Links:
    """Links on one event loop and one port, their secret in the shared job dir (the default, rather than
    in the environment); every one of them closed at the end."""

    def __init__(self, tmp: str) -> None:
        self.loop, self.port, self.tmp = EventLoop(), free_port(), tmp
        self.made: list[ChiefLink | WorkerLink] = []

    def settings(self, node: int) -> LinkSettings:
        return dataclasses.replace(settings(node, self.port, self.tmp), environ={})

    def chief(self, events: Events) -> ChiefLink:
        link = chief_link(self.loop, self.settings(0), events)
        self.made.append(link)
        return link

    def worker(self, events: Events) -> WorkerLink:
        link = worker_link(self.loop, self.settings(1), events)
        self.made.append(link)
        return link

    def close(self) -> None:
        for link in reversed(self.made):
            link.close()
        self.loop.close()


@pytest.fixture
def links(tmp_path: Any) -> Iterator[Links]:
    made = Links(str(tmp_path))
    yield made
    made.close()


def test_a_worker_done_before_its_welcome_says_goodbye_after_it_and_gets_the_verdict(links: Links) -> None:
    chief_events, worker_events = Events(), Events()
    chief = links.chief(chief_events)
    chief.expected = {1}  # the settings' job has 3 nodes: this one, 2
    worker = links.worker(worker_events)
    run_until(links.loop, lambda: bool(chief.pending))  # connected, not welcomed yet
    status = RankStatus(rank=1, node_rank=1, exit_code=0)
    worker.rank_exited(status)  # its part of the job is over before the welcome
    worker.finish(None, [status])
    assert not chief.ready_to_finish() and not worker.closed  # each waits for the handshake
    run_until(links.loop, lambda: chief.ready_to_finish() and bool(chief.nodes))
    assert chief.remote_ranks == {1: status} and "node_lost" not in chief_events.names()
    chief.finish(None, [])
    run_until(links.loop, lambda: worker.closed)
    assert "link_failed_to_start" not in worker_events.names() and chief.closed


def test_a_failed_handshake_lets_a_worker_whose_part_is_over_end(links: Links, tmp_path: Any) -> None:
    links.chief(Events())
    os.unlink(tmp_path / SECRET_FILE)  # the chief's secret is gone when the worker looks for it
    worker_events = Events()
    worker = links.worker(worker_events)
    worker.finish(None, [])
    run_until(links.loop, lambda: "link_failed_to_start" in worker_events.names())
    assert "cannot read the job secret" in worker_events.seen[-1][1] and worker.closed
    assert worker_events.names().count("link_failed_to_start") == 1


def test_a_connection_that_comes_once_the_end_is_in_sight_does_not_hold_it(links: Links) -> None:
    chief = links.chief(Events())
    assert chief.ready_to_finish()  # no other node dialed: nothing to wait for
    with socket.create_connection(("127.0.0.1", links.port)):  # says nothing, stays
        run_until(links.loop, lambda: bool(chief.pending))
        assert chief.ready_to_finish()


def test_silent_connections_from_before_every_node_joined_do_not_hold_the_end(links: Links) -> None:
    """A flood of unauthenticated connections, accepted while a node was still missing, cannot delay the
    verdict once every node has joined: none of them can be a node of the job any more."""
    chief_events = Events()
    chief = links.chief(chief_events)
    chief.expected = {1}
    with socket.create_connection(("127.0.0.1", links.port)):  # a flooder: says nothing, stays
        run_until(links.loop, lambda: bool(chief.pending))
        worker = links.worker(Events())
        run_until(links.loop, lambda: bool(chief.nodes) and worker.joined)
        status = RankStatus(rank=1, node_rank=1, exit_code=0)
        worker.finish(None, [status])
        run_until(links.loop, lambda: 1 in chief.finished)
        assert chief.pending  # the flooder is still there, unauthenticated
        assert chief.ready_to_finish()
