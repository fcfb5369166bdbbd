"""The job link's side of a lost node coming back, in one event loop on loopback (milliseconds):
a node still connected is never displaced, a lost one is forgotten and joins again through the same
authenticated admission, and the welcome tells it the attempt and to wait for the chief's go."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from detlaunch.link.chief import ChiefLink
from detlaunch.link.settings import LinkSettings
from detlaunch.link.worker import WorkerLink
from detlaunch.system.eventloop import EventLoop
from detlaunch.system.jobdir import SECRET_ENV
from support.helpers import free_port

pytestmark = pytest.mark.timeout(30)


class Events:
    """What a link tells its supervisor, recorded."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args: self.seen.append((name, *args))

    def names(self) -> list[str]:
        return [s[0] for s in self.seen if s[0] != "trace"]


def settings(node: int, port: int, tmp: str, secret: str = "s3cret") -> LinkSettings:
    """Node `node` of a job of three, on loopback, its secret in the environment."""
    return LinkSettings(job_id="job-1", node=node, num_nodes=3, chief_addr="127.0.0.1", port=port, heartbeat=1.0,
                        shared_dir=tmp, environ={SECRET_ENV: secret},
                        node_addrs=("127.0.0.1", "127.0.0.2", "127.0.0.3"), node_addr=f"127.0.0.{node + 1}")


def chief_link(loop: EventLoop, s: LinkSettings, events: Events) -> ChiefLink:
    """The chief's link; `events` records what it tells its supervisor and its questions' owner."""
    return ChiefLink(loop, s, events, events)


def worker_link(loop: EventLoop, s: LinkSettings, events: Events) -> WorkerLink:
    """A worker's link; `events` records what it tells its supervisor, its questions' owner and its attempts'."""
    return WorkerLink(loop, s, events, events, events)


def run_until(loop: EventLoop, done: Callable[[], bool], timeout: float = 5.0) -> None:
    loop.run_until(done, timeout, "the links' state")  # the one loop helper, with its deadline


def three_nodes(tmp: str) -> tuple[EventLoop, int, ChiefLink, Events, WorkerLink, WorkerLink, Events]:
    """A chief and its two worker nodes, joined."""
    loop, port = EventLoop(), free_port()
    chief_events, e2 = Events(), Events()
    chief = chief_link(loop, settings(0, port, tmp), chief_events)
    w1 = worker_link(loop, settings(1, port, tmp), Events())
    w2 = worker_link(loop, settings(2, port, tmp), e2)
    run_until(loop, lambda: "joined" in chief_events.names() and w1.joined and w2.joined)
    return loop, port, chief, chief_events, w1, w2, e2


