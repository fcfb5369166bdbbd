"""detlaunch's exit codes: every code it gives a meaning to, its name, and that meaning, in one table.

detlaunch exits with the root cause's own exit code (a rank's, a launcher's) when there is one; the
codes here are the ones it picks itself, and the ones it reads in a rank's end. Every use imports
its name from here (the README's "Exit codes" section is checked against `TABLE` by
tests/test_exit_codes.py). One exception: the rank wrapper (rank/, which imports nothing above it)
writes USAGE, CANNOT_RUN and NOT_FOUND as literals; that test checks them too.
"""

from __future__ import annotations

import dataclasses

OK = 0
FAILED = 1  # detlaunch itself: the job could not start, a node was lost, a rank hung after its traceback
USAGE = 2  # bad input (also argparse's and `python missing.py`'s: a rank's 2 is a user error)
NO_RESTART = 64  # the first of sysexits.h's "permanent failure" codes: see docs/RESTARTS.md
PREFLIGHT = 69  # sysexits.h's EX_UNAVAILABLE: a node failed the preflight (--preflight), no rank started
INTERNAL = 70  # sysexits.h's EX_SOFTWARE: detlaunch's isolated child crashed (a bug: the traceback is printed)
HANG = 124  # timeout(1)'s "it ran out of time"
CANNOT_RUN = 126  # the shell's "found but cannot be executed"
NOT_FOUND = 127  # the shell's "command not found"
SIGNAL_BASE = 128  # 128+N: ended by signal N, as a shell reports it
INTERRUPTED = SIGNAL_BASE + 2  # SIGINT: Ctrl-C


def by_signal(signum: int) -> int:
    """The exit code of a process that signal `signum` ended, as a shell reports it: 128+N."""
    return SIGNAL_BASE + signum


@dataclasses.dataclass(frozen=True)
class ExitCode:
    code: str  # "124", or "128+N" for the signal range
    name: str  # its name in this module
    meaning: str  # one line, as the README says it


TABLE = (
    ExitCode(str(OK), "OK", "every rank exited 0 (one that crashed in Python's teardown after its work was done "
             "counts: docs/RESTARTS.md)"),
    ExitCode(str(FAILED), "FAILED", "detlaunch's own failure: the job could not start, a node was lost, or a rank "
             "printed an uncaught traceback and had not exited 5 s later"),
    ExitCode(str(USAGE), "USAGE", "bad input: one line on stderr says what is wrong and what to do (`--debug` adds "
             "the traceback); a rank exiting 2 is a user error, not restarted"),
    ExitCode(str(NO_RESTART), "NO_RESTART", "a rank exiting 64 asks not to be restarted (`--no-restart-exit-code`; "
             "docs/RESTARTS.md)"),
    ExitCode(str(PREFLIGHT), "PREFLIGHT", "a node failed `--preflight` (broken, or slower than "
             "`--preflight-threshold` of the others) and no spare took its place: no rank started (docs/HANGS.md)"),
    ExitCode(str(INTERNAL), "INTERNAL", "detlaunch's isolated supervisor crashed: a bug, its traceback is printed"),
    ExitCode(str(HANG), "HANG", "the job hung: no rank on any node showed progress for `--hang-timeout` seconds "
             "(docs/HANGS.md)"),
    ExitCode(str(CANNOT_RUN), "CANNOT_RUN", "a rank's command exists but cannot be run (not executable)"),
    ExitCode(str(NOT_FOUND), "NOT_FOUND", "a rank's command was not found"),
    ExitCode("128+N", "SIGNAL_BASE", "signal N ended the root cause, or detlaunch itself (130: Ctrl-C, "
             "143: SIGTERM)"),
)
