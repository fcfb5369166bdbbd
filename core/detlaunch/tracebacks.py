"""Python tracebacks in a rank's stderr tail: the last one, and the exception line that ends it.

The one reader of a tail's tracebacks, so that the end report (the lines that explain a rank's
exit: observe/report.py), the restart policy (is the exception a user error?) and the crash-loop
breaker (the same exception line again?: restarts/classify.py) read the same exception from the
same tail. It reads:

- Python's own tracebacks; of chained ones, the last ("Traceback (most recent call last):");
- exception groups, indented throughout ("  + Exception Group Traceback ...", "  | ExceptionGroup: ...");
- torch.distributed's "[rankN]: " prefix on every line (once a process group exists);
- a traceback whose header fell out of the tail: it starts at its first frame left, marked cut;
- output printed after it (warnings at exit), and ``\\r`` progress bars (each part is a line).

Two streaming checks stay where they run, on bytes, and only look for the header: the rank
wrapper's "has a traceback ended?" (rank/protocol.ends_traceback: ``python -S``, no ``re``) and
the console's folding, which leaves a traceback's lines unfolded (observe/dedupe.py).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from detlaunch.rank import protocol as rank_protocol

HEADER = rank_protocol.TRACEBACK_HEADER.decode()  # "Traceback (most recent call last):"
GROUP_HEADER = "+ Exception Group " + HEADER  # indented by the group's margin
_START = re.compile(r"^(\s*\+ )?(?:Exception Group )?" + re.escape(HEADER))
_FRAME = re.compile(r'^\s+File "')
# An exception line, as a traceback's last line prints it: "ValueError: boom", "torch.OutOfMemoryError: ...".
_EXCEPTION_LINE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?::\s?(.*))?$")
# torch.distributed's excepthook prefixes every traceback line with "[rankN]: " once a process group exists.
_TORCH_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")


@dataclasses.dataclass(frozen=True)
class Traceback:
    """The last traceback of a tail.

    lines: as printed (prefixes kept), from its header (or, cut, its first frame left) through its
    exception line (an exception group: through its last indented line). exception: that line,
    without torch's prefix or a group's margin ("ValueError: boom"); "" when the tail ends before it.
    """

    lines: tuple[str, ...]
    exception: str
    cut: bool = False

    @property
    def exception_name(self) -> str:
        """The class the exception line names: "ModuleNotFoundError: No module named 'x'" -> "ModuleNotFoundError"."""
        m = _EXCEPTION_LINE.match(self.exception)
        return m.group(1) if m and self.exception else ""


def split_lines(tail: Iterable[str]) -> list[str]:
    """The tail's non-blank lines; ``\\r`` ends a line too (progress bars)."""
    return [part for line in tail for part in line.replace("\r", "\n").split("\n") if part.strip()]


def last_traceback(tail: Iterable[str]) -> Traceback | None:
    """The last Python traceback in `tail` (a rank's last stderr lines), or None if it has none."""
    raw = split_lines(tail)
    text = [_TORCH_RANK_PREFIX.sub("", line) for line in raw]
    starts = [(i, m) for i, m in enumerate(map(_START.match, text)) if m]
    if starts:
        start, m = starts[-1]
        if m.group(1):
            return _group(raw, text, start, margin=m.group(1)[: m.group(1).index("+")])
        end, line = _exception_after(text, start)
        return Traceback(tuple(raw[start : (len(raw) if end is None else end + 1)]), line)
    first = next((i for i, line in enumerate(text) if _FRAME.match(line)), None)
    if first is None:
        return None
    end, line = _exception_after(text, first)
    if end is None:
        return None  # frames without an exception line: not a traceback after all
    return Traceback(tuple(raw[first : end + 1]), line, cut=True)


def _exception_after(text: list[str], start: int) -> tuple[int | None, str]:
    """The first line after `start` that is not indented (frames and source lines are) and reads as
    an exception line: its index and text, or (None, "")."""
    for i in range(start + 1, len(text)):
        line = text[i].rstrip()
        if not line[:1].isspace() and _EXCEPTION_LINE.match(line):
            return i, line
    return None, ""


def _group(raw: list[str], text: list[str], start: int, margin: str) -> Traceback:
    """An exception group: every line is indented (its own start with `margin` + "| "), so it ends
    before the first line that is not; its exception line is the group's own, not a sub-exception's."""
    end, exception = start, ""
    for i in range(start + 1, len(text)):
        line = text[i]
        if not line[:1].isspace() and not line.startswith("+"):
            break
        end = i
        body = line[len(margin) + 2 :].rstrip() if line.startswith(margin + "| ") else ""
        if not exception and body[:1].strip() and _EXCEPTION_LINE.match(body):
            exception = body
    return Traceback(tuple(raw[start : end + 1]), exception)
