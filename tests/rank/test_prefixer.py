"""The rank prefixer: every line prefixed, bytes unchanged, \\r ends a line, long lines split."""

from __future__ import annotations

from detlaunch.rank.output import PIPE_BUF, LinePrefixer, split_lines
from hypothesis import given, settings
from hypothesis import strategies as st

P = b"[rank=3] "


def run(chunks: list[bytes], prefix: bytes = P) -> bytes:
    p = LinePrefixer(prefix)
    return b"".join(p.feed(c) for c in chunks) + p.flush()


def test_each_line_gets_the_prefix() -> None:
    assert run([b"a\nb\n"]) == b"[rank=3] a\n[rank=3] b\n"


def test_a_line_split_across_reads_is_prefixed_once() -> None:
    assert run([b"hel", b"lo\nwor", b"ld\n"]) == b"[rank=3] hello\n[rank=3] world\n"


def test_carriage_return_ends_a_line_and_is_kept() -> None:
    assert run([b"10%\r20%\r100%\n"]) == b"[rank=3] 10%\r[rank=3] 20%\r[rank=3] 100%\n"


def test_crlf_is_one_line_end() -> None:
    assert run([b"a\r\nb\r\n"]) == b"[rank=3] a\r\n[rank=3] b\r\n"


def test_empty_lines_are_prefixed() -> None:
    assert run([b"\n\n"]) == b"[rank=3] \n[rank=3] \n"


def test_invalid_utf8_passes_through_unchanged() -> None:
    assert run([b"\xff\xfe\x00bad\n"]) == P + b"\xff\xfe\x00bad\n"


def test_a_last_line_without_newline_is_ended() -> None:
    assert run([b"no newline"]) == P + b"no newline\n"


def test_a_long_line_is_split_into_prefixed_pieces_that_fit_a_pipe_write() -> None:
    out = run([b"x" * 1_000_000 + b"\n"])
    lines = out.split(b"\n")[:-1]
    assert all(line.startswith(P) and len(line) + 1 <= PIPE_BUF for line in lines)
    assert b"".join(line[len(P):] for line in lines) == b"x" * 1_000_000


def test_a_long_line_without_newline_is_emitted_while_it_grows() -> None:
    p = LinePrefixer(P)
    emitted = p.feed(b"y" * 100_000)
    assert emitted.startswith(P) and len(p.pending) < PIPE_BUF


def test_split_lines_reports_each_terminator() -> None:
    assert list(split_lines(b"a\rb\r\nc\n\r")) == [(b"a", b"\r"), (b"b", b"\r\n"), (b"c", b"\n"), (b"", b"\r")]


def reference(data: bytes, prefix: bytes, limit: int) -> bytes:
    """A slow, obviously correct prefixer to compare against."""
    out = b""
    for body, end in split_lines(data if data.endswith((b"\n", b"\r")) or not data else data + b"\n"):
        pieces = [body[i:i + limit] for i in range(0, len(body), limit)] or [b""]
        for piece in pieces[:-1]:
            out += prefix + piece + b"\n"
        out += prefix + pieces[-1] + end
    return out


def without_crlf(data: bytes) -> bytes:
    while b"\r\n" in data:  # a CRLF split across two reads is two line ends; keep them apart
        data = data.replace(b"\r\n", b"\n")
    return data


streams = st.tuples(st.binary(max_size=2000).map(without_crlf), st.lists(st.integers(0, 2000), max_size=8))


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(streams, st.integers(min_value=0, max_value=9999))
def test_output_matches_the_reference_however_the_stream_is_read(stream: tuple[bytes, list[int]], rank: int) -> None:
    data, cuts = stream
    prefix = f"[rank={rank}] ".encode()
    p = LinePrefixer(prefix)
    p.limit = 50  # small, so that splitting is exercised
    out = b"".join(p.feed(c) for c in chunked(data, cuts)) + p.flush()
    assert out == reference(data, prefix, 50)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")), max_size=30),
       st.lists(st.sampled_from([b"\n", b"\r"]), min_size=30, max_size=30))
def test_what_goes_in_comes_out_in_order_prefixed(lines: list[bytes], ends: list[bytes]) -> None:
    data = b"".join(line + end for line, end in zip(lines, ends, strict=False))
    out = run(chunked(data, [7, 100, 101, 555]))
    assert (
        b"".join(body[len(P):] + end for body, end in split_lines(out)) == data
    )
    assert all(body.startswith(P) for body, _ in split_lines(out))
