"""The end-of-job report printed on stderr: the root cause, its explaining lines, every rank's end,
and, for a job of several attempts, each attempt's end and what followed it."""

from __future__ import annotations

import signal
from collections.abc import Sequence

import detlaunch.native_errors as native_errors
import detlaunch.tracebacks as tracebacks
from detlaunch.outcome import AttemptEnd, Failure, FailureKind, JobResult, RankStatus, signal_name
from detlaunch.rank import protocol as rank_protocol

NO_STDERR = "(nothing on stderr)"
CUT = "Traceback (most recent call last): (its first lines are cut)"


def explaining_lines(tail: Sequence[str], limit: int = rank_protocol.SHOWN_LINES) -> tuple[str, ...]:
    """The lines of a rank's stderr tail that explain its exit, for the report.

    The last Python traceback (tracebacks.py), from its first line through its exception line, if
    there is one: what a library warned about after it is noise. Else, a rank a C++ exception ended
    (torch's NCCL watchdog, a CUDA error), the `terminate called` line, its what() and where it was
    raised, without the C++ frames. Else the last `limit` lines; else a note that the rank wrote
    nothing. A traceback whose first lines fell out of the tail starts at its first frame left, marked
    as cut. Progress bars (\r) count as lines.
    """
    lines = tracebacks.split_lines(tail)
    if not lines:
        return (NO_STDERR,)
    tb = tracebacks.last_traceback(lines)
    if tb is None:
        native = native_errors.explaining_lines(lines)  # a C++ abort: what() says why, its frames do not
        return tuple(native[:limit] if native else lines[-limit:])
    picked = [CUT, *tb.lines] if tb.cut else list(tb.lines)
    return tuple(picked if len(picked) <= limit else [picked[0], "...", *picked[-(limit - 2):]])


def format_report(result: JobResult) -> list[str]:
    """The end-of-job report: a line per rank, and for a failure the root cause with its stderr."""
    lines = []
    if result.ok:
        where = "" if result.node_rank == 0 else f" on node {result.node_rank}"
        lines.append(f"detlaunch: job finished: {len(result.ranks)} rank(s){where} exited 0 "
                     f"in {result.duration:.2f} s")
        lines.extend(f"detlaunch:   rank {r.rank} (node {r.node_rank}): {r.describe()}"
                     for r in result.ranks if r.teardown_signal)  # a crash in Python's teardown, counted as finished
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
    marked, whenever it came, unless what it printed says its collective failed because a peer or the
    network did (a NCCL timeout or network error, gloo's lost peer: native_errors.INFRASTRUCTURE): the
    usual NCCL picture, every survivor aborting after the rank that failed first."""
    if failure and failure.rank and failure.rank.rank == r.rank:
        return " (root cause)"
    if r.stopped and not r.killed:
        return " (stopped by detlaunch)"
    if failure and failure.rank and r.failed and not r.killed and not r.lost and r.wall >= failure.at > 0:
        native = native_errors.of_tail(r.tail)
        if native and native.kind in native_errors.INFRASTRUCTURE:
            verb = "aborted" if r.signal == signal.SIGABRT else "failed"
            return f" ({verb} after rank {failure.rank.rank} failed: {native.kind})"
    if failure and r.signal in STOPPING_SIGNALS and not r.killed and not r.lost and r.wall >= failure.at > 0:
        return " (after the root cause)"
    return ""


def format_warnings(result: JobResult) -> list[str]:
    """What went wrong without stopping the job: every rank's incomplete log, the launchers' too."""
    problems = [*result.warnings, *(r.log_error for r in sorted(result.ranks, key=lambda r: r.rank) if r.log_error)]
    return [f"detlaunch: warning: {p}" for p in problems]


def format_attempts(history: Sequence[AttemptEnd], why: str | None) -> list[str]:
    """The report's lines for a job of several attempts: each one's root cause, and why the next
    started or why none did (`why`: the restart policy's decision after the last).

    Printed before the last attempt's own report (format_report), which ends with the job's exit
    code: the last attempt's root cause's, history[-1].exit_code.
    """
    lines = [f"detlaunch: {len(history)} attempt(s):"]
    for n, end in enumerate(history):
        took = f" after {end.ended_at - end.started_at:.1f} s" if end.ended_at > end.started_at else ""
        if end.restart_class is None:
            lines.append(f"detlaunch:   attempt {end.attempt}: finished{took} (exit 0)")
            continue
        cause = f"{end.what} ({end.cause})" if end.what and end.exception else end.what or end.cause
        lines.append(f"detlaunch:   attempt {end.attempt}: {end.restart_class.value}{took}: {cause}")
        if n + 1 < len(history):
            nxt = history[n + 1]
            gap = f" {nxt.started_at - end.ended_at:.1f} s later" if nxt.started_at > end.ended_at else ""
            lines.append(f"detlaunch:     -> attempt {nxt.attempt} started{gap}")
        elif why is not None:
            lines.append(f"detlaunch:     -> {why}")
    return lines
