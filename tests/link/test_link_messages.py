"""The job link's message table: every kind named once with its fields and sender, read in one place
(unknown kinds, a side's wrong kinds and malformed messages), and what each costs a connection."""

from __future__ import annotations

import dataclasses
import re
import socket
from typing import Any

import pytest
from detlaunch.link import auth, messages
from detlaunch.link.membership import Membership, change
from detlaunch.link.messages import (
    BOTH,
    CHIEF,
    KINDS,
    WORKER,
    Answer,
    Ask,
    Auth,
    Bye,
    Challenge,
    End,
    Failed,
    Go,
    Heartbeat,
    Malformed,
    Members,
    MembersChange,
    Message,
    Promote,
    RankExit,
    Reply,
    Request,
    Restart,
    Stop,
    UnknownKind,
    Welcome,
    decode,
    encode,
)
from detlaunch.link.wire import HEARTBEAT, PeerConnection, message_bound
from detlaunch.outcome import Failure, FailureKind, RankStatus
from detlaunch.system.eventloop import EventLoop

STATUS = RankStatus(rank=3, node_rank=1, exit_code=None, signal=9, tail=("boom",), wall=12.5, host="h1")
FAILURE = Failure("rank 3 on node 1 (h1) was killed", 137, rank=STATUS, tail=("boom",), tail_of="rank 3", at=12.5,
                  kind=FailureKind.RANK)
EXAMPLES: list[Message] = [
    Heartbeat(), Challenge(job="job-1", nonce="n1"), Auth(node=2, nonce="n2", addr="10.0.0.2", mac="ab"),
    Auth(node=2, nonce="n2", addr="10.0.0.2", mac="ab", spare=5),
    Welcome(mac="cd", attempt=3, hold=True), RankExit(status=STATUS), Failed(failure=FAILURE),
    Bye(ranks=(STATUS, dataclasses.replace(STATUS, rank=4))), Ask(key=7, what="status", args={"x": 1}),
    Reply(key=7, data=[1, "two"]), Stop(failure=FAILURE), Request(key=8, what="stacks", args={"budget": 1.5}),
    Answer(key=8, data={"nodes": []}), Restart(attempt=2, delay=None), Restart(attempt=2, delay=0.5), Go(attempt=2),
    End(failure=None), End(failure=FAILURE), Promote(place=2),
    Members(m=Membership(nodes=("10.0.0.1", ""), live=(0,), spares=((2, "10.0.0.3"),), attempt=2, running=False)),
    MembersChange(c=change(Membership(nodes=("a", "b"), live=(0, 1)), Membership(nodes=("a", "c"), live=(0,)))),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: m.kind)
def test_every_kind_reads_back_as_it_was_written(message: Message) -> None:
    sender = WORKER if message.sender == BOTH else message.sender
    assert decode(encode(message), sender) == message


def test_the_table_in_the_docstring_names_every_kind_once_with_its_sender_and_fields() -> None:
    rows = re.findall(r"^    (\w+) +(chief|worker|both) +(-|\w+(?:, \w+)*) ", messages.__doc__ or "", re.M)
    assert sorted(kind for kind, _, _ in rows) == sorted(KINDS) and len(rows) == len(KINDS) == 18
    for kind, sender, fields in rows:
        cls = KINDS[kind]
        assert cls.sender == sender
        wire = [f.metadata["key"] or f.name for f in dataclasses.fields(cls)]
        assert wire == ([] if fields == "-" else fields.split(", ")), kind
    assert {m.kind for m in EXAMPLES} == set(KINDS)


