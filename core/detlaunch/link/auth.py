"""Who may join the job link: the handshake that proves both ends, and how much unproven work the chief takes on.

The handshake, an HMAC-SHA256 challenge-response in both directions over the job's secret:

    chief  -> worker   challenge  {job, nonce: Nc}
    worker -> chief    auth       {node: N, nonce: Nw, addr, mac: worker_mac(secret, job, N, Nc)}
    chief  -> worker   welcome    {mac: chief_mac(secret, job, N, Nw), attempt, hold}

Each side signs the other's fresh nonce, so neither a replayed message nor a listener that is not
the chief passes. A worker says nothing else before the welcome (the chief takes anything else for
a failed authentication), and the chief welcomes a node only while that node is not connected:
a second join for a connected node is refused, whatever its credentials.

The secret never appears on a command line: it comes from DETLAUNCH_JOB_SECRET when the scheduler
sets one on every node, else from a 0600 file in the job directory shared by the nodes (the chief
writes it before it starts listening, so a worker that reaches the listener reads the current
secret, never a stale one): system/jobdir.py.

Before a peer has proven itself the chief bounds what it spends on it (`Admission`), so a flood of
connections on the link's port cannot slow the verdict path. After it, every message on the connection is
signed with a key of that connection (`link_key`, from the secret and both sides' nonces) and numbered, so
nobody on the path can add, replay, reorder or reflect one (`signature`, `opened`).
"""

from __future__ import annotations

import hashlib

ACCEPTS_PER_SECOND = 200  # new unauthenticated connections the chief accepts a second
MAX_PENDING, MAX_PENDING_PER_PEER = 64, 8  # unauthenticated connections at once: in all, from one address


def mac(secret: str, *parts: object) -> str:
    import hmac  # here: only a job with a link between nodes signs (hmac pulls in OpenSSL)

    return hmac.new(secret.encode(), "\0".join(map(str, parts)).encode(), hashlib.sha256).hexdigest()


def mac_matches(given: object, expected: str) -> bool:
    """Constant-time, for anything a peer sent (compare_digest raises on a non-ASCII str)."""
    import hmac

    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def worker_mac(secret: str, job: str, node: int, chief_nonce: str) -> str:
    """What worker node `node` signs to prove it is a node of `job`."""
    return mac(secret, "worker", job, node, chief_nonce)


def chief_mac(secret: str, job: str, node: int, worker_nonce: str) -> str:
    """What the chief signs to prove to node `node` that it is the chief of `job`."""
    return mac(secret, "chief", job, node, worker_nonce)


def link_key(secret: str, job: str, node: int, chief_nonce: str, worker_nonce: str) -> bytes:
    """The key of one connection, once both sides have proven themselves: every message after the handshake is
    signed with it (signature), so nobody on the path can add one (a `stop`), replay one, or send one back."""
    return bytes.fromhex(mac(secret, "link", job, node, chief_nonce, worker_nonce))


TAG = 32  # hex digits of a message's signature (128 bits)
_last_digest: tuple[bytes, bytes] = (b"", b"")  # the last payload signed and its SHA-256: a broadcast hashes once


def _digest(payload: bytes) -> bytes:
    """SHA-256 of `payload`, kept for the same bytes object: the chief sends one message to every node (a
    membership of 20 KB to 1024 of them) and each signature then costs a HMAC of 41 bytes, not of 20 KB."""
    global _last_digest
    if _last_digest[0] is not payload:
        _last_digest = (payload, hashlib.sha256(payload).digest())
    return _last_digest[1]


def signature(key: bytes, direction: bytes, seq: int, payload: bytes) -> bytes:
    """A message's signature: its sender's side (b"C" the chief, b"W" a worker), its number on the connection in
    that direction (no replay, no reordering), and its bytes."""
    import hmac

    return hmac.digest(key, direction + seq.to_bytes(8, "big") + _digest(payload), "sha256")[:TAG // 2].hex().encode()


def opened(key: bytes, direction: bytes, seq: int, line: bytes) -> bytes | None:
    """The payload of a signed line (`payload TAB signature`), or None when the signature is not this message's."""
    import hmac

    payload, tab, tag = line.rpartition(b"\t")
    if not tab or not hmac.compare_digest(tag, signature(key, direction, seq, payload)):
        return None
    return payload


def admits(peer: str, pending: list[str], known: set[str], admission: Admission) -> bool:
    """Whether the chief takes one more unauthenticated connection from `peer`, given the peers of those it has
    (`pending`). A few addresses cannot hold every slot: at most max_per_peer from one address, and from the
    addresses that are not the job's own nodes' (`known`), at most max_pending in all (Admission.wait). A node of
    the job is never kept out by others' connections: only its own count (max_per_peer) holds it back."""
    if sum(1 for p in pending if p == peer) >= admission.max_per_peer:
        return False
    return peer in known or sum(1 for p in pending if p not in known) < admission.max_pending


class Admission:
    """How many unauthenticated connections the chief takes on: `per_second` new ones a second (a token bucket,
    `max_pending` at once), each then checked by `admits`: at most `max_pending` pending at once from addresses
    that are not the job's nodes', `max_per_peer` from one address. The chief accepts in order to see who
    dials: a node of the job must not wait behind others' pending connections."""

    def __init__(self, per_second: float, max_pending: int, max_per_peer: int) -> None:
        self.per_second, self.max_pending, self.max_per_peer = per_second, max_pending, max_per_peer
        self.tokens = float(max_pending)
        self.updated: float | None = None

    def wait(self, now: float) -> float:
        """0 when one more connection may be accepted now (and take its token), else how long to wait."""
        if self.updated is not None:
            self.tokens = min(float(self.max_pending), self.tokens + (now - self.updated) * self.per_second)
        self.updated = now
        if self.tokens < 1:
            return (1 - self.tokens) / self.per_second
        self.tokens -= 1
        return 0.0
