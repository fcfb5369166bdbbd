"""The job link's side of a job whose nodes change, in one event loop on loopback (no process started):
a job that shrinks tells every node the places of the next attempt; a lost node's new detlaunch from a
new address takes its place, and its address is planned with from then on; one whose place is taken or
dropped is made a spare; a spare sent to a place that never joins there frees the place; a spare sent as
a node is lost joins while the attempt stops, and the restart needs no go."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from detlaunch.link import places
from detlaunch.link.chief import ChiefLink
from detlaunch.link.worker import LinkState, WorkerLink
from detlaunch.node.replan import replanned
from detlaunch.outcome import Failure, FailureKind
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.system.eventloop import EventLoop
from support.helpers import free_port
from test_rejoin_link import Events, run_until, settings, three_nodes, worker_link

pytestmark = pytest.mark.timeout(30)
BASE = ClusterInfo(node_addrs=("127.0.0.1", "127.0.0.2", "127.0.0.3"), slots=(2, 2, 2), node_rank=0,
                   chief_addr="127.0.0.1", job_id="job-1")


class Plan:
    """What `replanned` reads of a plan: its cluster."""

    def __init__(self, cluster: ClusterInfo) -> None:
        self.cluster = cluster


def lose(loop: EventLoop, chief: ChiefLink, chief_events: Events, worker: WorkerLink, others: list[WorkerLink],
         attempt: int) -> None:
    """`worker`'s detlaunch dies mid-attempt; every other node says goodbye and the chief restarts."""
    assert worker.connection is not None
    worker.connection.sock.close()
    lost = chief_events.names().count("node_lost") + 1
    run_until(loop, lambda: chief_events.names().count("node_lost") == lost)
    worker.close()
    for w in others:
        w.finish(None, [])
    run_until(loop, chief.ready_to_finish)
    chief.restart(attempt, 0.0)


def test_a_shrunk_job_names_the_places_of_the_next_attempt_and_each_node_plans_its_new_rank(tmp_path: Any) -> None:
    loop, port, chief, chief_events, w1, w2, e2 = three_nodes(str(tmp_path))
    lose(loop, chief, chief_events, w1, [w2], attempt=2)
    assert chief.missing_nodes() == [1] and chief.holding
    places.drop(chief, {1})  # no spare for node 1: the job goes on with nodes 0 and 2
    assert (places.members(chief), chief.missing_nodes(), places.dropped(chief)) == ((0, 2), [], {1})
    chief.go()
    run_until(loop, lambda: "chief_go" in e2.names())
    assert w2.members == (0, 2)
    seen: list[ClusterInfo] = []

    def replan(cluster: ClusterInfo) -> Any:
        seen.append(cluster)
        return Plan(cluster)

    node2 = dataclasses.replace(BASE, node_rank=2)
    moved = replanned(Plan(node2), node2, w2, replan, lambda _: None)  # type: ignore[arg-type]
    assert moved is not None and (seen[-1].node_rank, seen[-1].num_nodes, seen[-1].first_rank) == (1, 2, 2)
    moved = replanned(Plan(BASE), BASE, chief, replan, lambda _: None)  # type: ignore[arg-type]
    assert moved is not None and seen[-1].node_addrs == ("127.0.0.1", "127.0.0.3") and seen[-1].total_slots == 4
    assert replanned(moved, BASE, chief, replan, lambda _: None) is None  # type: ignore[arg-type]  # the same

    # Node 1's new detlaunch: its place is dropped, so it is made a spare, and joins as one.
    e1b = Events()
    w1b = worker_link(loop, settings(1, port, str(tmp_path)), e1b)
    run_until(loop, lambda: "made_spare" in e1b.names())
    assert e1b.seen[-1] == ("made_spare", 3) and w1b.state is LinkState.ENDED  # its part is over
    spare_link = worker_link(loop, dataclasses.replace(settings(1, port, str(tmp_path)), node=3), Events())
    run_until(loop, lambda: "spare_joined" in chief_events.names())
    assert chief_events.seen[-1][:3] == ("spare_joined", 3, "127.0.0.2") and 3 in chief.spares.waiting

    # The job grows back at a restart: place 1 is waited for again, and the spare is sent there.
    places.take_back(chief, [1])
    assert places.members(chief) == (0, 1, 2) and chief.missing_nodes() == [1]
    assert chief.promote_spare(1, set()) == (3, "127.0.0.2") and chief.spares.coming == {1: 3}
    # Another detlaunch claiming node 1 meanwhile, not saying it is spare 3, is made a spare; spare 3 joins as node 1.
    e1c = Events()
    w1c = worker_link(loop, dataclasses.replace(settings(1, port, str(tmp_path)), node_addr="127.0.0.7"), e1c)
    run_until(loop, lambda: "made_spare" in e1c.names())
    assert e1c.seen[-1] == ("made_spare", 4)
    spare_as_1 = worker_link(loop, dataclasses.replace(settings(1, port, str(tmp_path)), promoted_from=3), Events())
    run_until(loop, lambda: spare_as_1.joined and not chief.missing_nodes())
    assert chief.spares.coming == {} and chief.addr_of(1) == "127.0.0.2"
    chief.holding = True  # (as the restart that took the place back left it) the grown job's go names every place:
    chief.go()  # node 2's last go named fewer
    run_until(loop, lambda: e2.names().count("chief_go") == 2)
    assert w2.members == (0, 1, 2) and not chief.holding
    for link in (w1b, w1c, spare_as_1, spare_link, w2, chief):
        link.close()
    loop.close()


