"""Console de-duplication: folds what several ranks print alike, loses nothing, reorders nothing,
delays nothing beyond the window, and never folds tracebacks, progress lines or one rank's line."""

from __future__ import annotations

import re

from detlaunch.observe.dedupe import ConsoleFolder, LineFolder, LineSplitter, RateGate, parse_rank
from hypothesis import given, settings
from hypothesis import strategies as st

W = 0.2


def line(rank: int, text: str) -> bytes:
    return f"[rank={rank}] {text}".encode()


def test_a_line_every_rank_prints_is_one_line_at_once() -> None:
    f = LineFolder(ranks=4, window=W)
    assert [f.feed(r, line(r, "warning: x\n"), 0.0) for r in (2, 0, 3)] == [b"", b"", b""]
    assert f.feed(1, line(1, "warning: x\n"), 0.01) == b"[ranks=0-3] warning: x\n"
    assert f.next_deadline() is None and f.flush_all() == b""


def test_a_line_some_ranks_print_is_folded_when_the_window_ends() -> None:
    f = LineFolder(ranks=8, window=W)
    for r in (0, 1, 2, 5):
        assert f.feed(r, line(r, "loading\n"), 0.05 * r / 5) == b""
    assert f.next_deadline() == W
    assert f.flush(W - 0.001) == b""
    assert f.flush(W) == b"[ranks=0-2,5] loading\n"


def test_a_line_only_one_rank_printed_keeps_its_prefix_byte_for_byte() -> None:
    f = LineFolder(ranks=2, window=W)
    assert f.feed(1, b"[rank=1] \xff odd bytes\r\n", 0.0) == b""
    assert f.flush(W) == b"[rank=1] \xff odd bytes\r\n"


def test_a_traceback_is_never_folded_nor_delayed() -> None:
    tb = ["Traceback (most recent call last):\n", '  File "t.py", line 1, in <module>\n', "    boom()\n",
          "RuntimeError: boom\n"]
    f = LineFolder(ranks=2, window=W)
    out = b""
    for text in tb:
        for r in (0, 1):
            out += f.feed(r, line(r, text), 0.0)
    assert out == b"".join(line(r, text) for text in tb for r in (0, 1))
    assert f.feed(0, line(0, "after\n"), 0.0) + f.feed(1, line(1, "after\n"), 0.0) == b"[ranks=0-1] after\n"


def test_a_traceback_shows_the_ranks_waiting_lines_first() -> None:
    f = LineFolder(ranks=2, window=W)
    assert f.feed(0, line(0, "step 1\n"), 0.0) == b""
    assert f.feed(0, line(0, "Traceback (most recent call last):\n"), 0.1) == (
        line(0, "step 1\n") + line(0, "Traceback (most recent call last):\n"))


def test_a_progress_line_is_never_folded_nor_delayed() -> None:
    f = LineFolder(ranks=2, window=W)
    assert f.feed(0, line(0, " 50%\r"), 0.0) == line(0, " 50%\r")
    assert f.feed(1, line(1, " 50%\r"), 0.0) == line(1, " 50%\r")


def test_a_rank_that_repeats_a_line_is_not_folded_with_itself() -> None:
    f = LineFolder(ranks=2, window=W)
    assert f.feed(0, line(0, "x\n"), 0.0) + f.feed(0, line(0, "x\n"), 0.0) == b""
    assert f.flush(W) == line(0, "x\n") * 2


def test_lines_a_rank_printed_before_a_folded_line_come_out_before_it() -> None:
    f = LineFolder(ranks=2, window=W)
    assert f.feed(1, line(1, "mine\n"), 0.0) == b""
    assert f.feed(0, line(0, "both\n"), 0.05) == b""
    assert f.feed(1, line(1, "both\n"), 0.1) == line(1, "mine\n") + b"[ranks=0-1] both\n"


def test_ranks_that_print_two_lines_in_opposite_orders_keep_their_orders() -> None:
    f = LineFolder(ranks=3, window=W)
    out = f.feed(0, line(0, "x\n"), 0.0) + f.feed(0, line(0, "y\n"), 0.0)
    out += f.feed(1, line(1, "y\n"), 0.0) + f.feed(1, line(1, "x\n"), 0.0)
    out += f.flush(W)
    assert out == line(0, "x\n") + b"[ranks=0-1] y\n" + line(1, "x\n")


