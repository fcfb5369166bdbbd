"""How a job ended: a process's end (`ProcessEnd`), each rank's (`RankStatus`), the root cause
(`Failure`), the job's (`JobResult`) and, for the restart policy, each attempt's (`AttemptEnd`).

The outcome model every part shares: the verdict builds it, the link carries it as JSON, the
report and the restart policy read it. Pure data; the report's words are in observe/report.py.

Two vocabularies for a failure, one derived from the other:

    FailureKind  (the verdict's: what failed: a rank, a launcher, a node...)
        │  restarts/classify.py: + the exit code and the last traceback line
        ▼
    RestartClass (the restart policy's: may another attempt help? the words of --restart-on)
"""

from __future__ import annotations

import dataclasses
import enum
import os
import signal
from typing import Any

import detlaunch.exit_codes as exit_codes
from detlaunch.rank import protocol as rank_protocol


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclasses.dataclass(frozen=True)
class ProcessEnd:
    """How a process ended, in the one form detlaunch keeps: its exit code as a shell reports it
    (128+N when signal N killed it), and that signal (None when it exited by itself).

    The other forms are converted where they come in: a wait status (os.waitpid), Python's
    returncode (-N for a signal), the rank wrapper's {"code", "signal"} (rank/protocol.py), an
    event's {"code": null, "signal": N}.
    """

    code: int
    signal: int | None = None

    @classmethod
    def killed(cls, signum: int) -> ProcessEnd:
        return cls(exit_codes.by_signal(signum), signum)

    @classmethod
    def from_returncode(cls, returncode: int) -> ProcessEnd:
        """From Python's form (subprocess's returncode, os.waitstatus_to_exitcode): -N for signal N."""
        return cls(rank_protocol.exit_code_of(returncode), -returncode if returncode < 0 else None)

    @classmethod
    def from_wait_status(cls, status: int) -> ProcessEnd:
        """From os.waitpid's status."""
        return cls.from_returncode(os.waitstatus_to_exitcode(status))

    @property
    def ok(self) -> bool:
        return self.code == 0 and not self.signal

    def describe(self) -> str:
        """``exit 3`` or ``killed by SIGKILL``."""
        return f"killed by {signal_name(self.signal)}" if self.signal else f"exit {self.code}"


def script_end_words(ended: str) -> str:
    """How a rank's script ended, in words ('' when it had not: rank.progress.script_end's values). Its
    Python had then started shutting down: the mark faultsite/sitecustomize.py writes says so, for real."""
    if ended.startswith("exit "):
        return f"its script had called sys.exit({ended.removeprefix('exit ')})"
    return {"finished": "its script had finished",
            "finalizing": "its script and its atexit handlers had finished",
            "raised": "its script had ended with an uncaught exception"}.get(ended, "")


def after_its_script(ended: str) -> str:
    """The words for a signal that came after the rank's script had ended (torch's abort while Python finalizes)."""
    if ended == "finalizing":
        return " after its script and its atexit handlers had finished (its work was done: Python was finalizing)"
    if ended == "finished":
        return " after its script had finished (Python was running its atexit handlers)"
    words = script_end_words(ended)
    return f" after {words} (Python was shutting down)" if words else ""


@dataclasses.dataclass(frozen=True)
class RankStatus:
    """One rank's end, as its wrapper reported it (or as the supervisor saw it).

    exit_code and signal are a ProcessEnd's two fields (`end`), kept flat: the public shape
    plugins read. exit_code None: it has not ended (a rank stuck after its traceback).
    """

    rank: int
    node_rank: int
    exit_code: int | None
    signal: int | None = None
    tail: tuple[str, ...] = ()
    lost: bool = False  # the wrapper vanished without a report (SIGKILLed)
    wall: float = 0.0  # wall-clock time of the exit: orders failures across nodes
    host: str = ""
    stopped: bool = False  # detlaunch had asked it to stop: its end is a consequence, not a cause
    killed: bool = False  # detlaunch SIGKILLed it (and its wrapper), so no report could come
    log_error: str = ""  # its --log-dir file is incomplete, and why
    ended: str = ""  # its script had ended before it died ("finished", "raised": rank.progress.OutputMark.script_end)
    teardown_signal: int | None = None  # exit 0, though this signal ended it while Python finalized

    @property
    def end(self) -> ProcessEnd | None:
        return None if self.exit_code is None else ProcessEnd(self.exit_code, self.signal)

    @property
    def failed(self) -> bool:
        return self.exit_code != 0

    def describe(self) -> str:
        if self.killed:
            return "SIGKILLed by detlaunch (it had not stopped when asked)"
        if self.lost:
            return "its wrapper was killed before it could report (counted as SIGKILL)"
        if self.end is None:
            return "still running"
        if self.teardown_signal and self.exit_code == 0:
            return f"exit 0 ({rank_protocol.teardown_words(self.teardown_signal)})"
        return self.end.describe() + (after_its_script(self.ended) if self.signal else "")

    def to_json(self) -> dict[str, Any]:
        return rank_protocol.status_to_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankStatus:
        return cls(**rank_protocol.status_fields(data))