def run_for(loop: EventLoop, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        loop.run_once(timeout=0.05)


def test_a_lost_node_rejoins_for_the_next_attempt_and_a_connected_one_is_never_displaced(tmp_path: Any) -> None:
    loop, port, chief, chief_events, w1, w2, e2 = three_nodes(str(tmp_path))
    assert (w1.attempt, w1.hold) == (1, False)

    # Every node is here: the chief does not even answer another detlaunch claiming node 1.
    impostor = worker_link(loop, settings(1, port, str(tmp_path)), Events())
    run_for(loop, 0.3)
    assert not impostor.joined and chief.nodes[1] is not None and not chief.nodes[1].closed
    impostor.close()

    # Node 1's detlaunch dies: the chief loses it, and restarts the job without it.
    assert w1.connection is not None
    w1.connection.sock.close()
    run_until(loop, lambda: "node_lost" in chief_events.names())
    w1.close()
    assert chief.lost_nodes() == [1]
    w2.finish(None, [])  # node 2's part of attempt 1 is over: its goodbye
    run_until(loop, chief.ready_to_finish)
    chief.restart(2, 0.5)
    run_until(loop, lambda: "chief_restart" in e2.names())
    assert e2.seen[-1] == ("chief_restart", 2, None)  # None: wait for go, the lost node is not back
    assert chief.missing_nodes() == [1]

    # Listening again: another detlaunch claiming node 2, which is still connected, with the job's
    # secret, is refused; node 2 keeps its place.
    node2 = chief.nodes[2]
    impostor_events = Events()
    impostor = worker_link(loop, settings(2, port, str(tmp_path)), impostor_events)
    run_until(loop, lambda: "link_failed_to_start" in impostor_events.names())
    assert "refused this node" in impostor_events.seen[-1][1]
    assert chief.nodes[2] is node2 and not node2.closed and "chief_lost" not in e2.names()
    impostor.close()

    # Its new detlaunch joins with the job's secret: told attempt 2, and to wait for go.
    e1b = Events()
    w1b = worker_link(loop, settings(1, port, str(tmp_path)), e1b)
    run_until(loop, lambda: w1b.joined and chief_events.names().count("joined") == 2)
    assert (w1b.attempt, w1b.hold) == (2, True)
    assert chief.missing_nodes() == []
    chief.go()
    run_until(loop, lambda: "chief_go" in e1b.names() and "chief_go" in e2.names())
    assert e1b.seen[-1] == ("chief_go", 2) and e2.seen[-1] == ("chief_go", 2)
    assert w1b.members is None and w2.members is None  # every place, as at the start: not named (1024 at scale)
    for link in (w1b, w2, chief):
        link.close()
    loop.close()


def test_a_node_lost_during_the_backoff_is_forgotten_and_the_others_hold_for_it(tmp_path: Any) -> None:
    """Attempt 2 is due in a while, every node was there: node 1 dies meanwhile. The chief forgets it,
    tells node 2 to hold (wait for go instead of its own backoff) and welcomes node 1's new detlaunch."""
    loop, port, chief, chief_events, w1, w2, e2 = three_nodes(str(tmp_path))
    w1.finish(None, [])
    w2.finish(None, [])
    run_until(loop, chief.ready_to_finish)
    chief.restart(2, 30.0)
    run_until(loop, lambda: "chief_restart" in e2.names())
    assert e2.seen[-1] == ("chief_restart", 2, 30.0) and not chief.holding
    assert w1.connection is not None
    w1.connection.sock.close()
    run_until(loop, lambda: "node_lost" in chief_events.names())
    w1.close()
    assert chief.forget_lost() == [1] and chief.missing_nodes() == [1]
    run_until(loop, lambda: e2.names().count("chief_restart") == 2)
    assert e2.seen[-1] == ("chief_restart", 2, None)  # hold: the attempt starts on go
    assert chief.forget_lost() == []  # nothing more to forget, and no second hold
    e1b = Events()
    w1b = worker_link(loop, settings(1, port, str(tmp_path)), e1b)
    run_until(loop, lambda: w1b.joined and chief_events.names().count("joined") == 2)
    assert (w1b.attempt, w1b.hold) == (2, True)
    assert w1b.connection is not None
    w1b.connection.sock.close()  # and its loss is seen again, not swallowed
    run_until(loop, lambda: chief_events.names().count("node_lost") == 2)
    for link in (w1b, w2, chief):
        link.close()
    loop.close()


def test_a_node_with_the_wrong_secret_cannot_take_a_lost_nodes_place(tmp_path: Any) -> None:
    loop, port, chief, chief_events, w1, w2, e2 = three_nodes(str(tmp_path))
    assert w1.connection is not None
    w1.connection.sock.close()
    run_until(loop, lambda: "node_lost" in chief_events.names())
    w1.close()
    chief.restart(2, 0.0)
    bad_events = Events()
    bad = worker_link(loop, settings(1, port, str(tmp_path), secret="guessed"), bad_events)
    run_until(loop, lambda: "link_failed_to_start" in bad_events.names())
    assert chief.missing_nodes() == [1] and chief_events.names().count("joined") == 1
    for link in (bad, w2, chief):
        link.close()
    loop.close()


@pytest.mark.parametrize("line", [b"[" * 3000, '{"t": "auth", "node": 1, "nonce": "n", "mac": "\u00e9"}'.encode(),
                                  b'{"t": "auth", "node": 1, "nonce": "n", "mac": 7}', b"\xff\xfe", b"7",
                                  b'{"t": "stop", "failure": null}', b'{"t": ["auth"]}'])
def test_what_anyone_can_send_before_auth_closes_that_connection_and_nothing_else(tmp_path: Any,
                                                                                 line: bytes) -> None:
    """The link's port is reachable before authentication: a deep JSON nesting (RecursionError), a
    non-ASCII MAC (compare_digest's TypeError), a mistyped field, what is not a message, or a chief's
    message must not take the chief, and the job, down."""
    import socket

    loop, port = EventLoop(), free_port()
    chief_events = Events()
    chief = chief_link(loop, settings(0, port, str(tmp_path)), chief_events)
    attacker = socket.create_connection(("127.0.0.1", port))
    attacker.sendall(line + b"\n")
    attacker.setblocking(False)
    got: list[bytes] = []

    def closed_by_the_chief() -> bool:
        try:
            got.append(attacker.recv(65536))
        except BlockingIOError:
            return False
        return got[-1] == b""

    run_until(loop, closed_by_the_chief)  # the chief refused it, and runs on
    w1 = worker_link(loop, settings(1, port, str(tmp_path)), Events())
    w2 = worker_link(loop, settings(2, port, str(tmp_path)), Events())
    run_until(loop, lambda: "joined" in chief_events.names() and w1.joined and w2.joined)
    attacker.close()
    for link in (w1, w2, chief):
        link.close()
    loop.close()


def test_a_worker_links_state_follows_the_chief_stop_restart_end_and_is_traced(tmp_path: Any) -> None:
    """LinkState's drawing, message by message: welcome -> JOINED, stop -> STOPPED (its own failure is
    then not reported again), restart -> JOINED, end -> ENDED, and the connection closing then is no lost chief."""
    from detlaunch.link.worker import LinkState
    from detlaunch.outcome import Failure, FailureKind

    loop, port = EventLoop(), free_port()
    chief_events, worker_events = Events(), Events()
    chief = chief_link(loop, settings(0, port, str(tmp_path)), chief_events)
    chief.expected = {1}
    worker = worker_link(loop, settings(1, port, str(tmp_path)), worker_events)
    assert worker.state is LinkState.DIALING and not worker.joined
    run_until(loop, lambda: worker.state is LinkState.JOINED)

    chief.failed(Failure("rank 0 on node 0 (127.0.0.1) exited with code 3", 3, at=1.0, kind=FailureKind.RANK))
    run_until(loop, lambda: worker.state is LinkState.STOPPED)
    assert worker.joined and "chief_verdict" in worker_events.names()
    chief.finished.add(1)
    chief.restart(2, 0.0)
    run_until(loop, lambda: worker.state is LinkState.JOINED)
    assert ("chief_restart", 2, 0.0) in worker_events.seen

    chief.finish(None, [])
    run_until(loop, lambda: worker.state is LinkState.ENDED and worker.closed)
    run_for(loop, 0.2)
    assert "chief_lost" not in worker_events.names() and "link_failed_to_start" not in worker_events.names()
    traced = [s[1] for s in worker_events.seen if s[0] == "trace" and s[1].startswith("link to the chief")]
    assert traced == ["link to the chief: dialing -> joined", "link to the chief: joined -> stopped",
                      "link to the chief: stopped -> joined", "link to the chief: joined -> ended"]
    worker.close()
    assert worker.state is LinkState.CLOSED
    chief.close()


def test_questions_reach_their_owner_both_ways_and_a_lost_peer_is_said_to_it(tmp_path: Any) -> None:
    """The link hands questions to control.py's side itself (the recorder stands for it): a worker's
    client's question and the chief's answer, the chief's request and the worker's reply; and a lost
    node or chief first to the questions' owner (nothing more will come from it), then to the supervisor."""
    loop, port, chief, chief_events, w1, w2, e2 = three_nodes(str(tmp_path))
    assert w2.ask(5, "status", {"x": 1})
    run_until(loop, lambda: ("remote_ask", 2, 5, "status", {"x": 1}) in chief_events.seen)
    chief.answer(2, 5, {"nodes": []})
    chief.request(2, 9, "stacks", {"budget": 1.0})
    run_until(loop, lambda: ("answered", 5, {"nodes": []}) in e2.seen)
    run_until(loop, lambda: ("chief_request", 9, "stacks", {"budget": 1.0}) in e2.seen)
    w2.reply(9, {"ranks": [1]})
    run_until(loop, lambda: ("part", 9, 2, {"ranks": [1]}) in chief_events.seen)

    assert w1.connection is not None
    w1.connection.sock.close()
    run_until(loop, lambda: "node_lost" in chief_events.names())
    names = chief_events.names()
    assert names.index("node_gone") == names.index("node_lost") - 1 and ("node_gone", 1) in chief_events.seen
    chief.close()
    run_until(loop, lambda: "chief_lost" in e2.names())
    assert e2.names()[-2:] == ["chief_gone", "chief_lost"]
    for link in (w1, w2):
        link.close()
    loop.close()


def test_a_spare_sent_to_a_place_is_told_from_the_lost_node_back_by_its_claim_not_its_address(tmp_path: Any) -> None:
    """Node 1 is lost and spare 3 is sent to its place; the lost node's new detlaunch and the spare dial from one
    address (a host, a NAT, a recycled pod IP). The one that does not say it is spare 3 (the lost node back) is
    made a new spare (4); the one that does takes node 1's place."""
    import dataclasses

    tmp = str(tmp_path)
    loop, port = EventLoop(), free_port()
    chief_events, spare_events = Events(), Events()
    chief = chief_link(loop, dataclasses.replace(settings(0, port, tmp), spares=1), chief_events)
    w1, w2 = worker_link(loop, settings(1, port, tmp), Events()), worker_link(loop, settings(2, port, tmp), Events())
    spare = worker_link(loop, dataclasses.replace(settings(3, port, tmp), node_addr="127.0.0.2"), spare_events)
    run_until(loop, lambda: w1.joined and w2.joined and "spare_joined" in chief_events.names())
    assert w1.connection is not None
    w1.connection.sock.close()
    run_until(loop, lambda: "node_lost" in chief_events.names())
    w1.close()
    w2.finish(None, [])
    run_until(loop, chief.ready_to_finish)
    chief.restart(2, 0.0)
    assert chief.promote_spare(1, set()) == (3, "127.0.0.2")
    run_until(loop, lambda: "promoted" in spare_events.names())
    spare.close()

    back_events = Events()
    back = worker_link(loop, settings(1, port, tmp), back_events)  # node 1's new detlaunch, at 127.0.0.2 too
    run_until(loop, lambda: "made_spare" in back_events.names())
    assert ("made_spare", 4) in back_events.seen and chief.missing_nodes() == [1]
    promoted = worker_link(loop, dataclasses.replace(settings(1, port, tmp), promoted_from=3), Events())
    run_until(loop, lambda: promoted.joined and chief.missing_nodes() == [])
    assert chief.addr_of(1) == "127.0.0.2" and chief.spares.coming == {}
    for link in (back, promoted, w2, chief):
        link.close()
    loop.close()