def test_a_whole_read_at_once_gives_what_its_lines_one_by_one_give() -> None:
    read = b"".join(line(r, t) for t in ("a\n", "Traceback (most recent call last):\n", "E: e\n", "b\n")
                    for r in (0, 1, 2))
    one, many = LineFolder(ranks=3, window=W), LineFolder(ranks=3, window=W)
    by_line = b"".join(one.feed(r, x, 0.0) for r, x in LineSplitter().feed(read)) + one.flush(W)
    assert many.feed_lines(LineSplitter().feed(read), 0.0) + many.flush(W) == by_line
    assert by_line.startswith(b"[ranks=0-2] a\n[rank=0] Traceback") and by_line.endswith(b"[ranks=0-2] b\n")


def test_an_unprefixed_line_passes_through_at_once() -> None:
    f = LineFolder(ranks=2, window=W)
    assert f.feed(None, b"torchrun says hi\n", 0.0) == b"torchrun says hi\n"


def test_parse_rank() -> None:
    assert parse_rank(b"[rank=12] hi\n") == (12, 10)
    assert parse_rank(b"[rank=x] hi\n") is None and parse_rank(b"hi [rank=1] \n") is None


def test_the_splitter_gives_whole_lines_across_reads() -> None:
    s = LineSplitter()
    assert s.feed(b"[rank=0] a\n[rank=1] b") == [(0, b"[rank=0] a\n")]
    assert s.feed(b"c\n[rank=1] 10%\r") == [(1, b"[rank=1] bc\n"), (1, b"[rank=1] 10%\r")]
    assert s.feed(b"\n[rank=2] x\r\n") == [(1, b"\n"), (2, b"[rank=2] x\r\n")]
    assert s.feed(b"tail") == [] and s.flush() == [(None, b"tail")]


TEXTS = ["a\n", "b\n", "a\n", "c\r\n", "loss 1\n", " 10%\r", "Traceback (most recent call last):\n",
         '  File "x.py", line 3\n', "ValueError: v\n", "\n"]
EVENTS = st.lists(st.tuples(st.integers(0, 4), st.sampled_from(TEXTS), st.floats(0, 0.3)), max_size=80)
OUT_PREFIX = re.compile(rb"\[(?:rank=(\d+)|ranks=([\d,-]+))\] ")


def expand(ranks: bytes) -> list[int]:
    out: list[int] = []
    for part in ranks.decode().split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


