"""The end-of-job report printed on stderr: the root cause, its explaining lines, every rank's end."""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence

from detlaunch.outcome import Failure, FailureKind, JobResult, RankStatus, signal_name
from detlaunch.rank import protocol as rank_protocol

TRACEBACK = re.compile(r"^(?:\s*\+ )?(?:Exception Group )?Traceback \(most recent call last\):")
FRAME = re.compile(r"^\s+File \"")
NO_STDERR = "(nothing on stderr)"


def explaining_lines(tail: Sequence[str], limit: int = rank_protocol.SHOWN_LINES) -> tuple[str, ...]:
    """The lines of a rank's stderr tail that explain its exit, for the report.

    The last Python traceback, from its first line through the exception line, if there is
    one: what a library warned about after it is noise. Else the last `limit` lines; else a
    note that the rank wrote nothing. A traceback whose first lines fell out of the tail
    starts at its first frame left, marked as cut. Progress bars (\r) count as lines.
    """
    lines = [part for line in tail for part in line.replace("\r", "\n").split("\n") if part.strip()]
    if not lines:
        return (NO_STDERR,)
    start = next((i for i in range(len(lines) - 1, -1, -1) if TRACEBACK.match(lines[i])), None)
    header: list[str] = []
    if start is None:
        start = next((i for i, line in enumerate(lines) if FRAME.match(line)), None)
        header = ["Traceback (most recent call last): (its first lines are cut)"]
    if start is None:
        return tuple(lines[-limit:])
    # The exception line is the first one not indented after the frames; an exception group's
    # traceback is indented throughout, so it ends before the first line that is not.
    group = not header and lines[start][:1].isspace()
    end = next((i - group for i in range(start + 1, len(lines)) if not lines[i][:1].isspace()
                and not lines[i].startswith("+")), len(lines) - 1)
    if header and end == len(lines) - 1 and lines[end][:1].isspace():
        return tuple(lines[-limit:])  # frames without an exception line: not a traceback after all
    picked = [*header, *lines[start : end + 1]]
    return tuple(picked if len(picked) <= limit else [picked[0], "...", *picked[-(limit - 2):]])


def format_report(result: JobResult) -> list[str]:
    """The end-of-job report: a line per rank, and for a failure the root cause with its stderr."""
    lines = []
    if result.ok:
        where = "" if result.node_rank == 0 else f" on node {result.node_rank}"
        lines.append(f"detlaunch: job finished: {len(result.ranks)} rank(s){where} exited 0 "
                     f"in {result.duration:.2f} s")
        return lines
    if result.failure:
        lines.append(f"detlaunch: job failed: {result.failure.what}")
        f = result.failure
        if f.rank and not f.rank.lost:  # a lost rank's wrapper sent no tail: say nothing of its stderr
            lines.append(f"detlaunch: last stderr lines of {f.tail_of}:")
            lines.extend(f"detlaunch:   | {line}" for line in explaining_lines(f.tail))
        elif f.kind is FailureKind.HANG:
            lines.append("detlaunch: every rank's stack when the job hung:")
            lines.extend(f"detlaunch:   {line}" for line in f.tail)
        elif f.tail:
            lines.append(f"detlaunch: last output lines of {f.tail_of}:")
            lines.extend(f"detlaunch:   | {line}" for line in f.tail)
        if result.stacks:
            lines.append("detlaunch: the running ranks' stacks before they were stopped:")
            lines.extend(f"detlaunch:   {line}" for line in result.stacks)
    elif result.interrupted_by:
        lines.append(f"detlaunch: job interrupted by {signal_name(result.interrupted_by)}")
    for r in sorted(result.ranks, key=lambda r: r.rank):
        lines.append(f"detlaunch:   rank {r.rank} (node {r.node_rank}): {r.describe()}{rank_note(r, result.failure)}")
    lines.append(f"detlaunch: exit code {result.exit_code}")
    return lines


STOPPING_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL})


def rank_note(r: RankStatus, failure: Failure | None) -> str:
    """Why a rank's line is not a cause of its own: detlaunch stopped it, or a stopping signal from
    elsewhere (its launcher, stopping its other ranks: horovodrun does, as soon as one of them fails)
    ended it after the root cause had already happened. A crash of its own (SIGSEGV, SIGABRT) is not
    marked, whenever it came."""
    if failure and failure.rank and failure.rank.rank == r.rank:
        return " (root cause)"
    if r.stopped and not r.killed:
        return " (stopped by detlaunch)"
    if failure and r.signal in STOPPING_SIGNALS and not r.killed and not r.lost and r.wall >= failure.at > 0:
        return " (after the root cause)"
    return ""


def format_warnings(result: JobResult) -> list[str]:
    """What went wrong without stopping the job: every rank's incomplete log, the launchers' too."""
    problems = [*result.warnings, *(r.log_error for r in sorted(result.ranks, key=lambda r: r.rank) if r.log_error)]
    return [f"detlaunch: warning: {p}" for p in problems]
