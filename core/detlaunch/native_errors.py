"""What the C++ side (torch's c10, NCCL, CUDA, gloo) said in a rank's stderr tail before the rank died.

A NCCL watchdog timeout and a CUDA illegal memory access both end a rank with SIGABRT, C++
frames and no Python traceback: by its end alone the one reads as the other. What tells them
apart is what libstdc++ and torch printed on the way down:

    terminate called after throwing an instance of 'c10::DistBackendError'
      what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with
               exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2415,
               OpType=ALLREDUCE, NumelIn=8192, NumelOut=8192, Timeout(ms)=600000) ran for 600058 milliseconds ...
    Exception raised from checkTimeout at .../ProcessGroupNCCL.cpp:692 (most recent call first):
    frame #0: ...

This reads that (the `what():` of the last `terminate called`, else the last line that names a known
failure), and the same failures when Python raised them (`torch.distributed.DistBackendError: NCCL
error in: ...`). `key` is the failure's identity for the crash-loop breaker: the numbers that differ
between two runs of the same failure (sequence numbers, durations, ranks, pids, addresses, ports)
blanked, the rest kept (the collective, its sizes, the error). Pure: no I/O; restarts/classify.py and
the end report (observe/report.py) read through it.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable

import detlaunch.tracebacks as tracebacks


class Kind(enum.StrEnum):
    """What failed, as the words of the report."""

    TIMEOUT = "NCCL collective timeout"  # torch's watchdog: a collective made no progress for its timeout
    PEER = "NCCL network or peer error"  # ncclRemoteError, ncclSystemError, a communicator aborted
    NCCL = "NCCL error"  # ncclUnhandledCudaError, ncclInternalError, ncclInvalidUsage/Argument
    GLOO_PEER = "gloo peer lost"  # gloo's "Connection closed by peer": the CPU picture of PEER
    CUDA = "CUDA error"  # "CUDA error: an illegal memory access was encountered", ...
    CPP = "C++ exception"  # a what() that names none of the above


# Failures a broken link, switch, GPU or peer produces as readily as code does: retried without the
# crash-loop breaker (docs/RESTARTS.md), and, after another rank's failure, its consequence.
INFRASTRUCTURE = frozenset({Kind.TIMEOUT, Kind.PEER, Kind.GLOO_PEER})
HARDWARE_CUDA = ("uncorrectable ECC error", "uncorrectable NVLink error")


@dataclasses.dataclass(frozen=True)
class NativeError:
    """kind: what failed. exception: the C++ class thrown ("c10::DistBackendError"), "" when the tail does
    not say. message: the line that says what failed, torch's prefixes taken off."""

    kind: Kind
    message: str
    exception: str = ""

    @property
    def key(self) -> str:
        """The failure's identity: the message with what differs from run to run blanked."""
        return normalise(self.message)

    @property
    def infrastructure(self) -> bool:
        return self.kind in INFRASTRUCTURE or (self.kind is Kind.CUDA and any(h in self.message for h in HARDWARE_CUDA))


_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'")
_TERMINATE_BARE = "terminate called without an active exception"
_WHAT = re.compile(r"^\s*what\(\):\s*(.*)$")
_END_OF_MESSAGE = re.compile(r"^(Exception raised from |frame #\d+: |terminate called )")
# Prefixes torch puts before a line: the rank ("[rank1]:"), glog's ("[E724 20:42:34.306638268 File.cpp:764] ",
# "E0724 20:47:36.140000 1237 path/api.py:986] ").
_PREFIX = re.compile(r"^(?:\[rank\d+\]:\s?)*(?:\[?[EWIF]\d{3,4} [\d:.]+ (?:\d+ )?\S+:\d+\]\s?)?")

_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: .*")
_CUDA = re.compile(r"CUDA error: .*")
_NCCL = re.compile(r"NCCL error(?: in: .*|: .*)")
_NCCL_NAMES = {  # ncclGetErrorString's words and getNcclErrorDetailStr's names, by the kind they make
    "remote process exited or there was a network error": Kind.PEER, "ncclRemoteError": Kind.PEER,
    "unhandled system error": Kind.PEER, "ncclSystemError": Kind.PEER,
    "NCCL communicator was aborted": Kind.PEER,
}
_NCCL_OTHER = re.compile(r"(?:ncclUnhandledCudaError|ncclInternalError|ncclInvalidUsage|ncclInvalidArgument)\b.*")
_GLOO_PEER = re.compile(r"\[[^\]]*gloo[^\]]*\] Connection (?:closed|reset) by peer.*|"
                        r"Connection (?:closed|reset) by peer \[[^\]]+\]:\d+.*")

