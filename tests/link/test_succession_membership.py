"""The chief's membership and the succession it allows, in milliseconds: what the chief shares reads back
whole (restart state included), every survivor computes the same successor and cluster, a majority
is more than half, the restart policy's budget is read alike everywhere, and on loopback a worker
keeps the chief's latest membership and, once the chief is gone, joins its successor with the job's
secret."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace
from typing import Any

import pytest
from detlaunch.link.chief import ChiefLink
from detlaunch.link.dial import Dialer
from detlaunch.link.membership import Membership, applied, change, cluster_after, has_majority, with_addresses
from detlaunch.link.messages import Members, MembersChange, decode, encode
from detlaunch.node.phase import Phase
from detlaunch.node.succession import Succession, Takeover, carry_exclusions, chief_loss_end, may_go_on
from detlaunch.outcome import AttemptEnd, RestartClass
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.spares import read_excluded, read_exclusions
from detlaunch.restarts.attempts import Attempts
from detlaunch.restarts.policy import RestartPolicy
from detlaunch.system.eventloop import EventLoop
from detlaunch.system.jobdir import SECRET_FILE
from support.helpers import free_port
from test_rejoin_link import Events, run_until, settings, three_nodes, worker_link

pytestmark = pytest.mark.timeout(30)

HISTORY = (AttemptEnd(1, RestartClass.RANK_FAILED, 3, signature="exit 3: ValueError: x", what="rank 1 exited",
                      exception="ValueError", started_at=1.0, ended_at=2.0),
           AttemptEnd(2, RestartClass.NODE_LOST, 1, what="lost node 2", infrastructure=False))
M = Membership(nodes=("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"), live=(0, 1, 2, 3),
               spares=((4, "10.0.0.5"),), used_spares=(5,), attempt=3, running=True, history=HISTORY,
               excluded=("10.9.9.9",), lost=("10.0.0.7",))


def test_the_membership_reads_back_whole_with_the_restart_state() -> None:
    assert decode(encode(Members(m=M)), "chief") == Members(m=M)
    assert Membership.from_json(M.to_json()).history[0].restart_class is RestartClass.RANK_FAILED


@pytest.mark.parametrize("new", [
    M,  # nothing changed
    dataclasses.replace(M, live=(0, 1, 3), attempt=4, running=False, history=(*HISTORY, HISTORY[1])),  # a lost node
    dataclasses.replace(M, nodes=("10.0.0.1", "10.0.0.5", "10.0.0.3", "10.0.0.4"), spares=(), used_spares=(4, 5)),
    dataclasses.replace(M, live=(0, 2, 3), history=HISTORY[:1], excluded=()),  # a successor's history, replaced
    dataclasses.replace(M, live=(0, 1, 3), lost=("10.0.0.7", "10.0.0.3")),  # a loss the exclusion file counts
])
def test_a_membership_told_as_its_change_reads_back_as_it_is(new: Membership) -> None:
    delta = change(M, new)
    assert delta is not None and applied(M, delta) == new
    assert decode(encode(MembersChange(c=delta)), "chief") == MembersChange(c=delta)
    assert change(M, dataclasses.replace(new, nodes=new.nodes[:3], live=(0, 1))) is None  # another size: whole


def test_a_lost_node_among_1024_is_a_change_of_a_few_dozen_bytes() -> None:
    big = Membership(nodes=tuple(f"10.1.{i // 250}.{i % 250}" for i in range(1025)), live=tuple(range(1025)),
                     spares=tuple((1025 + i, f"10.2.0.{i}") for i in range(32)), attempt=1)
    lost = dataclasses.replace(big, live=tuple(n for n in range(1025) if n != 700), running=False)
    delta = change(big, lost)
    assert delta is not None and applied(big, delta) == lost
    assert len(encode(MembersChange(c=delta))) < 1200 < 15_000 < len(encode(Members(m=lost)))


def test_a_change_applies_as_the_sets_it_names_whatever_it_holds() -> None:
    """applied() keeps `live` sorted by inserting and deleting: it reads as (live | joined in range) - left for any
    change, a node named twice, joined and left at once, out of range, or not live at all."""
    rng = random.Random(7)
    for _ in range(300):
        live = tuple(sorted(rng.sample(range(8), rng.randint(0, 8))))
        joined = tuple(rng.choice(range(-2, 11)) for _ in range(rng.randint(0, 4)))
        left = tuple(rng.choice(range(-1, 10)) for _ in range(rng.randint(0, 4)))
        m = Membership(nodes=tuple(f"10.0.0.{i}" for i in range(8)), live=live)
        same = change(m, m)
        assert same is not None
        c = dataclasses.replace(same, joined=joined, left=left)
        want = tuple(sorted(({*live} | {n for n in joined if 0 <= n < 8}) - {*left}))
        assert applied(m, c).live == want, (live, joined, left)


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


def test_a_successor_nobody_reaches_is_passed_over_alike_by_every_survivor() -> None:
    for rank in (2, 3):  # node 1 is cut off with the chief: node 2 is the next, then node 3
        c = cluster(rank)
        t = Takeover(cluster_after(c, M, 1), M, 1, "10.0.0.1", "no heartbeat", "s", 5.0, before=c)
        nxt = t.unreachable()
        assert nxt is not None and (nxt.successor, nxt.gone) == (2, frozenset({0, 1}))
        assert nxt.cluster.node_rank == (0 if rank == 2 else 3) and nxt.cluster.chief_addr == "10.0.0.3"
        last = nxt.unreachable()
        assert last is not None and last.successor == 3 and last.unreachable() is None


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
    chief.share(shared)
    run_until(loop, lambda: w1.membership == shared and w2.membership == shared)
    told: list[Any] = []
    assert w2.connection is not None
    w2.connection.on_message = lambda conn, m: (told.append(m), w2.on_message(conn, m))  # type: ignore[func-returns-value]
    shared = dataclasses.replace(shared, attempt=2, running=False, history=HISTORY[:1])
    chief.share(shared)  # what changed only: each node has the last
    run_until(loop, lambda: w1.membership == shared and w2.membership == shared)
    assert [type(m) for m in told] == [MembersChange]
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


def test_a_spare_that_joins_after_a_share_has_the_last_membership_at_once(tmp_path: Any) -> None:
    """The next share may be a heartbeat away and the chief lost before it: a spare that joined in between must
    know the successor all the same. Later shares reach it as what changed, like every other node."""
    loop, port, tmp = EventLoop(), free_port(), str(tmp_path)
    chief = ChiefLink(loop, dataclasses.replace(settings(0, port, tmp), spares=1), Events(), Events())
    w1, w2 = (worker_link(loop, settings(n, port, tmp), Events()) for n in (1, 2))
    run_until(loop, lambda: w1.joined and w2.joined)
    shared = Membership(nodes=("127.0.0.1", "127.0.0.2", "127.0.0.3"), live=(0, 1, 2), attempt=1)
    chief.share(shared)
    run_until(loop, lambda: w1.membership == shared and w2.membership == shared)
    spare = worker_link(loop, dataclasses.replace(settings(3, port, tmp), node_addr="127.0.0.4"), Events())
    run_until(loop, lambda: spare.membership == shared)  # no share since it joined
    assert spare.membership is not None and spare.membership.successor() == 1
    told: list[Any] = []
    assert spare.connection is not None
    spare.connection.on_message = lambda conn, m: (told.append(m), spare.on_message(conn, m))  # type: ignore[func-returns-value]
    shared = dataclasses.replace(shared, spares=((3, "127.0.0.4"),))
    chief.share(shared)
    run_until(loop, lambda: spare.membership == shared and w1.membership == shared)
    assert [type(m) for m in told] == [MembersChange]
    for link in (chief, w1, w2, spare):
        link.close()
    loop.close()


class Recorder(Events):
    """Events that take keyword arguments too (an emitter's details)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **details: self.seen.append((name, *args))


class Host:
    """What node/succession.py needs of a supervisor: a real link and loop, the rest recorded."""

    def __init__(self, link: ChiefLink, nodes: int, start_timeout: float = 30.0) -> None:
        self.loop, self.link, self.node, self.phase = link.loop, link, 0, Phase.BACKOFF
        policy = RestartPolicy(max_restarts=1, backoff_initial=0.0)
        self.plan = SimpleNamespace(cluster=SimpleNamespace(num_nodes=nodes, chief_addr="127.0.0.2"), heartbeat=1.0,
                                    start_timeout=start_timeout, restarts=policy, exclude_hosts=None)
        self.attempts, self.events, self.driver = Attempts(policy), Recorder(), Recorder()
        self.said: list[str] = []
        self.failed: list[Any] = []

    def say(self, message: str) -> None:
        self.said.append(message)

    def trace(self, message: str) -> None:
        pass

    def fail(self, event: Any) -> None:
        self.failed.append(event)


def successor_of(tmp: str, nodes: int, start_timeout: float, heartbeat: float = 1.0) \
        -> tuple[ChiefLink, Host, Succession, int]:
    """Node 1 of a job of `nodes` (127.0.0.1-N) took over from the chief: its link and succession begun."""
    port = free_port("127.0.0.2")
    addrs = tuple(f"127.0.0.{n + 1}" for n in range(nodes))
    s = dataclasses.replace(settings(0, port, tmp), num_nodes=nodes, chief_addr="127.0.0.2", node_addr="127.0.0.2",
                            node_addrs=("127.0.0.2", "127.0.0.1", *addrs[2:]))
    link = ChiefLink(EventLoop(), s, events := Events(), events)
    host = Host(link, nodes, start_timeout)
    host.plan.heartbeat = heartbeat
    m = Membership(nodes=addrs, live=tuple(range(nodes)), attempt=1, running=True)
    carried = Takeover(cluster_after(cluster(1), m, 1), m, 1, "127.0.0.1", "no heartbeat", "s3cret", 5.0)
    succession = Succession(host, carried)  # type: ignore[arg-type]
    assert succession.begin()
    return link, host, succession, port


def join(link: ChiefLink, port: int, tmp: str, node: int) -> Any:
    w = worker_link(link.loop, dataclasses.replace(settings(node, port, tmp), chief_addr="127.0.0.2"), Events())
    run_until(link.loop, lambda: w.joined)
    return w


def test_the_successor_goes_on_only_with_a_majority_of_the_last_attempts_nodes(tmp_path: Any) -> None:
    link, host, succession, port = successor_of(str(tmp_path), 4, 30.0)
    assert ("begin_backoff", 2, None) in host.driver.seen and link.attempt == 2 and link.holding
    assert ("await_back", {2, 3}, 5.0) in host.driver.seen  # nodes 2 and 3 come back: no spare there for 5 heartbeats
    assert host.attempts.history[-1].restart_class is RestartClass.NODE_LOST  # counted as a lost node
    workers = [join(link, port, str(tmp_path), 2)]
    succession.changed()
    assert succession.waiting  # 2 of 4: not yet
    workers.append(join(link, port, str(tmp_path), 3))
    succession.changed()
    run_until(link.loop, lambda: ("next_attempt", 2) in host.driver.seen)  # 3 of 4, and the backoff is over
    assert "3 of the last attempt's 4 nodes are here (a majority): the job goes on" in host.said
    assert not host.failed
    for w in workers:
        w.close()
    succession.close()
    link.close()


def test_a_successor_sends_spares_only_where_no_node_comes_back_until_a_silent_nodes_window_is_over(
        tmp_path: Any) -> None:
    """Its old place (the lost chief's) gets a spare at once; the places of the nodes on their way back get one
    only once the window is over (a node stopped on its way: its place is a lost node's then)."""
    from detlaunch.node.attempt_driver import AttemptDriver

    port = free_port()
    link = ChiefLink(EventLoop(), dataclasses.replace(settings(0, port, str(tmp_path)), num_nodes=4, spares=2),
                     events := Events(), events)
    host = Host(link, 4)
    host.plan.release_timeout, host.plan.settings = 0.0, {}  # type: ignore[attr-defined]
    host.env, host.processes = {}, SimpleNamespace(remaining=lambda: [])  # type: ignore[attr-defined]
    driver = AttemptDriver(host)  # type: ignore[arg-type]
    spares = [worker_link(link.loop, dataclasses.replace(settings(n, port, str(tmp_path)), node_addr=f"127.0.0.{n}"),
                          Events()) for n in (4, 5)]
    run_until(link.loop, lambda: len(link.spares.waiting) == 2)
    host.attempts.due = 2
    driver.await_back({2, 3}, 0.2)
    driver.fill_from_spares()
    assert link.spares.coming == {1: 4}  # node 1's place (the successor's old one, the lost chief's now) only
    run_until(link.loop, lambda: len(link.spares.coming) == 2)  # past the window: node 2 never came back
    assert link.spares.coming == {1: 4, 2: 5} and not driver.awaited
    for w in spares:
        w.close()
    link.close()


@pytest.mark.parametrize("late", [False, True])
def test_after_a_majority_the_last_attempts_others_have_a_grace_then_are_lost(tmp_path: Any, late: bool) -> None:
    link, host, succession, port = successor_of(str(tmp_path), 5, 30.0, heartbeat=0.05)  # grace: 0.5 s
    workers = [join(link, port, str(tmp_path), n) for n in (2, 3)]
    succession.changed()
    assert "3 of the last attempt's 5 nodes are here (a majority): the job goes on" in host.said
    assert ("next_attempt", 2) not in host.driver.seen  # node 4 was live in the last attempt: it may be coming
    if late:  # within the grace: the attempt goes on with it, nothing lost
        workers.append(join(link, port, str(tmp_path), 4))
        succession.changed()
    run_until(link.loop, lambda: ("next_attempt", 2) in host.driver.seen)
    lost = [said for said in host.said if said.startswith("lost node")]
    assert lost == ([] if late else ["lost node 4 (127.0.0.5): it did not join the new chief within 0.5 s"])
    assert [e[:3] for e in host.driver.seen if e[0] == "exclude"] == [("exclude", 1, "127.0.0.1")] + \
        ([] if late else [("exclude", 4, "127.0.0.5")])  # the lost chief; node 4's host, lost (a spare's place)
    for w in workers:
        w.close()
    succession.close()
    link.close()


def test_without_a_majority_the_successor_ends_naming_what_it_could_not_reach(tmp_path: Any) -> None:
    link, host, succession, port = successor_of(str(tmp_path), 5, 0.5)
    w = join(link, port, str(tmp_path), 2)
    succession.changed()
    run_until(link.loop, lambda: bool(host.failed))
    assert host.failed[0].what == ("lost the chief and reached only 2 of the last attempt's 5 nodes within 0.5 s, no "
                                   "majority: could not reach node(s) 3 (127.0.0.4), 4 (127.0.0.5)")
    assert ("next_attempt", 2) not in host.driver.seen  # no spare promoted, no attempt on this side
    w.close()
    succession.close()
    link.close()


def test_a_chief_that_lost_more_than_half_of_its_nodes_steps_down(tmp_path: Any) -> None:
    loop, port = EventLoop(), free_port()
    s = dataclasses.replace(settings(0, port, str(tmp_path)), num_nodes=4,
                            node_addrs=("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"))
    chief = ChiefLink(loop, s, chief_events := Events(), chief_events)
    host = Host(chief, 4)
    succession = Succession(host)  # type: ignore[arg-type]
    workers = [worker_link(loop, settings(n, port, str(tmp_path)), Events()) for n in (1, 2, 3)]
    run_until(loop, lambda: all(w.joined for w in workers))
    for n, w in enumerate(workers, start=1):
        w.close()
        run_until(loop, lambda n=n: ("node_lost", n) in [e[:2] for e in chief_events.seen])  # type: ignore[misc]
        assert succession.outvoted(n, f"127.0.0.{n + 1}", "gone") is (n == 3)  # 3 of 4 lost: they may go on
    assert host.said == ["lost node(s) 1 (127.0.0.2), 2 (127.0.0.3), 3 (127.0.0.4), more than half of the job's 4 "
                         "nodes: they may follow a successor (the lowest of them), so this chief leaves the job"]
    assert succession.stepped_down and succession.handing_over  # no restart; the job's log is the successor's
    chief.close()
    loop.close()


def test_the_hosts_the_lost_chief_kept_out_stay_out_on_the_successor(tmp_path: Any) -> None:
    own = tmp_path / "excluded"
    own.write_text("10.9.9.9\n")
    carry_exclusions(str(own), ("10.9.9.9", "10.0.0.7"), print)
    assert read_excluded(str(own)) == {"10.9.9.9", "10.0.0.7"}
    assert own.read_text().splitlines()[1].startswith("10.0.0.7  # excluded ")  # once, not twice
    carry_exclusions(str(own), ("10.0.0.7",), print)
    assert len(own.read_text().splitlines()) == 2


def test_each_loss_the_lost_chief_counted_counts_on_the_successor(tmp_path: Any) -> None:
    own = tmp_path / "excluded"
    own.write_text("10.0.0.5  # lost 2026-12-01T00:00:00Z: gone\n")  # one already counted here
    lost = ("10.0.0.1", "10.0.0.5", "10.0.0.5")  # the chief's file: 10.0.0.1 lost once, 10.0.0.5 twice (out)
    for _ in range(2):  # carried twice (a second succession): no line twice
        carry_exclusions(str(own), ("10.0.0.5",), print, lost)
        excluded, losses = read_exclusions(str(own))
        assert excluded == {"10.0.0.5"} and losses == {"10.0.0.1": 1, "10.0.0.5": 1}, own.read_text()


def test_the_job_secret_outlives_a_chief_that_steps_down(tmp_path: Any) -> None:
    """On machines that share the job dir: the chief that stepped down leaves the secret file; the successor
    writes the secret it holds there (a spare sent to a place joins afresh and reads it); a follower
    authenticates with the one it learned, with no file at all."""
    loop, tmp, secret_file = EventLoop(), str(tmp_path), tmp_path / SECRET_FILE
    first = dataclasses.replace(settings(0, free_port(), tmp), environ={})
    chief = ChiefLink(loop, first, events := Events(), events)
    w = worker_link(loop, dataclasses.replace(settings(1, first.port, tmp), environ={}), Events())
    run_until(loop, lambda: w.joined)
    chief.keep_secret = True  # as Succession.outvoted sets it
    chief.close()
    w.close()
    assert secret_file.read_text() == w.secret
    secret_file.unlink()
    port = free_port("127.0.0.2")
    new = ChiefLink(loop, dataclasses.replace(first, port=port, chief_addr="127.0.0.2", node_addr="127.0.0.2",
                                              secret=w.secret or ""), new_events := Events(), new_events)
    assert secret_file.read_text() == w.secret
    secret_file.unlink()
    follower = worker_link(loop, dataclasses.replace(settings(2, port, tmp), environ={}, chief_addr="127.0.0.2",
                                                     secret=w.secret or ""), Events())
    run_until(loop, lambda: follower.joined)
    follower.close()
    new.close()
    assert not secret_file.exists()  # the serving chief's, removed at its end as ever
    loop.close()


def test_a_host_that_refuses_a_connection_was_reached() -> None:
    loop = EventLoop()
    refused = Dialer(loop, "127.0.0.1", free_port(), lambda sock: sock.close(), print)
    run_until(loop, lambda: refused.reached)
    refused.stop()
    loop.close()


def test_a_follower_passes_over_a_successor_whose_host_never_answers(tmp_path: Any) -> None:
    loop = EventLoop()
    link = worker_link(loop, dataclasses.replace(settings(2, free_port("127.0.0.2"), str(tmp_path)),
                                                 chief_addr="127.0.0.2"), Events())
    link.dialer.reached = False  # as a host cut off with the chief: no connection, not even a refusal
    m = Membership(nodes=tuple(f"10.0.0.{n + 1}" for n in range(5)), live=(0, 1, 2, 3, 4))
    c = cluster(3)  # node 3 of the lost chief's 5, following node 1
    t = Takeover(cluster_after(c, m, 1), m, 1, "10.0.0.1", "no heartbeat", "s", 5.0, before=c)
    said, failed = [], []
    for gone in ({0, 1}, {0, 1, 2}):
        host = Host(link, 5)  # type: ignore[arg-type]
        host.phase = Phase.STARTING
        succession = Succession(host, t)  # type: ignore[arg-type]
        succession._successor_unreachable()
        said += host.said
        failed += [e.what if hasattr(e, "what") else type(e).__name__ for e in host.failed]
        if succession.next is not None:
            assert succession.next.gone == frozenset(gone) and succession.next.cluster.chief_addr == "10.0.0.3"
            t = succession.next
    assert said == ["could not reach node 1 (10.0.0.2), the successor, within 10 s: node 2 (10.0.0.3) takes over "
                    "as the chief (node rank 0)"]
    assert failed == ["ChiefLost", "lost the chief, node 0 (10.0.0.1), and could not reach node 2 (10.0.0.3), the "
                      "successor, within 10 s: the 2 node(s) left are no majority of the job's 5"]
    link.close()
    loop.close()