def test_a_lost_node_started_again_at_a_new_address_takes_its_place_there(tmp_path: Any) -> None:
    loop, port, chief, chief_events, w1, w2, e2 = three_nodes(str(tmp_path))
    lose(loop, chief, chief_events, w1, [w2], attempt=2)
    w1b = worker_link(loop, dataclasses.replace(settings(1, port, str(tmp_path)), node_addr="127.0.0.5"), Events())
    run_until(loop, lambda: w1b.joined and chief.missing_nodes() == [])
    assert chief.addr_of(1) == "127.0.0.5" and places.members(chief) == (0, 1, 2)
    seen: list[ClusterInfo] = []
    replanned(Plan(BASE), BASE, chief, lambda c: seen.append(c) or Plan(c), lambda _: None)  # type: ignore[arg-type,func-returns-value]
    assert seen and seen[-1].node_addrs == ("127.0.0.1", "127.0.0.5", "127.0.0.3") and seen[-1].node_rank == 0
    for link in (w1b, w2, chief):
        link.close()
    loop.close()


def test_a_spare_sent_to_a_place_that_never_joins_there_frees_the_place(tmp_path: Any) -> None:
    loop, port = EventLoop(), free_port()
    fast = dict(heartbeat=0.02, spares=1)
    chief_events = Events()
    chief = ChiefLink(loop, dataclasses.replace(settings(0, port, str(tmp_path)), **fast), chief_events, chief_events)
    w1 = worker_link(loop, dataclasses.replace(settings(1, port, str(tmp_path)), **fast), Events())
    w2 = worker_link(loop, dataclasses.replace(settings(2, port, str(tmp_path)), **fast), Events())
    spare = worker_link(loop, dataclasses.replace(settings(2, port, str(tmp_path)), node=3, **fast), Events())
    run_until(loop, lambda: w1.joined and w2.joined and 3 in chief.spares.waiting)
    assert chief.promote_spare(2, set()) == (3, "127.0.0.3") and chief.spares.coming == {2: 3}
    spare.close()  # it dies on its way: it never joins as node 2
    run_until(loop, lambda: not chief.spares.coming, timeout=10)
    assert chief_events.seen[-1][0] == "spare_lost" and "did not join there within" in chief_events.seen[-1][3]
    for link in (w1, w2, chief):
        link.close()
    loop.close()



def test_a_node_sent_away_before_any_rank_started_frees_its_place_at_once_for_the_spare(tmp_path: Any) -> None:
    """The preflight's replacement (node/link_events.py, replace_before_start): node 2 is sent away with no
    loss and no restart, its place is waited for at once, the spare sent there joins as node 2, and the chief's
    plan follows it (the layers that list every node list the spare: the contract's
    test_the_plan_follows_a_node_that_moved checks each layer's plan for such a cluster)."""
    loop, port = EventLoop(), free_port()
    chief_events = Events()
    chief = ChiefLink(loop, dataclasses.replace(settings(0, port, str(tmp_path)), spares=1), chief_events,
                      chief_events)
    e2 = Events()
    w1, w2 = (worker_link(loop, settings(n, port, str(tmp_path)), e) for n, e in ((1, Events()), (2, e2)))
    spare_settings = dataclasses.replace(settings(2, port, str(tmp_path)), node=3, node_addr="127.0.0.4")
    spare = worker_link(loop, spare_settings, Events())
    run_until(loop, lambda: "joined" in chief_events.names() and 3 in chief.spares.waiting)
    seen: list[ClusterInfo] = []

    def replan(cluster: ClusterInfo) -> Any:
        seen.append(cluster)
        return Plan(cluster)

    assert replanned(Plan(BASE), BASE, chief, replan, lambda _: None) is None  # type: ignore[arg-type]

    assert places.dismiss(chief, 2, "slow or broken in the preflight", lost=False)
    run_until(loop, lambda: w2.state is LinkState.ENDED)
    assert "was replaced: slow or broken in the preflight" in str(e2.seen)  # its end, with the reason
    assert chief.missing_nodes() == [2] and "node_lost" not in chief_events.names()  # no loss: nothing failed
    assert chief.promote_spare(2, {"127.0.0.3"}) == (3, "127.0.0.4")
    run_until(loop, lambda: spare.state is LinkState.ENDED)
    spare_as_2 = worker_link(loop, dataclasses.replace(spare_settings, node=2, promoted_from=3), Events())
    run_until(loop, lambda: spare_as_2.joined and not chief.missing_nodes())
    assert (spare_as_2.attempt, spare_as_2.hold) == (1, False)  # it starts the first attempt with the others
    assert chief_events.names().count("joined") == 2 and chief.spares.promoted == {3: 2}
    moved = replanned(Plan(BASE), BASE, chief, replan, lambda _: None)  # type: ignore[arg-type]
    assert moved is not None and seen[-1].node_addrs == ("127.0.0.1", "127.0.0.2", "127.0.0.4")
    for link in (w1, w2, spare, spare_as_2, chief):
        link.close()
    loop.close()


