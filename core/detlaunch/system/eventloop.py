"""The one event loop of a node's supervisor: a selector, timers, and signals through a self-pipe.

Nothing polls: the loop sleeps in select() until a file is ready, a timer is due, or a signal
arrives (written to a socketpair by Python's wakeup fd). Within one batch of ready files,
callbacks run in :class:`Priority` order.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import selectors
import signal
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

FileCallback = Callable[[], None]


class Priority(enum.IntEnum):
    """Which ready file is served first when several are ready in the same batch.

    RANK_REPORT: a wrapper's message (its rank's exit status) and the job link's messages.
        Read first, so a rank's own report is seen before the exit of the launcher above it:
        the launcher's exit must never hide its rank's cause.
    CHILD_OUTPUT: a launcher's or daemon's output, new connections, connects completing.
    PROBE: what only waits: a peer's sshd greeting (gates when the launchers start), a link
        connection not yet authenticated, a control answer still being written to its asker.
    SIGNAL: the self-pipe (SIGCHLD: reap; SIGINT/TERM/HUP: the user). Last, so the reports
        and output already waiting are taken in before a child's exit is acted on.
    """

    RANK_REPORT = 0
    CHILD_OUTPUT = 1
    PROBE = 2
    SIGNAL = 3


class Timer:
    """A callback due at a monotonic time; cancel() makes it a no-op."""

    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


def cancel_timer(timer: Timer | None) -> None:
    """Cancel `timer` if there is one (a part's optional timer: set, fired or never armed)."""
    if timer is not None:
        timer.cancel()


class EventLoop:
    """Files, timers and signals, dispatched one batch at a time."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._selector = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._old_wakeup: int | None = None
        self._old_handlers: dict[int, Any] = {}

    # -- files --------------------------------------------------------------------------------
    def add_reader(self, fileobj: Any, priority: Priority, callback: FileCallback) -> None:
        self._selector.register(fileobj, selectors.EVENT_READ, (priority, callback, None))

    def add_writer(self, fileobj: Any, priority: Priority, callback: FileCallback) -> None:
        self._selector.register(fileobj, selectors.EVENT_WRITE, (priority, callback, None))

    def on_writable(self, fileobj: Any, callback: FileCallback | None) -> None:
        """For a file read with add_reader: also call `callback` whenever it can take more data
        (None: no longer). How a connection sends without ever blocking the loop."""
        priority, on_read, _ = self._selector.get_key(fileobj).data
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if callback else 0)
        self._selector.modify(fileobj, events, (priority, on_read, callback))

    def remove(self, fileobj: Any) -> None:
        """Stop watching `fileobj` (nothing happens if it was not watched)."""
        try:
            self._selector.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    # -- timers -------------------------------------------------------------------------------
    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(when, callback)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.call_at(self.clock() + delay, callback)

    def next_timeout(self) -> float | None:
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return max(0.0, self._timers[0][0] - self.clock()) if self._timers else None

    def _run_due_timers(self) -> None:
        now = self.clock()
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.callback()

    # -- signals ------------------------------------------------------------------------------
    def catch_signals(self, signals: Iterable[int], on_signal: Callable[[int], None]) -> None:
        """Deliver `signals` to `on_signal(signum)` from inside the loop (never from a handler)."""
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        wake_r = self._wake_r

        def on_wakeup() -> None:
            try:
                data = wake_r.recv(4096)
            except BlockingIOError:
                return
            for signum in data:
                on_signal(signum)

        self.add_reader(wake_r, Priority.SIGNAL, on_wakeup)
        self._old_wakeup = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        signals = tuple(signals)
        for s in signals:
            self._old_handlers[s] = signal.signal(s, lambda *_: None)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)  # a caller may have held them until now

    def restore_signals(self) -> None:
        if self._old_wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            self._old_wakeup = None
        for s, handler in self._old_handlers.items():
            signal.signal(s, handler)
        self._old_handlers.clear()
        for sock in (self._wake_r, self._wake_w):
            if sock is not None:
                self.remove(sock)
                sock.close()
        self._wake_r = self._wake_w = None

    # -- running ------------------------------------------------------------------------------
    def run_once(self, timeout: float | None = None) -> None:
        """Wait for one batch of events (or the next timer), run their callbacks, then due timers."""
        wait = self.next_timeout()
        if timeout is not None:
            wait = timeout if wait is None else min(wait, timeout)
        events = self._selector.select(wait)
        for key, mask in sorted(events, key=lambda e: e[0].data[0]):
            on_writable = key.data[2]
            # _watched: an earlier callback of the batch may have closed this file
            if on_writable is not None and mask & selectors.EVENT_WRITE and self._watched(key):
                on_writable()
            if (on_writable is None or mask & selectors.EVENT_READ) and self._watched(key):
                key.data[1]()
        self._run_due_timers()

    def _watched(self, key: selectors.SelectorKey) -> bool:
        try:
            return self._selector.get_key(key.fileobj) is key
        except (KeyError, ValueError):
            return False

    def run(self, done: Callable[[], bool], after_each: Callable[[], None] = lambda: None) -> None:
        """Run batches until `done()`; `after_each` runs after every batch (state transitions), and
        once before the first: what the caller did before the loop (a failed start) may already
        allow a transition, which must not wait for an unrelated event."""
        after_each()
        while not done():
            self.run_once()
            after_each()

    def run_until(self, done: Callable[[], object], timeout: float, what: str = "the condition") -> None:
        """Run batches until `done()` is true, for at most `timeout` seconds; then raise TimeoutError
        naming `what`. For what the loop's own callbacks bring about (a message read, a timer fired):
        it sleeps in select() until the next event, never polls."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what} did not happen within {timeout:g} s")
            self.run_once(timeout=left)

    def close(self) -> None:
        self.restore_signals()
        self._selector.close()