@pytest.mark.parametrize(("line", "sent_by", "error", "says"), [
    (b'{"t": "shout"}', WORKER, UnknownKind, "unknown kind 'shout'"),
    (b'{"t": "stop", "failure": null}', WORKER, UnknownKind, "kind 'stop', which a worker never sends"),
    (b'{"t": "rank_exit", "status": {}}', CHIEF, UnknownKind, "kind 'rank_exit', which a chief never sends"),
    (b'[1, 2]', WORKER, UnknownKind, "what is not a JSON object"),
    (b'{"t": ["x"]}', WORKER, UnknownKind, "unknown kind ['x']"),
    (b'{"t": "rank_exit"', WORKER, Malformed, "what is not JSON"),
    (b'{"t": "rank_exit"}', WORKER, Malformed, "kind 'rank_exit' with a bad 'status'"),
    (b'{"t": "rank_exit", "status": {"rank": "x", "node": 1}}', WORKER, Malformed, "kind 'rank_exit' with a bad"),
    (b'{"t": "auth", "node": true, "nonce": "n", "mac": "m"}', WORKER, Malformed, "kind 'auth' with a bad 'node'"),
    (b'{"t": "ask", "what": "status"}', WORKER, Malformed, "kind 'ask' with a bad 'id'"),
    (b'{"t": "restart", "attempt": 2, "delay": "soon"}', CHIEF, Malformed, "kind 'restart' with a bad 'delay'"),
])
def test_what_is_no_message_is_told_apart(line: bytes, sent_by: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error) as raised:
        decode(line, sent_by)
    assert says in str(raised.value)


def test_a_failure_that_cannot_be_read_counts_as_none() -> None:
    assert decode(b'{"t": "stop", "failure": {"what": "x"}}', CHIEF) == Stop(failure=None)  # no exit code
    assert decode(b'{"t": "failed", "failure": 7}', WORKER) == Failed(failure=None)
    assert decode(b'{"t": "welcome", "mac": "m"}', CHIEF) == Welcome(mac="m", attempt=1, hold=False)  # defaults


def trusted_connection(loop: EventLoop) -> tuple[PeerConnection, socket.socket, list[Any], list[PeerConnection]]:
    mine, theirs = socket.socketpair()
    got: list[Any] = []
    closed: list[PeerConnection] = []
    conn = PeerConnection(loop, mine, WORKER, lambda _c, m: got.append(m), closed.append)
    conn.trusted()
    return conn, theirs, got, closed


def test_once_trusted_an_unknown_kind_is_ignored_and_a_malformed_message_ends_the_connection_saying_why() -> None:
    loop = EventLoop()
    conn, theirs, got, closed = trusted_connection(loop)
    theirs.sendall(b'{"t": "from_a_later_version", "x": 1}\n{"t": "stop", "failure": null}\n'
                   + encode(Ask(key=1, what="status", args={})) + b"\n")
    loop.run_once(timeout=1)
    assert got == [Ask(key=1, what="status", args={})] and not conn.closed
    theirs.sendall(b'{"t": "bye", "ranks": [{"rank": 1}]}\n' + encode(Ask(key=2, what="status", args={})) + b"\n")
    loop.run_once(timeout=1)
    assert closed == [conn] and len(got) == 1
    assert conn.why.startswith("it sent a message of kind 'bye' with a bad 'ranks'"), conn.why
    theirs.close()
    loop.close()


def test_a_long_line_arrives_whole_and_one_over_the_bound_ends_the_connection() -> None:
    """Security round 2, item 4: a line had no bound once a peer had authenticated, and every read searched the
    whole buffer again for its newline (64 MiB without one: 30 s of the chief's loop). Now each read searches its
    new bytes only (PeerConnection.take), and a line over the bound (message_bound: grows with the job) ends it."""
    loop = EventLoop()
    conn, theirs, got, closed = trusted_connection(loop)
    conn.max_line = 1 << 20
    long = encode(Ask(key=1, what="status", args={"pad": "x" * ((1 << 20) - 100)}))
    for at in range(0, len(long), 4096):  # as a peer's reads bring it: a piece at a time
        conn.take(long[at:at + 4096])
    conn.take(b"\n")
    assert len(got) == 1 and got[0].args["pad"] == "x" * ((1 << 20) - 100) and not conn.closed
    for _ in range(257):  # 1 MiB + 4 KiB without a newline
        conn.take(b"y" * 4096)
        if conn.closed:
            break
    assert closed == [conn] and conn.why == f"it sent a message of over {1 << 20} bytes"
    assert message_bound(1024) > 1024 * 20 * 10  # ten times a 1024-node membership, at least
    theirs.close()
    loop.close()