@settings(max_examples=200, deadline=None)
@given(events=EVENTS, nranks=st.integers(1, 5), window=st.sampled_from([0.05, 0.2, 1.0]))
def test_any_interleaving_loses_nothing_reorders_nothing_and_delays_nothing(
        events: list[tuple[int, str, float]], nranks: int, window: float) -> None:
    f = LineFolder(ranks=nranks, window=window)
    sent: dict[int, list[tuple[bytes, float]]] = {r: [] for r in range(nranks)}
    unfoldable: dict[int, list[bool]] = {r: [] for r in range(nranks)}  # \r lines and traceback lines
    in_traceback: set[int] = set()
    shown: list[tuple[bytes, float]] = []  # (bytes written, when)
    now = 0.0

    def run_timer(until: float) -> None:
        while (due := f.next_deadline()) is not None and due <= until:
            shown.append((f.flush(due), due))

    for rank, text, gap in events:
        rank %= nranks
        now += gap
        run_timer(now)
        sent[rank].append((text.encode(), now))
        starts = text.startswith("Traceback")
        unfoldable[rank].append(text.endswith("\r") or starts or rank in in_traceback)
        if starts or (rank in in_traceback and text[0].isspace()):
            in_traceback.add(rank)
        else:
            in_traceback.discard(rank)
        shown.append((f.feed(rank, line(rank, text), now), now))
    run_timer(float("inf"))
    assert f.flush_all() == b""

    got: dict[int, list[tuple[bytes, float]]] = {r: [] for r in range(nranks)}
    folded: dict[int, list[bool]] = {r: [] for r in range(nranks)}
    for data, when in shown:
        for _, out_line in LineSplitter().feed(data):
            m = OUT_PREFIX.match(out_line)
            assert m, out_line
            text = out_line[m.end():]
            ranks = [int(m.group(1))] if m.group(1) else expand(m.group(2))
            if m.group(2):
                assert len(ranks) >= 2, "a folded line stands for at least two ranks"
            for r in ranks:
                got[r].append((text, when))
                folded[r].append(bool(m.group(2)))
    for r in range(nranks):
        assert [t for t, _ in got[r]] == [t for t, _ in sent[r]], f"rank {r}: lines lost, added or reordered"
        for (_, at), (_, came) in zip(got[r], sent[r], strict=True):
            assert came <= at <= came + window + 1e-9, f"rank {r}: a line waited {at - came:.3f} s"
        assert not any(u and fo for u, fo in zip(unfoldable[r], folded[r], strict=True)), "folded a traceback or \\r"


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(TEXTS)), max_size=30), data=st.data())
def test_the_splitter_gives_back_every_byte_in_lines_whatever_the_reads(
        lines: list[tuple[int, str]], data: st.DataObject) -> None:
    stream = b"".join(line(r, t) for r, t in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    s = LineSplitter()
    out = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        out += s.feed(stream[a:b])
    out += s.flush()
    assert b"".join(x for _, x in out) == stream
    merged: list[tuple[int | None, bytes]] = []
    for r, x in out:
        if x == b"\n" and merged and merged[-1][1].endswith(b"\r") and r == merged[-1][0]:
            merged[-1] = (r, merged[-1][1] + x)  # a "\r\n" the reads cut in two
        else:
            merged.append((r, x))
    assert merged == [(r, line(r, t)) for r, t in lines]


# -- the flood: above PASS_THROUGH_RATE the reads go out as they came ---------------------------

def flood(ranks: int, lines: int, text: str = "x {}\n") -> bytes:
    return b"".join(line(i % ranks, text.format(i)) for i in range(lines))


def test_the_gate_counts_lines_a_second_and_stays_over_for_the_next_second() -> None:
    g = RateGate(limit=10)
    assert not g.over_limit(0.0, 10) and g.over_limit(0.5, 1)  # 11 lines within a second
    assert g.over_limit(1.2, 0) and g.over_limit(2.1, 0)  # the second after an over one is over too
    assert not g.over_limit(3.2, 5)  # the second from 2.1 had no line: quiet again
    g = RateGate(limit=10)
    assert not g.over_limit(0.0, 9) and not g.over_limit(5.0, 9)  # a burst under the limit is no flood


def test_a_flood_goes_out_as_read_after_every_line_waiting() -> None:
    c = ConsoleFolder(ranks=2, window=W, rate=10)  # 20 lines a second for the node
    assert c.feed(line(0, "waits\n") + line(1, "partial"), 0.0) == b""
    read = b" line\n" + flood(2, 30)
    assert c.feed(read, 0.01) == line(0, "waits\n") + line(1, "partial") + read
    assert c.next_deadline() is None and c.flush(1.0) == b""
    more = flood(2, 5) + line(0, "cut")
    assert c.feed(more, 0.5) == more  # as it came, even a line cut by the read


def test_folding_starts_again_after_a_second_under_the_rate() -> None:
    c = ConsoleFolder(ranks=2, window=W, rate=10)
    c.feed(flood(2, 30), 0.0)
    assert c.feed(line(0, "a\n"), 1.5) == line(0, "a\n")  # the second after a flood still passes
    out = c.feed(line(0, "b\n") + line(1, "b\n"), 3.0)
    assert out == line(0, "b\n") + line(1, "b\n")  # first lines after it: maybe in a traceback, shown as is
    assert c.feed(line(0, "c\n") + line(1, "c\n"), 3.1) == b"[ranks=0-1] c\n"


def test_a_read_that_ends_inside_a_line_keeps_passing_until_a_read_starts_a_line() -> None:
    c = ConsoleFolder(ranks=2, window=W, rate=10)
    c.feed(flood(2, 30) + line(0, "cut "), 0.0)
    assert c.feed(b"here\n", 3.0) == b"here\n"  # the end of that line, not a line of its own
    assert c.feed(line(0, "d\n") + line(1, "d\n"), 3.1) == line(0, "d\n") + line(1, "d\n")
    assert c.feed(line(0, "e\n") + line(1, "e\n"), 3.2) == b"[ranks=0-1] e\n"


def test_a_flood_that_begins_inside_a_cut_crlf_keeps_the_lf_with_its_line() -> None:
    c = ConsoleFolder(ranks=2, window=W, rate=10)
    assert c.feed(line(1, "waits\n") + line(0, "10%\r"), 0.0) == line(0, "10%\r")  # the read ends inside "\r\n"
    read = b"\n" + flood(2, 30)
    assert c.feed(read, 0.0) == b"\n" + line(1, "waits\n") + flood(2, 30)  # not between "\r" and its "\n"


def test_a_traceback_a_flood_began_is_not_folded_after_it() -> None:
    c = ConsoleFolder(ranks=2, window=W, rate=10)
    tb = "Traceback (most recent call last):\n"
    c.feed(flood(2, 30) + line(0, tb) + line(1, tb), 0.0)
    frame = '  File "x.py", line 3\n'
    out = c.feed(line(0, frame) + line(1, frame) + line(0, "E: e\n") + line(1, "E: e\n"), 3.0)
    assert out == line(0, frame) + line(1, frame) + line(0, "E: e\n") + line(1, "E: e\n")
    assert c.feed(line(0, "ok\n") + line(1, "ok\n"), 3.1) == b"[ranks=0-1] ok\n"


READS = st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(TEXTS)), min_size=1, max_size=12),
                           st.floats(0, 0.6)), max_size=40)


