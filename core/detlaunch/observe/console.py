"""The node's console when ``--dedupe`` is on: rank output read from pipes, folded, then written out.

Without dedupe the wrappers write straight to the console (the supervisor's stdout and stderr,
handed over the rank socket) and nothing here runs. With it, the supervisor hands them the write
ends of two pipes instead; this part reads them in the event loop, cuts whole lines
(`dedupe.LineSplitter`), folds identical lines of several ranks (`dedupe.LineFolder`, whose window
ends on a loop timer, never a poll) and writes the result to the real console; while the ranks flood
it (more than `dedupe.PASS_THROUGH_RATE` lines a second each) the reads go out as they came
(`dedupe.ConsoleFolder`). The per-rank log files are written by the wrappers themselves, so they
hold every line whatever happens here.

The console may stall (a full pipe nobody reads, a suspended terminal); the supervisor's loop must
not. So output waits in a bounded outbox and goes out only when the selector says the console is
writable, at most PIPE_BUF bytes per write (a pipe that polls writable takes that much without
blocking). While the outbox is over its bound the rank pipes are not read: the wrappers then block
on a full pipe, exactly as they would on a full console without dedupe; the loop never does.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from detlaunch.observe.dedupe import DEFAULT_WINDOW, PASS_THROUGH_RATE, ConsoleFolder
from detlaunch.system.eventloop import EventLoop, Priority, Timer

PIPE_BUF = 4096
READ_SIZE = 1 << 16
OUTBOX_LIMIT = 1 << 22  # bytes waiting for the console before the rank pipes stop being read


class FoldedStream:
    """One console stream (stdout or stderr): a pipe the wrappers write to, folded onto `console_fd`."""

    def __init__(self, loop: EventLoop, console_fd: int, ranks: int, window: float,
                 on_output: Callable[[], None] = lambda: None, rate: float = PASS_THROUGH_RATE) -> None:
        self.loop, self.console_fd, self.on_output = loop, console_fd, on_output
        self.folder = ConsoleFolder(ranks, window, rate)
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self.outbox = bytearray()
        self.reading = self.writing = False
        self.timer: Timer | None = None
        self.timer_at: float | None = None
        self.console_gone = False
        self.direct = False
        self._read_more()

    # -- in ------------------------------------------------------------------------------------
    def _read_more(self) -> None:
        if not self.reading and self.read_fd >= 0:
            self.loop.add_reader(self.read_fd, Priority.CHILD_OUTPUT, self._on_readable)
            self.reading = True

    def _on_readable(self) -> None:
        try:
            data = os.read(self.read_fd, READ_SIZE)
        except BlockingIOError:
            return
        now = self.loop.clock()
        self._out(self.folder.feed(data, now))
        self._arm_timer()
        self.on_output()

    def _arm_timer(self) -> None:
        deadline = self.folder.next_deadline()
        if deadline is None or (self.timer_at is not None and self.timer_at <= deadline):
            return
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = deadline
        self.timer = self.loop.call_at(deadline, self._on_deadline)

    def _on_deadline(self) -> None:
        self.timer = self.timer_at = None
        self._out(self.folder.flush(self.loop.clock()))
        self._arm_timer()

    # -- out -----------------------------------------------------------------------------------
    def _out(self, data: bytes) -> None:
        if not data or self.console_gone:
            return
        self.outbox += data
        if self.direct:  # a regular file (or /dev/null): no selector takes it, and writing it never stalls
            self._write_out()
            return
        if not self.writing:
            try:
                self.loop.add_writer(self.console_fd, Priority.CHILD_OUTPUT, self._on_writable)
            except PermissionError:  # epoll refuses files that are always ready
                self.direct = True
                self._write_out()
                return
            self.writing = True
        if len(self.outbox) > OUTBOX_LIMIT and self.reading:
            self.loop.remove(self.read_fd)  # back-pressure on the wrappers, never on the loop
            self.reading = False

    def _on_writable(self) -> None:
        chunk = self._next_chunk()
        try:
            written = os.write(self.console_fd, chunk)
        except BlockingIOError:
            return
        except OSError:  # the console is gone: the logs still have every line
            self.console_gone = True
            written = len(self.outbox)
        del self.outbox[:written]
        if not self.outbox:
            self.loop.remove(self.console_fd)
            self.writing = False
        if len(self.outbox) <= OUTBOX_LIMIT // 2:
            self._read_more()

    def _next_chunk(self) -> bytes:
        """At most PIPE_BUF bytes, cut after a line end when one is there (no torn line)."""
        if len(self.outbox) <= PIPE_BUF:
            return bytes(self.outbox)
        cut = max(self.outbox.rfind(b"\n", 0, PIPE_BUF), self.outbox.rfind(b"\r", 0, PIPE_BUF)) + 1
        return bytes(self.outbox[:cut or PIPE_BUF])

    # -- the end -------------------------------------------------------------------------------
    def close(self) -> None:
        """The job is over here: take what is left in the pipe, show every waiting line, write it all.

        The wrappers are gone by now, so this only waits for the console itself."""
        if self.timer is not None:
            self.timer.cancel()
        self.loop.remove(self.read_fd)
        self.loop.remove(self.console_fd)
        os.close(self.write_fd)  # ours was the last write end: the read below ends
        while True:
            try:
                data = os.read(self.read_fd, READ_SIZE)
            except BlockingIOError:
                break
            if not data:
                break
            self.outbox += self.folder.feed(data, self.loop.clock())
        self.outbox += self.folder.close(self.loop.clock())
        os.close(self.read_fd)
        self.read_fd = -1
        self._write_out()

    def _write_out(self) -> None:
        """Write the whole outbox now (a regular file; or the end of the job)."""
        while self.outbox and not self.console_gone:
            try:
                written = os.write(self.console_fd, self._next_chunk())
            except OSError:
                self.console_gone = True
                break
            del self.outbox[:written]


class FoldingConsole:
    """stdout and stderr of this node's ranks, each folded on its own (see the module docstring)."""

    def __init__(self, loop: EventLoop, ranks: int, window: float = DEFAULT_WINDOW,
                 console_fds: tuple[int, int] = (1, 2), on_output: Callable[[], None] = lambda: None) -> None:
        self.streams = [FoldedStream(loop, fd, ranks, window, on_output) for fd in console_fds]

    @property
    def fds(self) -> tuple[int, int]:
        """The write ends to hand the wrappers, in place of the console's fds."""
        return self.streams[0].write_fd, self.streams[1].write_fd

    def close(self) -> None:
        for stream in self.streams:
            stream.close()