class FailureKind(enum.StrEnum):
    """What failed: the verdict's and the report's vocabulary. The restart policy's RestartClass is
    derived from it (restarts/classify.py); the values travel on the job link, users never type them."""

    RANK = "rank"  # a rank exited non-zero or by a signal
    LAUNCHER = "launcher"  # a launcher exited non-zero with no rank failure reported first
    DAEMON = "daemon"  # a daemon (sshd) ended before the job did
    NODE_LOST = "node_lost"  # chief: a worker node's supervisor vanished
    CHIEF_LOST = "chief_lost"  # worker: the chief's supervisor vanished
    INTERRUPTED = "interrupted"  # a node's detlaunch got SIGINT/SIGTERM/SIGHUP
    START = "start"  # the job could not start (setup, peers, timeouts)
    HANG = "hang"  # no rank of the job showed progress for --hang-timeout seconds


@dataclasses.dataclass(frozen=True)
class Failure:
    """The root cause: the first thing that went wrong."""

    what: str  # one line: "rank 1 on node 0 (127.0.0.1) exited with code 3"
    exit_code: int
    rank: RankStatus | None = None
    tail: tuple[str, ...] = ()  # the last output lines of whatever failed
    tail_of: str = ""  # whose lines they are: "rank 1", "torchrun"
    at: float = 0.0  # wall-clock time it happened: the earliest failure is the root cause
    kind: FailureKind = FailureKind.START

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "code": self.exit_code, "rank": self.rank.to_json() if self.rank else None,
                "tail": list(self.tail), "tail_of": self.tail_of, "at": self.at, "kind": self.kind.value}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Failure:
        """Raises ValueError (or KeyError/TypeError) on a malformed message."""
        return cls(what=str(d["what"]), exit_code=int(d["code"]),
                   rank=RankStatus.from_json(d["rank"]) if d.get("rank") else None,
                   tail=tuple(str(t) for t in d.get("tail") or ()), tail_of=str(d.get("tail_of") or ""),
                   at=float(d.get("at") or 0.0), kind=FailureKind(d.get("kind") or FailureKind.START.value))


@dataclasses.dataclass(frozen=True)
class JobResult:
    exit_code: int
    ranks: tuple[RankStatus, ...]
    failure: Failure | None = None
    interrupted_by: int | None = None
    duration: float = 0.0
    node_rank: int = 0
    warnings: tuple[str, ...] = ()  # problems that did not stop the job (a log file that could not be written)
    stacks: tuple[str, ...] = ()  # the other ranks' stacks, grouped, taken before they were stopped
    attempts: tuple[str, ...] = ()  # restarts on, the chief: the report of every attempt (before the last one's)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class RestartClass(enum.Enum):
    """What ended an attempt, as the restart policy sees it: whether another attempt may help.

    Derived from the root cause's FailureKind, its exit code and its last traceback line by
    restarts/classify.py. The values are the words users write in --restart-on / --no-restart-on.
    """

    START_FAILURE = "start-failure"  # the job failed before any rank started
    USER_ERROR = "user-error"  # exit 2, or a traceback ending in one of classify.USER_ERRORS
    NO_RESTART = "no-restart"  # a rank exited with the "do not restart me" exit code
    RANK_FAILED = "rank-failed"  # a rank (or its launcher) exited non-zero or was killed by a signal
    NODE_LOST = "node-lost"  # a node stopped answering (preempted, crashed, unplugged)
    HANG = "hang"  # no progress for too long
    INTERRUPTED = "interrupted"  # the user's signal: never restarted


@dataclasses.dataclass(frozen=True)
class AttemptEnd:
    """How one attempt of the job ended. restart_class None: it finished (every rank exited 0).

    attempt: 1 for the first. exit_code: the attempt's (its root cause's). signature: its
    identity for the crash-loop breaker (how it ended and its last traceback line, see
    classify.signature). what: the root cause's line from the report ("rank 1 on node 0
    (127.0.0.1) exited with code 3"). exception: the class its last traceback line names (or, a rank
    killed by a C++ exception, that class: "c10::DistBackendError"), "" if none. infrastructure: a NCCL
    timeout or network error, which a broken link, switch, GPU or peer produces as readily as code:
    never part of a crash loop (restarts/classify.py). Times are wall-clock seconds.
    """

    attempt: int
    restart_class: RestartClass | None
    exit_code: int
    signature: str = ""
    what: str = ""
    exception: str = ""
    started_at: float = 0.0
    ended_at: float = 0.0
    infrastructure: bool = False

    @property
    def cause(self) -> str:
        """The short form users read: the exception line if there is one, else how it ended."""
        return self.signature.split(": ", 1)[1] if ": " in self.signature else self.signature
