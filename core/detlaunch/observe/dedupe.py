"""Console de-duplication: identical lines from several ranks become one ``[ranks=0-7] line``.

Pure: no I/O, no clock. The supervisor reads its ranks' prefixed lines from a pipe, feeds them
with the time it read them, writes what comes back, and calls `flush` when `next_deadline` comes
(a timer, never a poll). The per-rank log files are untouched by this: they hold every line.
`ConsoleFolder` (what the supervisor uses) adds one rule: while the ranks flood the console
(over PASS_THROUGH_RATE lines a second each), reads go out as they came, unfolded and at once.

The promises, which tests/observe/test_dedupe.py checks over random interleavings:
- every line is shown exactly once (a folded line stands for one line of each of its ranks);
- a rank's lines are never reordered;
- no line waits longer than the window: a group is shown when every rank of the node has
  printed it, else when the window of its first line ends;
- lines that should not be folded are shown at once, after the rank's waiting lines: a
  traceback (from ``Traceback (most recent call last):`` to its exception line), a ``\\r``
  progress line, a line without a rank prefix. A line only one rank printed keeps its prefix.

How order is kept: lines wait in groups (same text, different ranks), numbered as they are
made. A rank may join a group only if it is newer than the rank's own last waiting group, so
each rank's waiting groups are in increasing order; showing a group first shows the older
groups its ranks still wait in, which ends (numbers only decrease) and never reorders a rank.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Iterable

import detlaunch.tracebacks as tracebacks
from detlaunch.observe.rank_sets import format_ranks

DEFAULT_WINDOW = 0.2  # seconds a line may wait for its twins from other ranks
PASS_THROUGH_RATE = 1000  # lines a second per rank: above it nobody reads the console, so it is not folded

_TRACEBACK = tracebacks.HEADER.encode()  # also ends the header of an exception group's
_TRACEBACK_STARTS = (_TRACEBACK, tracebacks.GROUP_HEADER.encode())


def parse_rank(line: bytes) -> tuple[int, int] | None:
    """(rank, where the text starts) of a ``[rank=N] text`` line from a rank wrapper, or None."""
    if line.startswith(b"[rank="):
        end = line.find(b"] ", 6, 20)
        if end > 6 and line[6:end].isdigit():
            return int(line[6:end]), end + 2
    return None


@functools.lru_cache(maxsize=1024)
def folded_prefix(ranks: tuple[int, ...]) -> bytes:
    """``[ranks=0-7] ``, for sorted `ranks` (cached: the same ranks fold again and again)."""
    return f"[ranks={format_ranks(ranks)}] ".encode()


class LineSplitter:
    """Cuts what is read from the console pipe into whole lines (``\\n``, ``\\r``, ``\\r\\n``).

    Wrappers write whole lines, but a read may end inside one: the rest waits for the next read.
    A read ending in ``\\r`` is a whole line at once (a progress bar is never held); a ``\\n``
    that then starts the next read is given back alone, as the end of that ``\\r\\n``.
    """

    def __init__(self) -> None:
        self.pending = b""
        self.after_cr: int | None = None  # the rank whose line the last read ended with "\r"

    def feed(self, data: bytes) -> list[tuple[int | None, bytes]]:
        """The (rank or None, line) pairs completed by `data`."""
        out: list[tuple[int | None, bytes]] = []
        if not data:
            return out
        if self.after_cr is not None and data.startswith(b"\n") and not self.pending:
            out.append((self.after_cr, b"\n"))
            data = data[1:]
        self.after_cr = None
        buf = self.pending + data if self.pending else data
        lines = buf.splitlines(keepends=True)  # bytes: split at "\n", "\r\n" and "\r" only, as wrappers do
        self.pending = lines.pop() if lines and lines[-1][-1:] not in (b"\n", b"\r") else b""
        prefix, rank = b"\0", None  # a wrapper writes runs of one rank's lines: parse a prefix once per run
        for line in lines:
            if not line.startswith(prefix):
                parsed = parse_rank(line)
                prefix, rank = (line[:parsed[1]], parsed[0]) if parsed else (b"\0", None)
            out.append((rank, line))
        if lines and not self.pending and buf.endswith(b"\r"):
            self.after_cr = out[-1][0]
        return out

    def flush(self) -> list[tuple[int | None, bytes]]:
        """At the end of the stream: the last partial line, if any, as it is."""
        rest, self.pending = self.pending, b""
        self.after_cr = None
        parsed = parse_rank(rest)
        return [(parsed[0] if parsed else None, rest)] if rest else []


@dataclasses.dataclass(eq=False, slots=True)
class _Group:
    """Lines with the same text from different ranks, waiting to be shown together."""

    number: int
    text: bytes  # the line without its prefix, line end included
    deadline: float
    lines: dict[int, bytes]  # rank -> its whole line as it came (shown as is when alone)
    shown: bool = False


class LineFolder:
    """Folds identical lines of several ranks within `window` seconds; see the module docstring.

    ranks: how many ranks print to this console (this node's ranks): a group is shown as soon
    as all of them are in it.
    """

    def __init__(self, ranks: int, window: float = DEFAULT_WINDOW) -> None:
        self.ranks = ranks
        self.window = window
        self._made = 0
        self._open: dict[bytes, _Group] = {}  # text -> the newest group waiting with that text
        self._order: collections.deque[_Group] = collections.deque()  # by number, so by deadline
        self._waiting: dict[int, collections.deque[_Group]] = {}  # rank -> its groups, oldest first
        self._in_traceback: set[int] = set()
        self._unsure = False  # lines went by unseen (a pass-through): see assume_tracebacks
        self._seen: set[int] = set()  # while unsure: the ranks seen since

    def feed(self, rank: int | None, line: bytes, now: float) -> bytes:
        """Take one whole line (as the splitter gives it) read at `now`; return what to write now."""
        return self.feed_lines(((rank, line),), now)

    def feed_lines(self, lines: Iterable[tuple[int | None, bytes]], now: float) -> bytes:
        """`feed` for all the lines of one read (what `LineSplitter.feed` returns): one call, one write."""
        out: list[bytes] = []
        order = self._order
        if order and (order[0].shown or order[0].deadline <= now):
            self._show_due(now, out)
        open_groups, waiting_of, in_traceback = self._open, self._waiting, self._in_traceback
        deadline = now + self.window
        unsure, seen = self._unsure, self._seen
        for rank, line in lines:  # the hot loop: locals only, one lookup per step
            if unsure and rank not in seen and rank is not None:
                seen.add(rank)
                in_traceback.add(rank)
                unsure = self._unsure = len(seen) < self.ranks
            start = line.find(b"] ", 6) + 2 if rank is not None and line.startswith(b"[rank=") else 1
            if rank is None or start == 1:  # not a rank's prefixed line: nothing to fold it with
                if rank is not None:
                    self._show_waiting(rank, out)
                out.append(line)
                continue
            text = line[start:]
            maybe_not = rank in in_traceback or text.endswith(b"\r") or _TRACEBACK in text  # the cheap test first
            if maybe_not and not self._foldable(rank, text):
                self._show_waiting(rank, out)
                out.append(line)
                continue
            waiting = waiting_of.get(rank)
            if waiting is None:
                waiting = waiting_of[rank] = collections.deque()
            group = open_groups.get(text)
            if group is None or (waiting and waiting[-1].number >= group.number):
                group = open_groups[text] = _Group(self._made, text, deadline, {})
                self._made += 1
                order.append(group)
            group.lines[rank] = line
            waiting.append(group)
            if len(group.lines) >= self.ranks:
                self._show(group, out)
        return b"".join(out)

    def flush(self, now: float) -> bytes:
        """Show the groups whose window has ended by `now` (call it at `next_deadline`)."""
        out: list[bytes] = []
        self._show_due(now, out)
        return b"".join(out)

    def _show_due(self, now: float, out: list[bytes]) -> None:
        order = self._order
        while order and (order[0].shown or order[0].deadline <= now):
            group = order.popleft()
            if not group.shown:
                self._show(group, out)

    def flush_all(self) -> bytes:
        """At the end of the job: everything still waiting, in order."""
        out: list[bytes] = []
        while self._order:
            group = self._order.popleft()
            if not group.shown:
                self._show(group, out)
        return b"".join(out)

    def next_deadline(self) -> float | None:
        """When `flush` must next be called (None: nothing waits)."""
        while self._order and self._order[0].shown:
            self._order.popleft()
        return self._order[0].deadline if self._order else None

    def assume_tracebacks(self) -> None:
        """Lines went by unseen (a pass-through): each rank may be inside a traceback, so its lines
        are not folded until one that cannot be (one not indented, also left unfolded)."""
        self._unsure, self._seen = True, set()

    def _foldable(self, rank: int, text: bytes) -> bool:
        """False for a progress line and for the lines of a traceback (which this also tracks)."""
        if text.endswith(b"\r"):
            return False
        if text.lstrip(b" \t").startswith(_TRACEBACK_STARTS):
            self._in_traceback.add(rank)
            return False
        if rank in self._in_traceback:
            if text[:1] not in (b" ", b"\t", b"\r", b"\n"):
                self._in_traceback.discard(rank)  # the exception line ends it, and is part of it
            return False
        return True

    def _show_waiting(self, rank: int, out: list[bytes]) -> None:
        waiting = self._waiting.get(rank)
        while waiting:
            self._show(waiting[0], out)

    def _show(self, group: _Group, out: list[bytes]) -> None:
        """Append `group` to `out`, after the older groups any of its ranks still waits in.

        A stack, not recursion: each group pushed is older than the one under it, so it ends."""
        waiting = self._waiting
        if len(group.lines) == 1:  # the usual case: a line no other rank printed
            rank, line = next(iter(group.lines.items()))
            if waiting[rank][0] is group:
                waiting[rank].popleft()
                group.shown = True
                if self._open.get(group.text) is group:
                    del self._open[group.text]
                out.append(line)
                return
        stack = [group]
        while stack:
            top = stack[-1]
            for rank in top.lines:
                head = waiting[rank][0]
                if head is not top:
                    stack.append(head)
                    break
            else:
                stack.pop()
                for rank in top.lines:
                    waiting[rank].popleft()
                top.shown = True
                if self._open.get(top.text) is top:
                    del self._open[top.text]
                if len(top.lines) == 1:
                    out.append(next(iter(top.lines.values())))
                else:
                    out.append(folded_prefix(tuple(sorted(top.lines))) + top.text)


class RateGate:
    """Is the console's line rate over `limit` lines a second? Counted in one-second buckets from
    the first line after a quiet second: over as soon as a bucket's count passes the limit, and for
    the whole of the next bucket; a burst shorter than the limit does not count as a flood."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.bucket_end = float("-inf")
        self.count = 0
        self.over = False  # the last bucket was over the limit

    def over_limit(self, now: float, lines: int) -> bool:
        if now >= self.bucket_end:
            self.over = self.count > self.limit and now < self.bucket_end + 1.0  # the bucket just before
            self.bucket_end, self.count = now + 1.0, 0
        self.count += lines
        return self.over or self.count > self.limit


class ConsoleFolder:
    """What the console shows for what is read from the wrappers' pipe: whole lines, folded.

    While the ranks print more than `rate` lines a second each (`RateGate`), nobody can read the
    console and folding would only cost CPU (a few microseconds a line): the reads then go out as
    they came, after every line still waiting (so no rank's lines are reordered). Folding starts
    again at the first read after a second under the rate that begins a line (the wrappers write
    whole lines, so a read nearly always does)."""

    def __init__(self, ranks: int, window: float = DEFAULT_WINDOW, rate: float = PASS_THROUGH_RATE) -> None:
        self.splitter = LineSplitter()
        self.folder = LineFolder(ranks, window)
        self.gate = RateGate(rate * max(ranks, 1))
        self.passing = False
        self.line_ended = True  # the last read passed through ended with a line end

    def feed(self, data: bytes, now: float) -> bytes:
        """Take one read of the pipe at `now`; return what to write now."""
        if not data:
            return b""
        flooding = self.gate.over_limit(now, data.count(b"\n"))
        if self.passing and (flooding or not self.line_ended):
            self.line_ended = data[-1:] in (b"\n", b"\r")
            return data
        if flooding:  # a flood begins: everything waiting first, then the reads as they come
            self.passing, self.line_ended = True, data[-1:] in (b"\n", b"\r")
            head = b""
            if self.splitter.after_cr is not None and data.startswith(b"\n") and not self.splitter.pending:
                head, data = b"\n", data[1:]  # the end of the "\r\n" just shown: it stays with its line
            return head + self.folder.flush_all() + b"".join(line for _, line in self.splitter.flush()) + data
        if self.passing:
            self.passing = False
            self.folder.assume_tracebacks()
        return self.folder.feed_lines(self.splitter.feed(data), now)

    def flush(self, now: float) -> bytes:
        """The lines whose window has ended by `now` (call it at `next_deadline`)."""
        return self.folder.flush(now)

    def next_deadline(self) -> float | None:
        return self.folder.next_deadline()

    def close(self, now: float) -> bytes:
        """At the end of the stream: everything left, in order."""
        return self.folder.feed_lines(self.splitter.flush(), now) + self.folder.flush_all()