# What differs between two runs of the same failure.
_BLANKS = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    (re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}\]?:)\d+"), r"\1?"),  # "[127.0.0.1]:14738"
    (re.compile(r"<\d+>"), "<?>"),  # NCCL's "peer 10.42.0.2<47534>"
    (re.compile(r"\b(SeqNum=|[Rr]ank |pid[ =:]?|PID |ran for |work: )\d+"), r"\1?"),
    (re.compile(r"\b(last enqueued work: |last completed work: |sequence id: )\d+"), r"\1?"),
)


def normalise(text: str) -> str:
    for pattern, blank in _BLANKS:
        text = pattern.sub(blank, text)
    return text


def strip_prefix(line: str) -> str:
    return _PREFIX.sub("", line, count=1)


def recognise(text: str) -> tuple[Kind, str] | None:
    """The failure one line names, and the part of it that says so; None for a line that names none."""
    if m := _TIMEOUT.search(text):
        return Kind.TIMEOUT, m.group(0)
    if m := _NCCL.search(text):
        kind = next((k for words, k in _NCCL_NAMES.items() if words in text), Kind.NCCL)
        return kind, m.group(0)
    for words, kind in _NCCL_NAMES.items():
        if words in text:
            return kind, text[text.index(words):]
    if m := _NCCL_OTHER.search(text):
        return Kind.NCCL, m.group(0)
    if m := _CUDA.search(text):
        return Kind.CUDA, m.group(0)
    if m := _GLOO_PEER.search(text):
        return Kind.GLOO_PEER, m.group(0)
    return None


def read(tail: Iterable[str]) -> NativeError | None:
    """What the C++ side said last in `tail` (a rank's last stderr lines), or None if it said nothing known.

    The last `terminate called ...` and its `what():` first (the exception that ended the process; a
    message of several lines, NCCL's detail lines included, is read up to its C++ frames); without one
    (it fell out of the tail, or the error was only logged), the last line that names a known failure.
    """
    lines = [strip_prefix(line) for line in tracebacks.split_lines(tail)]
    block = _terminate_block(lines)
    if block is not None:
        return _what(lines, *block)
    for line in reversed(lines):
        if found := recognise(line):
            return NativeError(found[0], found[1])
    return None


def explaining_lines(tail: Iterable[str]) -> list[str] | None:
    """The lines that say why the C++ side ended the process, as printed: the last `terminate called`,
    its what() message and where it was raised (its C++ frames left out: they are in the log); None when
    the tail has no `terminate called` with a what() (a bare one says less than the lines before it)."""
    raw = tracebacks.split_lines(tail)
    block = _terminate_block([strip_prefix(line) for line in raw])
    if block is None or block[1] == block[0] + 1:
        return None
    start, end = block
    raised = [line for line in raw[end:] if strip_prefix(line).startswith("Exception raised from ")][:1]
    return [*raw[start:end], *raised]


def _terminate_block(lines: list[str]) -> tuple[int, int] | None:
    """Where the last `terminate called` line with a what() message is in `lines` (two threads may both
    print the first line, and the process die before the second what()), else the last one: (start,
    end), end excluded (the first line after the message: its C++ frames, or the next terminate)."""
    last = None
    for at in range(len(lines) - 1, -1, -1):
        if _TERMINATE.search(lines[at]) or _TERMINATE_BARE in lines[at]:
            end = at + 1
            if end < len(lines) and _WHAT.match(lines[end]):
                end += 1
                while end < len(lines) and not _END_OF_MESSAGE.match(lines[end]):
                    end += 1
                return at, end
            last = last or (at, end)
    return last


def of_tail(tail: Iterable[str]) -> NativeError | None:
    """What failed below Python in a rank's tail: named by its last traceback's exception line (a
    DistBackendError raised in Python), or, without a traceback, by what the C++ side printed (read())."""
    tb = tracebacks.last_traceback(tail)
    if tb and tb.exception:
        found = recognise(tb.exception)
        return NativeError(found[0], tb.exception) if found else None
    return read(tail)


def _what(lines: list[str], start: int, end: int) -> NativeError:
    """The error the `terminate called` line at `start` announces, from its what() lines (up to `end`)."""
    m = _TERMINATE.search(lines[start])
    exception = m.group(1) if m else ""
    what = _WHAT.match(lines[start + 1]) if end > start + 1 else None
    block = [what.group(1), *lines[start + 2 : end]] if what else []
    for line in block:
        if found := recognise(line):
            kind, message = found
            # NCCL's detail line says more than torch's first line: "ncclRemoteError: ..." after "NCCL error: ..."
            detail = next((k for b in block for words, k in _NCCL_NAMES.items() if words in b), None)
            return NativeError(detail if kind is Kind.NCCL and detail else kind, message, exception)
    return NativeError(Kind.CPP, block[0] if block else lines[start], exception)


__all__ = ["HARDWARE_CUDA", "INFRASTRUCTURE", "Kind", "NativeError", "explaining_lines", "normalise", "of_tail", "read",
           "recognise", "strip_prefix"]
