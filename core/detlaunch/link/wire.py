"""One connection of the job link: the link's messages as JSON lines over TCP, driven by the event loop.

Sends never block the loop: what the socket does not take at once waits in a bounded buffer and is
sent as the socket takes more; a peer that leaves more than MAX_UNSENT bytes unread (stopped, or
hung) counts as lost, so a stalled node cannot delay the verdict for the others. Until a peer has
authenticated it may send at most MAX_UNAUTHENTICATED bytes, and is read after everything else.

Once both sides have proven themselves every line carries a signature (auth.signature: the connection's
key, the sender's side, the line's number), checked here before anything else: a line someone on the path
added, replayed or sent back ends the connection. A line longer than message_bound ends it too, and a read
searches its new bytes only for a newline. What a peer sends is read here, in one place (messages.decode):
heartbeats prove it alive and go no further; before authentication, anything that is no message of the
link ends the connection; after it, a kind this link does not know is ignored (a later version's) and a
malformed message ends the connection, saying why.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterable, Iterator

from detlaunch.link import auth
from detlaunch.link.messages import (
    WORKER,
    Heartbeat,
    Malformed,
    Message,
    NotAMessage,
    UnknownKind,
    Welcome,
    decode,
    encode,
)
from detlaunch.system.eventloop import EventLoop, Priority
from detlaunch.system.safefs import random_hex

HEARTBEAT_MISSES = 5  # a peer silent for this many heartbeat intervals is lost
MAX_UNAUTHENTICATED = 4096  # bytes a peer may send before it has proven it is a node of the job
MAX_UNSENT = 1 << 20  # bytes a peer may leave unread (beyond what the kernel buffers) before it counts as lost
MAX_LINE = 16 << 20  # bytes of one message, at least (message_bound): a longer line ends the connection


def message_bound(nodes: int) -> int:
    """The longest message a peer of a job of `nodes` nodes may send: MAX_LINE, and room for a membership that
    grows with the job (~20 bytes a node) many times over. A peer that sends more is no node of the job."""
    return MAX_LINE + 1024 * nodes
HEARTBEAT = b'{"t": "hb"}'  # the one message sent every heartbeat: sent and recognised without (de)coding


class PeerConnection:
    """One TCP connection to another node's supervisor. `peer_side` (messages.CHIEF or WORKER): what is
    at the other end, and so which kinds of message it may send."""

    def __init__(self, loop: EventLoop, sock: socket.socket, peer_side: str,
                 on_message: Callable[[PeerConnection, Message], None],
                 on_close: Callable[[PeerConnection], None]):
        self.loop, self.sock, self.peer_side = loop, sock, peer_side
        self.on_message, self.on_close = on_message, on_close
        self.buffer = bytearray()
        self.scanned = 0  # bytes at the buffer's start already searched for a newline (none there)
        self.max_line = MAX_LINE  # message_bound(the job's nodes), set by the link
        self.unauthenticated = 0  # bytes of lines read before the one that authenticated the peer
        self.closed = False
        self.opened = time.monotonic()
        self.last_heard = time.monotonic()
        self.node: int | None = None  # the chief's side: the worker node it proved to be
        self.peer = ""  # the remote address
        self.authed = False
        self.nonce = random_hex(16)  # what the other side signs to prove itself (auth.py)
        self.peer_nonce = ""  # what this side signed to prove itself (the other side's nonce)
        self.key: bytes | None = None  # set once both sides are proven: every later message is signed (auth.py)
        self.sent_count = self.received_count = 0  # signed messages each way: each one's number
        self.side = b"C" if peer_side == WORKER else b"W"  # this side's byte in a signature (the peer's: other)
        self.unsent = bytearray()
        self.writing = False  # the loop calls flush when the socket takes more
        self.why = ""  # why the connection closed, when this side closed it for a reason
        self.closing = False  # close once everything queued is sent (close_when_sent)
        self.held = False  # queue, do not send yet (together)
        sock.setblocking(False)
        # Unproven peers are served after everything else; a node of the job is raised on joining.
        loop.add_reader(sock, Priority.PROBE, self.on_readable)

    def trusted(self, key: bytes | None = None) -> None:
        """The peer has proven itself; with `key`, every message from now on is signed and checked (a connection
        of this module's own tests may go without)."""
        self.authed, self.key = True, key
        self.loop.remove(self.sock)
        self.loop.add_reader(self.sock, Priority.RANK_REPORT, self.on_readable)
        if self.writing:
            self.loop.on_writable(self.sock, self.flush)

    def send(self, message: Message) -> None:
        self.send_encoded(encode(message), sign=not isinstance(message, Welcome))  # the chief's welcome signs itself

    def send_encoded(self, line: bytes, sign: bool = True) -> None:
        """Queue one encoded message (messages.encode) and send what the socket takes now; never blocks."""
        if self.closed:
            return
        if self.key is not None and sign:
            self.unsent += line + b"\t" + auth.signature(self.key, self.side, self.sent_count, line) + b"\n"
            self.sent_count += 1
        else:
            self.unsent += line + b"\n"
        if len(self.unsent) > MAX_UNSENT:
            self.end(f"it left {len(self.unsent)} bytes of the link unread (stopped, or hung)")
        elif not self.writing and not self.held:
            self.flush()

    def flush(self) -> None:
        try:
            while self.unsent:
                del self.unsent[: self.sock.send(self.unsent)]
        except BlockingIOError:
            pass
        except OSError:
            self.close(notify=True)
            return
        if self.closing and not self.unsent:
            self.close()
            return
        if self.writing != bool(self.unsent):
            self.writing = bool(self.unsent)
            self.loop.on_writable(self.sock, self.flush if self.writing else None)

    def close_when_sent(self) -> None:
        """Close once the last queued message is out (the socket's own buffer then delivers it):
        closing at once would drop what the socket has not taken yet."""
        self.closing = True
        self.flush()

    def on_readable(self) -> None:
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close(notify=True)
                return
            self.last_heard = time.monotonic()
            self.take(data)

    def take(self, data: bytes) -> None:
        """Pass on every whole line `data` ends. Only the new bytes are searched for a newline, and a line is cut
        from the buffer once (a peer's line of many MiB costs its length, not its length squared)."""
        buf = self.buffer
        buf += data
        start, search = 0, self.scanned
        while not self.closed:
            end = buf.find(b"\n", search)
            if end < 0:
                break
            raw = bytes(buf[start:end])
            start = search = end + 1
            if not self.authed:  # counted line by line: what follows the line that authenticates is not
                self.unauthenticated += len(raw) + 1  # (the chief's welcome, then a 20 KB membership)
                if self._too_much_unauthenticated(0):
                    return
            elif self.key is not None:
                payload = auth.opened(self.key, b"W" if self.side == b"C" else b"C", self.received_count, raw)
                if payload is None:
                    return self.end(f"it sent a message without this connection's signature (number "
                                    f"{self.received_count}): not from the node that authenticated")
                self.received_count, raw = self.received_count + 1, payload
            if raw != HEARTBEAT:
                self._receive(raw)
        if self.closed:
            return
        del buf[:start]
        self.scanned = len(buf)
        if not self.authed and self._too_much_unauthenticated(len(buf)):
            return  # (a line not ended yet)
        if len(buf) > self.max_line:
            self.end(f"it sent a message of over {self.max_line} bytes")

    def _too_much_unauthenticated(self, unended: int) -> bool:
        """Not a node of this job (an auth message is a few hundred bytes): closed, saying so."""
        if self.unauthenticated + unended <= MAX_UNAUTHENTICATED:
            return False
        self.end(f"it sent over {MAX_UNAUTHENTICATED} bytes before authenticating")
        return True

    def _receive(self, raw: bytes) -> None:
        """The one place a peer's line is read (see the module's docstring for what a bad one costs)."""
        try:
            message = decode(raw, self.peer_side)
        except UnknownKind as e:
            if not self.authed:
                self.end(f"it sent {e} before authenticating")
            return
        except (Malformed, NotAMessage) as e:
            self.end(f"it sent {e}")
            return
        if not isinstance(message, Heartbeat):
            self.on_message(self, message)

    def end(self, why: str) -> None:
        """Close it for a reason of this side's, and say so (on_close reads `why`)."""
        self.why = why
        self.close(notify=True)

    def close(self, notify: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove(self.sock)
        self.sock.close()
        if notify:
            self.on_close(self)

    def silent_for(self) -> float:
        return time.monotonic() - self.last_heard


@contextlib.contextmanager
def together(connections: Iterable[PeerConnection]) -> Iterator[None]:
    """What is sent on these connections inside goes to each peer in one write: a lost node's stop and the
    membership naming its replacement reach 1024 nodes in 1024 system calls, not 2048, and neither waits for
    the other's round."""
    held = [c for c in connections if not c.closed and not c.held]
    for conn in held:
        conn.held = True
    try:
        yield
    finally:
        for conn in held:
            conn.held = False
            if not conn.closed and not conn.writing:
                conn.flush()