def when_whole(chunks: list[tuple[bytes, float]]) -> tuple[bytes, list[float]]:
    """The bytes of `chunks` joined, and for each byte the time of the chunk that brought it."""
    times: list[float] = []
    for chunk, at in chunks:
        times += [at] * len(chunk)
    return b"".join(chunk for chunk, _ in chunks), times


@settings(max_examples=200, deadline=None)
@given(reads=READS, rate=st.sampled_from([2, 5, 1000]), data=st.data())
def test_with_floods_any_reads_lose_nothing_reorder_nothing_and_delay_nothing(
        reads: list[tuple[list[tuple[int, str]], float]], rate: int, data: st.DataObject) -> None:
    """Reads of several ranks' lines (cut anywhere, inside a line too), some fast enough to pass
    through: each rank's lines come out whole, in order, no later than the window after the read
    that completed them, and no traceback or progress line is ever folded."""
    c = ConsoleFolder(ranks=4, window=W, rate=rate)
    sent: list[tuple[int, str]] = []
    stream, ends, now = b"", [], 0.0
    for lines, gap in reads:
        now += gap
        sent += lines
        stream += b"".join(line(r, t) for r, t in lines)
        ends.append((len(stream), now))
    fed: list[tuple[bytes, float]] = []
    shown: list[tuple[bytes, float]] = []
    start = 0
    for i, (end, at) in enumerate([*ends, (len(stream), now)]):  # each read: some of what was written by then
        cut = data.draw(st.integers(start, end)) if i < len(ends) else end
        while (due := c.next_deadline()) is not None and due <= at:
            shown.append((c.flush(due), due))
        fed.append((stream[start:cut], at))
        shown.append((c.feed(stream[start:cut], at), at))
        start = cut
    while (due := c.next_deadline()) is not None:
        shown.append((c.flush(due), due))
    assert c.close(now) == b""

    expected: dict[int, list[tuple[bytes, float, bool]]] = {r: [] for r in range(4)}  # text, read at, unfoldable
    in_traceback: set[int] = set()
    _, read_at = when_whole(fed)
    offset = 0
    for rank, text in sent:
        offset += len(line(rank, text))
        starts = text.startswith("Traceback")
        unfoldable = text.endswith("\r") or starts or rank in in_traceback
        expected[rank].append((text.encode(), read_at[offset - 1], unfoldable))
        if starts or (rank in in_traceback and text[0].isspace()):
            in_traceback.add(rank)
        else:
            in_traceback.discard(rank)

    out_stream, shown_at = when_whole(shown)
    got: dict[int, list[tuple[bytes, float, bool]]] = {r: [] for r in range(4)}  # text, shown at, folded
    offset, last = 0, -1
    for _, out_line in LineSplitter().feed(out_stream) + LineSplitter().flush():
        offset += len(out_line)
        m = OUT_PREFIX.match(out_line)
        if not m:  # the "\n" of a "\r\n" a read cut in two: the rank of the last "\r" line shown
            assert out_line == b"\n" and last >= 0, out_line
            got[last].append((b"\n", shown_at[offset - 1], False))
            continue
        ranks = [int(m.group(1))] if m.group(1) else expand(m.group(2))
        for r in ranks:
            got[r].append((out_line[m.end():], shown_at[offset - 1], bool(m.group(2))))
        if out_line.endswith(b"\r"):
            last = ranks[-1]
    for r in range(4):
        lost_or_reordered = f"rank {r}: lines lost, added or reordered"
        assert b"".join(t for t, _, _ in got[r]) == b"".join(t for t, _, _ in expected[r]), lost_or_reordered
        if len(got[r]) == len(expected[r]):  # (a cut "\r\n" is two lines out: then only the bytes are checked)
            for (_, at, folded), (_, came, unfoldable) in zip(got[r], expected[r], strict=True):
                assert at <= came + W + 1e-9, f"rank {r}: a line waited {at - came:.3f} s"
                assert not (folded and unfoldable), "folded a traceback or \r line"