def test_a_node_speaks_for_its_own_ranks_only(tmp_path: Any) -> None:
    """Security round 2, item 4: a rank's exit, a goodbye or a failure naming another node's rank is refused
    (before, the chief took node 1's word for node 2's rank). In-process, the real links on loopback."""
    from test_rejoin_link import three_nodes

    loop, _port, chief, chief_events, w1, w2, _e2 = three_nodes(str(tmp_path))
    try:
        assert w1.connection is not None
        w1.connection.send(RankExit(status=RankStatus(rank=2, node_rank=2, exit_code=3)))  # node 2's rank, from 1
        loop.run_until(lambda: any(s[0] == "node_lost" for s in chief_events.seen), 5, "the chief's answer")
        lost = next(s for s in chief_events.seen if s[0] == "node_lost")
        assert lost[1] == 1 and lost[3] == "it sent a rank status of another node than its own (1)", lost
        assert not any(s[0] == "remote_rank_exit" for s in chief_events.seen)
        w2.connection.send(RankExit(status=RankStatus(rank=2, node_rank=2, exit_code=3)))  # its own: taken
        loop.run_until(lambda: any(s[0] == "remote_rank_exit" for s in chief_events.seen), 5, "the chief's answer")
    finally:
        for link in (w2, w1, chief):
            link.close()
        loop.close()


def test_after_the_handshake_every_message_is_signed_and_an_added_replayed_or_reflected_one_ends_it() -> None:
    """Security round 2, item 4: after the handshake nothing was authenticated: someone on the path could add a
    `stop` or an `end`. Each message now carries a signature with the connection's key, its sender's side and
    its number (auth.signature); the real connections on a socket pair, the chief's side and a worker's."""
    loop = EventLoop()
    a, b = socket.socketpair()
    got: dict[str, list[Any]] = {"chief": [], "worker": []}
    closed: list[PeerConnection] = []
    chief = PeerConnection(loop, a, WORKER, lambda _c, m: got["chief"].append(m), closed.append)
    worker = PeerConnection(loop, b, CHIEF, lambda _c, m: got["worker"].append(m), closed.append)
    key = auth.link_key("s3cret", "job-1", 1, chief.nonce, worker.nonce)
    chief.trusted(key)
    worker.trusted(key)
    try:
        worker.send(Ask(key=1, what="status", args={}))
        chief.send(Stop(failure=None))
        chief.send_encoded(HEARTBEAT)
        loop.run_until(lambda: got["chief"] and got["worker"], 2, "both messages")
        assert got == {"chief": [Ask(key=1, what="status", args={})], "worker": [Stop(failure=None)]}
        a.sendall(encode(End(failure=None)) + b"\n")  # added by someone on the path, unsigned
        loop.run_until(lambda: closed, 2, "the worker's close")
        assert closed == [worker] and worker.why.startswith("it sent a message without this connection's signature")
        assert got["worker"] == [Stop(failure=None)]
    finally:
        for conn in (chief, worker):
            conn.close()
        loop.close()


@pytest.mark.parametrize("forgery", ["replayed", "reflected", "another connection's", "altered"])
def test_a_signed_line_that_is_not_the_next_of_this_connection_is_refused(forgery: str) -> None:
    key, other = auth.link_key("s", "j", 1, "cn", "wn"), auth.link_key("s", "j", 2, "cn", "wn")
    line = encode(Stop(failure=None))
    sent = line + b"\t" + auth.signature(key, b"C", 0, line)
    assert auth.opened(key, b"C", 0, sent) == line
    lines = {"replayed": (key, b"C", 1, sent), "reflected": (key, b"W", 0, sent),
             "another connection's": (other, b"C", 0, sent),
             "altered": (key, b"C", 0, sent.replace(b"stop", b"end\0"))}
    assert auth.opened(*lines[forgery]) is None