def spare_sent_as_node_1_is_lost(tmp: str) -> tuple[EventLoop, int, ChiefLink, Events, WorkerLink, Events, WorkerLink,
                                                   Events]:
    """Nodes 1 and 2 and spare 3 joined; node 1's detlaunch dies mid-attempt, and the chief (as its supervisor
    does, attempt_driver.replace_now) stops the attempt and sends the spare to node 1's place in one write.
    Returns once the spare, as node 1, has joined."""
    loop, port = EventLoop(), free_port()
    chief_events, e2 = Events(), Events()
    chief = ChiefLink(loop, dataclasses.replace(settings(0, port, tmp), spares=1), chief_events, chief_events)
    w1, w2 = worker_link(loop, settings(1, port, tmp), Events()), worker_link(loop, settings(2, port, tmp), e2)
    spare = worker_link(loop, dataclasses.replace(settings(2, port, tmp), node=3, node_addr="127.0.0.4"), Events())
    run_until(loop, lambda: "joined" in chief_events.names() and 3 in chief.spares.waiting)
    assert w1.connection is not None
    w1.connection.sock.close()
    run_until(loop, lambda: "node_lost" in chief_events.names())
    w1.close()
    with chief.together():
        chief.failed(Failure("lost node 1 (127.0.0.2)", 1, at=0.0, kind=FailureKind.NODE_LOST))
        assert chief.promote_spare(1, set()) == (3, "127.0.0.4")
    run_until(loop, lambda: spare.state is LinkState.ENDED)
    spare_events = Events()
    spare_as_1 = worker_link(loop, dataclasses.replace(settings(1, port, tmp), node_addr="127.0.0.4",
                                                       promoted_from=3), spare_events)
    run_until(loop, lambda: spare_as_1.joined)
    return loop, port, chief, chief_events, w2, e2, spare_as_1, spare_events


def test_a_spare_sent_as_a_node_is_lost_joins_as_the_attempt_stops_and_the_restart_needs_no_go(tmp_path: Any) -> None:
    loop, _, chief, chief_events, w2, e2, spare_as_1, spare_events = spare_sent_as_node_1_is_lost(str(tmp_path))
    # Welcomed for the next attempt and held; not told to stop the attempt it never ran.
    assert (spare_as_1.attempt, spare_as_1.hold) == (2, True) and "chief_verdict" not in spare_events.names()
    assert chief.addr_of(1) == "127.0.0.4" and chief.spares.coming == {} and chief.joining_next == {1: 3}
    run_until(loop, lambda: "chief_verdict" in e2.names())
    assert not chief.ready_to_finish()  # node 2 has not said goodbye
    w2.finish(None, [])
    run_until(loop, chief.ready_to_finish)  # the spare owes this attempt nothing
    chief.restart(2, 0.0)
    assert not chief.holding and chief.missing_nodes() == [] and chief.joining_next == {}
    run_until(loop, lambda: "chief_restart" in e2.names() and "chief_restart" in spare_events.names())
    assert e2.seen[-1] == spare_events.seen[-1] == ("chief_restart", 2, 0.0)  # no go follows: it starts now
    assert chief_events.names().count("joined") == 1  # (the first start's): nothing waits for the place
    for link in (w2, spare_as_1, chief):
        link.close()
    loop.close()


def test_a_spare_joined_for_the_next_attempt_and_lost_before_it_leaves_its_place_to_be_waited_for(
        tmp_path: Any) -> None:
    loop, _, chief, chief_events, w2, _, spare_as_1, _ = spare_sent_as_node_1_is_lost(str(tmp_path))
    assert spare_as_1.connection is not None
    spare_as_1.connection.sock.close()
    run_until(loop, lambda: "spare_lost" in chief_events.names())
    assert chief_events.seen[-1][:3] == ("spare_lost", 3, "127.0.0.4") and "node 1's place" in chief_events.seen[-1][3]
    assert chief.missing_nodes() == [1] and chief.joining_next == {}
    w2.finish(None, [])
    run_until(loop, chief.ready_to_finish)
    chief.restart(2, 0.0)
    assert chief.holding and chief.missing_nodes() == [1]  # the next attempt waits for node 1's place again
    for link in (w2, spare_as_1, chief):
        link.close()
    loop.close()
