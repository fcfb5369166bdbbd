"""The rank's output: bytes into prefixed lines, written whole, to the console and the rank's log file.

Part of the per-rank wrapper (``python -S``, stdlib only: see wrapper.py). Bytes are never decoded;
no line is ever torn: each write of a line fits in one atomic pipe write (PIPE_BUF), however
many processes write to the same console.
"""

from __future__ import annotations

import os

try:  # imported as detlaunch.rank.output
    from . import log_files
except ImportError:  # by file, from the wrapper's folder (python -S run_wrapper.py)
    import log_files  # type: ignore[no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:  # never at run time: the typing module alone costs about 1 MB
    from collections.abc import Iterator

PIPE_BUF = 4096


class LinePrefixer:
    """Turns a byte stream into prefixed lines; ``\\n``, ``\\r`` and ``\\r\\n`` end a line.

    Bytes are never decoded, so any encoding (or none) passes through unchanged.
    A line longer than the limit is emitted in pieces, each but the last ending
    with an added ``\\n``, so that every emitted line fits in one atomic pipe write.
    """

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.limit = max(PIPE_BUF - len(prefix) - 2, 16)
        self.pending = b""

    def feed(self, data: bytes) -> bytes:
        """Return the complete lines of pending + data, prefixed; keep the partial rest."""
        buf = self.pending + data if self.pending else data
        end = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
        head, rest = buf[:end], buf[end:]
        out = self._prefix(head) if head else b""
        if len(rest) > self.limit:
            cut = len(rest) - len(rest) % self.limit
            out += self._pieces(rest[:cut], b"\n")
            rest = rest[cut:]
        self.pending = rest
        return out

    def flush(self) -> bytes:
        """At end of stream: the last partial line, ended with an added newline."""
        rest, self.pending = self.pending, b""
        return self.prefix + rest + b"\n" if rest else b""

    def _prefix(self, head: bytes) -> bytes:
        prefix = self.prefix
        if b"\r" not in head:
            lines = head.split(b"\n")
            lines.pop()  # head ends with "\n": nothing after it
            if max(map(len, lines)) <= self.limit:
                return prefix + (b"\n" + prefix).join(lines) + b"\n"
            return b"".join(self._pieces(line, b"\n") for line in lines)
        return b"".join(self._pieces(body, end) for body, end in split_lines(head))

    def _pieces(self, body: bytes, end: bytes) -> bytes:
        """One line: prefixed, split into pieces of at most `limit` bytes."""
        n = self.limit
        if len(body) <= n:
            return self.prefix + body + end
        parts = [body[i:i + n] for i in range(0, len(body), n)]
        last = parts.pop()
        return b"".join(self.prefix + p + b"\n" for p in parts) + self.prefix + last + end


def split_lines(head: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Yield (body, terminator) for each line of `head`, which ends with a line end."""
    parts = head.split(b"\n")
    after_last_newline = parts.pop()
    for part in parts:
        yield from _split_cr(part, b"\n")
    yield from _split_cr(after_last_newline, b"")


def _split_cr(part: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
    subs = part.split(b"\r")
    last = subs.pop()
    if not last and subs and end:  # "...\r\n" is one line end
        last = subs.pop()
        end = b"\r" + end
    for sub in subs:
        yield sub, b"\r"
    if last or end:
        yield last, end


def write_all(fd: int, data: bytes) -> None:
    """Write whole lines in pieces of at most PIPE_BUF bytes, so no line is torn."""
    view = memoryview(data)  # pieces are views: no copy of what remains after each write
    start, size = 0, len(data)
    while start < size:
        end = start + PIPE_BUF
        if end < size:
            cut = max(data.rfind(b"\n", start, end), data.rfind(b"\r", start, end)) + 1
            end = cut or end
        else:
            end = size
        while start < end:
            start += os.write(fd, view[start:end])


class RankLog:
    """The rank's log file (--log-dir). A write that fails (a full disk) never stops the rank: the
    file is closed, the problem said at once on the console, and again in the end report."""

    def __init__(self, log_dir: str | None, rank: int, warn_fd: int) -> None:
        self.path = os.path.join(log_dir, f"rank-{rank}.log") if log_dir else ""
        self.warn_fd = warn_fd
        self.error = ""  # one line for the report, once something went wrong
        self.fd: int | None = None
        if not log_dir:
            return
        try:
            log_files.make_log_dir(log_dir)
            self.fd = log_files.open_log(self.path)
        except OSError as e:
            self.fail(f"{self.path} could not be opened: {log_files.reason(e)}")

    def write(self, data: bytes) -> None:
        if self.fd is None:
            return
        try:
            write_all(self.fd, data)
        except OSError as e:
            try:
                size = os.fstat(self.fd).st_size
            except OSError:
                size = 0
            os.close(self.fd)
            self.fd = None
            self.fail(f"{self.path} is incomplete: {os.strerror(e.errno or 0).lower()} after {size} bytes")

    def fail(self, why: str) -> None:
        self.error = why
        try:
            os.write(self.warn_fd, f"detlaunch: warning: {why}; the console has every line\n".encode())
        except OSError:
            pass


class Output:
    """Where one of the rank's streams goes: the console (maybe) and the rank's log file (maybe)."""

    def __init__(self, console_fd: int | None, log: RankLog | None) -> None:
        self.console_fd = console_fd
        self.log = log

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self.console_fd is not None:
            try:
                write_all(self.console_fd, data)
            except OSError:  # the console is gone: keep the rank running, drop this copy
                self.console_fd = None
        if self.log is not None:
            self.log.write(data)

