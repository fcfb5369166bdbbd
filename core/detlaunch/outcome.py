"""How a job ended: each rank's end (`RankStatus`), the root cause (`Failure`) and the job's (`JobResult`).

The outcome model every part shares: the verdict builds it, the link carries it as JSON, the
report and the restart policy read it. Pure data; the report's words are in observe/report.py.
"""

from __future__ import annotations

import dataclasses
import enum
import signal
from typing import Any

from detlaunch.rank import protocol as rank_protocol


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(code: int | None, signum: int | None) -> str:
    if signum:
        return f"killed by {signal_name(signum)}"
    if code is None:
        return "still running"
    return f"exit {code}"


@dataclasses.dataclass(frozen=True)
class RankStatus:
    """One rank's end, as its wrapper reported it (or as the supervisor saw it)."""

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

    @property
    def failed(self) -> bool:
        return self.exit_code != 0

    def describe(self) -> str:
        if self.killed:
            return "SIGKILLed by detlaunch (it had not stopped when asked)"
        if self.lost:
            return "its wrapper was killed before it could report (counted as SIGKILL)"
        return describe_exit(self.exit_code, self.signal)

    def to_json(self) -> dict[str, Any]:
        return rank_protocol.status_to_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankStatus:
        return cls(**rank_protocol.status_fields(data))


class FailureKind(enum.StrEnum):
    """What failed: the verdict's and the report's vocabulary (restart.FailureClass is the policy's)."""

    RANK = "rank"  # a rank exited non-zero or by a signal
    LAUNCHER = "launcher"  # a launcher exited non-zero with no rank failure reported first
    DAEMON = "daemon"  # a daemon (sshd) ended before the job did
    NODE_LOST = "node_lost"  # chief: a worker node's supervisor vanished
    CHIEF_LOST = "chief_lost"  # worker: the chief's supervisor vanished
    INTERRUPTED = "interrupted"  # a node's detlaunch got SIGINT/SIGTERM/SIGHUP
    START = "start"  # the job could not start (setup, peers, timeouts)
    HANG = "hang"  # no rank of the job showed progress for --hang-timeout seconds


HANG_EXIT_CODE = 124  # detlaunch's own exit code for a hung job (timeout(1)'s: "it ran out of time")


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
