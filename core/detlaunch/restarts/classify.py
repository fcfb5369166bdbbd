"""What ended an attempt, as the restart policy reads it: its RestartClass and its signature.

The class is derived from the root cause's FailureKind (outcome.py): a lost node, a hang and the
user's signal are what they are, whatever their exit code; what a rank, a launcher or the start
ended with is read further, from its exit code and its last traceback line (tracebacks.py, the
reader the end report uses too):

    FailureKind                       RestartClass
    INTERRUPTED ────────────────────► INTERRUPTED
    NODE_LOST, CHIEF_LOST ──────────► NODE_LOST
    HANG ───────────────────────────► HANG
    RANK, LAUNCHER, DAEMON, START ──► NO_RESTART   the "do not restart me" exit code
                                      USER_ERROR   exit 2, or a traceback ending in one of USER_ERRORS
                                      START_FAILURE no rank ever started
                                      RANK_FAILED  else

The signature is the root cause's identity for the crash-loop breaker: how it ended and its
exception line, or, when the rank died in C++ without a Python traceback (SIGABRT from torch's NCCL
watchdog, a CUDA error), what the C++ side printed (native_errors.py). The same reading says whether
the failure is one a broken link, switch, GPU or peer produces (a NCCL timeout, a network error): those
are retried without the crash-loop breaker. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import detlaunch.exit_codes as exit_codes
import detlaunch.native_errors as native_errors
import detlaunch.tracebacks as tracebacks
from detlaunch.outcome import FailureKind, ProcessEnd, RestartClass

# Exceptions that the same code, on the same environment, raises again on every attempt: they are
# raised while compiling, importing or resolving names, before and whatever the data and the
# checkpoint. AttributeError, TypeError, KeyError, ValueError are not here: they are just as often
# raised by one bad batch, a partly-written file or a transient None, which a resumed attempt does
# not meet again; when one does repeat, the crash-loop breaker stops the job after two attempts.
# Matched by name as printed (detlaunch only sees text): subclasses are listed one by one.
USER_ERRORS = frozenset({
    "ImportError", "ModuleNotFoundError",
    "SyntaxError", "IndentationError", "TabError",
    "NameError", "UnboundLocalError",
})

# The kinds of failure whose class their exit code and traceback do not change.
FIXED = {
    FailureKind.INTERRUPTED: RestartClass.INTERRUPTED,
    FailureKind.NODE_LOST: RestartClass.NODE_LOST,
    FailureKind.CHIEF_LOST: RestartClass.NODE_LOST,
    FailureKind.HANG: RestartClass.HANG,
}

# What differs on every run of the same failure: object addresses, ephemeral ports ("[127.0.0.1]:14738").
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_PORT = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}\]?:)\d+")


def short_name(exception: str) -> str:
    """An exception class's last dotted part: "torch.OutOfMemoryError" -> "OutOfMemoryError"; a C++ class's
    last part too: "c10::DistBackendError" -> "DistBackendError" (torch.distributed.DistBackendError in Python)."""
    return exception.rsplit(".", 1)[-1].rsplit("::", 1)[-1]


def exception_of(tail: Sequence[str]) -> tuple[str, str]:
    """The exception line that ended the last traceback of `tail` and the class it names, or ("", "")."""
    tb = tracebacks.last_traceback(tail)
    return (tb.exception, tb.exception_name) if tb else ("", "")


def exception_class(tail: Sequence[str]) -> str:
    """The class that ended the rank: its last traceback's, else the C++ class it was terminated by ("")."""
    name = exception_of(tail)[1]
    if name:
        return name
    native = native_errors.read(tail)
    return native.exception if native else ""


def infrastructure(tail: Sequence[str]) -> bool:
    """Whether the failure is one infrastructure produces as readily as code (native_errors.INFRASTRUCTURE)."""
    native = native_errors.of_tail(tail)
    return native is not None and native.infrastructure


def classify(kind: FailureKind, end: ProcessEnd, tail: Sequence[str], *, started: bool,
             no_restart_exit_code: int | None = exit_codes.NO_RESTART) -> RestartClass:
    """The restart class of an attempt whose root cause is of `kind`, ended `end` (its exit code is the
    job's) and printed `tail`; started: a rank of the attempt ever registered, on any node.

    A user error is more telling than "did not start" when the launcher itself could not import.
    """
    if kind in FIXED:
        return FIXED[kind]
    if end.signal is None and no_restart_exit_code is not None and end.code == no_restart_exit_code:
        return RestartClass.NO_RESTART
    if (end.signal is None and end.code == exit_codes.USAGE) or short_name(exception_of(tail)[1]) in USER_ERRORS:
        return RestartClass.USER_ERROR
    if not started:
        return RestartClass.START_FAILURE
    return RestartClass.RANK_FAILED


def signature(end: ProcessEnd, tail: Sequence[str]) -> str:
    """The root cause's identity for the crash-loop breaker: how it ended and its last traceback line, or
    without one, the C++ class it was terminated by and the line that says what failed.

    Memory addresses and the ports of IPv4 addresses are blanked (they differ on every run); nothing
    else is, so a message that names a different step or file is a different failure (the job got further).
    A NCCL, CUDA or gloo message has its run-to-run numbers blanked too (native_errors.normalise: sequence
    numbers, durations, ranks, pids), so the same collective timing out twice reads the same.
    """
    line = exception_of(tail)[0]
    if line:
        line = _PORT.sub(r"\1?", _ADDRESS.sub("0x?", line))
        if native_errors.recognise(line):
            line = native_errors.normalise(line)
    elif native := native_errors.read(tail):
        line = f"{native.exception}: {native.key}" if native.exception else native.key
    return f"{end.describe()}: {line}" if line else end.describe()
