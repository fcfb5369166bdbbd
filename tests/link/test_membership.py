"""The chief's membership and the succession it allows, in milliseconds: what the chief shares reads back
whole (restart state included), every survivor computes the same successor and cluster, a majority
is more than half, the restart policy's budget is read alike everywhere, and on loopback a worker
keeps the chief's latest membership and, once the chief is gone, joins its successor with the job's
secret."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from detlaunch.link.chief import ChiefLink
from detlaunch.link.membership import Membership, cluster_after, has_majority, with_addresses
from detlaunch.link.messages import Members, decode, encode
from detlaunch.node.succession import chief_loss_end, may_go_on
from detlaunch.outcome import AttemptEnd, RestartClass
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.restarts.policy import RestartPolicy
from test_rejoin_link import Events, run_until, settings, three_nodes, worker_link

pytestmark = pytest.mark.timeout(30)

HISTORY = (AttemptEnd(1, RestartClass.RANK_FAILED, 3, signature="exit 3: ValueError: x", what="rank 1 exited",
                      exception="ValueError", started_at=1.0, ended_at=2.0),
           AttemptEnd(2, RestartClass.NODE_LOST, 1, what="lost node 2", infrastructure=False))
M = Membership(nodes=("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"), live=(0, 1, 2, 3),
               spares=((4, "10.0.0.5"),), used_spares=(5,), attempt=3, running=True, history=HISTORY,
               excluded=("10.9.9.9",))


def test_the_membership_reads_back_whole_with_the_restart_state() -> None:
    assert decode(encode(Members(m=M)), "chief") == Members(m=M)
    assert Membership.from_json(M.to_json()).history[0].restart_class is RestartClass.RANK_FAILED


def test_the_successor_is_the_lowest_live_node_but_the_chief() -> None:
    assert M.successor() == 1
    assert Membership(nodes=M.nodes, live=(0, 2, 3)).successor() == 2  # node 1 was lost before the chief
    assert M.successor(frozenset({0, 1})) == 2
    assert Membership(nodes=("a", "b"), live=(0,)).successor() is None
    after = M.succeeded_by(2)
    assert after.nodes == ("10.0.0.3", "10.0.0.2", "10.0.0.1", "10.0.0.4") and after.live == (0, 1, 3)


def cluster(rank: int, addrs: tuple[str | None, ...] = ("10.0.0.1", None, None, None, None)) -> ClusterInfo:
    """Node `rank` of a job of 4 nodes and a spare, started with torchrun-style flags: only the chief's
    address (and its own) known."""
    known = tuple(a if i in (0, rank) else None for i, a in enumerate(addrs))
    own = list(known)
    own[rank] = f"10.0.0.{rank + 1}"
    return ClusterInfo(node_addrs=tuple(own), slots=(1, 2, 3, 4, 5), node_rank=rank, chief_addr="10.0.0.1",
                       job_id="j")


def test_every_survivor_computes_the_same_cluster_with_the_successor_as_node_0() -> None:
    for rank, now in ((1, 0), (2, 2), (3, 3), (4, 4)):  # node 1 succeeds; the spare (4) keeps its number
        c = cluster_after(cluster(rank), M, 1)
        assert c.node_rank == now
        assert c.node_addrs == ("10.0.0.2", "10.0.0.1", "10.0.0.3", "10.0.0.4", "10.0.0.5" if rank == 4 else None)
        assert c.chief_addr == "10.0.0.2" and c.slots == (2, 1, 3, 4, 5)  # node 1's slots go with it
    # A promoted spare plans with the addresses its chief shared (node/spare.py, cli/main.py).
    assert with_addresses(cluster(4), M.succeeded_by(1)).chief_addr == "10.0.0.2"


@pytest.mark.parametrize(("joined", "nodes", "majority"),
                         [(3, 4, True), (2, 4, False), (3, 5, True), (2, 5, False), (1, 2, False), (2, 3, True)])
def test_a_majority_is_more_than_half_of_the_last_attempts_nodes(joined: int, nodes: int, majority: bool) -> None:
    assert has_majority(joined, nodes) is majority
    assert not (has_majority(joined, nodes) and has_majority(nodes - joined, nodes))  # never two sides


def test_every_survivor_reads_the_restart_budget_alike() -> None:
    policy = RestartPolicy(max_restarts=0, max_node_restarts=2, backoff_initial=0.0)
    end = chief_loss_end(M, "10.0.0.1", "no heartbeat", 5.0, policy)
    assert (end.attempt, end.restart_class, end.what) == (3, RestartClass.NODE_LOST,
                                                          "lost the chief, node 0 (10.0.0.1): no heartbeat")
    assert may_go_on(Membership(nodes=M.nodes, live=M.live, attempt=2, history=HISTORY[:1]), "a", "w", 5.0,
                     policy)[0] is True
    assert may_go_on(M, "a", "w", 5.0, RestartPolicy(max_restarts=0, max_node_restarts=1))[0] is False
    assert may_go_on(M, "a", "w", 5.0, RestartPolicy()) == (False, "restarts are off (--max-restarts)")
    two = Membership(nodes=("a", "b"), live=(0, 1))  # node 1 alone is no majority of two: it never succeeds
    assert may_go_on(two, "a", "w", 5.0, policy) == (False, "its 1 other node(s) are no majority of the job's 2")


def test_a_worker_keeps_the_chiefs_membership_and_joins_its_successor_with_the_jobs_secret(tmp_path: Any) -> None:
    loop, port, chief, _, w1, w2, _ = three_nodes(str(tmp_path))
    shared = Membership(nodes=("127.0.0.1", "127.0.0.2", "127.0.0.3"), live=(0, 1, 2), attempt=1)
    chief.share(Members(m=shared))
    run_until(loop, lambda: w1.membership == shared and w2.membership == shared)
    chief.close()  # the chief is gone; node 1 (its successor) serves the link on its own address
    run_until(loop, lambda: w1.connection is None and w2.connection is None)
    assert w1.secret == "s3cret"  # learned in the handshake: the successor needs no file and no variable
    new_settings = dataclasses.replace(settings(0, port, str(tmp_path)), chief_addr="127.0.0.2", environ={},
                                       node_addr="127.0.0.2", secret=w1.secret,
                                       node_addrs=("127.0.0.2", "127.0.0.1", "127.0.0.3"))
    new_events = Events()
    new = ChiefLink(loop, new_settings, new_events, new_events)
    new.attempt, new.holding = 2, True
    follower = worker_link(loop, dataclasses.replace(settings(2, port, str(tmp_path)), chief_addr="127.0.0.2"),
                           Events())
    run_until(loop, lambda: follower.joined)
    assert (follower.attempt, follower.hold) == (2, True) and new.live_nodes() == {2}
    stranger = worker_link(loop, dataclasses.replace(settings(1, port, str(tmp_path), secret="wrong"),
                                                     chief_addr="127.0.0.2"), stranger_events := Events())
    run_until(loop, lambda: "link_failed_to_start" in stranger_events.names())
    for link in (new, follower, stranger, w1, w2):
        link.close()
    loop.close()
