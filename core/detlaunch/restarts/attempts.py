"""One job's attempts, as a node's supervisor counts them: which one runs, how each ended, what comes next.

The restart policy (policy.py) decides from the history; this is the bookkeeping around it that the
supervisor drives, on the chief for the whole job (a worker only follows the attempt number):

    attempt N runs ──(it ended: ended())──► RestartDecision ──restart──► waiting (backoff; lost nodes away)
         ▲                                     │ no                        │ backoff over: due = N+1
         │                                     ▼                           │ every node back
         └──────────────── begin(N+1) ◄────────┴── the job ends ◄── stopped_waiting() (a signal, a failure)

Pure: no I/O, no clock (times come in), no timers: the supervisor owns those.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from detlaunch.observe.report import format_attempts
from detlaunch.outcome import AttemptEnd, Failure, FailureKind, ProcessEnd, RestartClass, signal_name
from detlaunch.restarts.classify import classify, exception_class, infrastructure, signature
from detlaunch.restarts.policy import RestartDecision, RestartPolicy, Rng


@dataclasses.dataclass
class Attempts:
    """number: the attempt that runs or comes next (1 for the first). running: False between attempts.
    due: the chief, the backoff is over but lost nodes are not back: the attempt that then starts."""

    policy: RestartPolicy
    rng: Rng = dataclasses.field(default_factory=random.Random)
    number: int = 1
    running: bool = True
    history: list[AttemptEnd] = dataclasses.field(default_factory=list)
    decision: RestartDecision | None = None
    due: int | None = None

    def ended(self, end: AttemptEnd) -> RestartDecision:
        """The chief: the attempt that ran ended this way; record it and decide for the whole job."""
        self.history.append(end)
        self.decision = self.policy.decide(self.history, self.rng)
        return self.decision

    def would_restart(self, end: AttemptEnd) -> bool:
        """Were the attempt that runs to end this way, the policy would restart the job (nothing recorded)."""
        return self.policy.decide([*self.history, end], random.Random(0)).restart

    def stopped_waiting(self, why: str) -> RestartDecision:
        """The job was stopped between attempts (`why`): the next one never starts."""
        self.decision = RestartDecision(False, f"{why} before attempt {self.number + 1} started: not restarting")
        return self.decision

    def restarting(self) -> str:
        """The line the chief prints when it restarts the job."""
        assert self.history and self.decision is not None
        end = self.history[-1]
        cause = end.what if end.restart_class is RestartClass.NODE_LOST else end.cause
        return f"attempt {end.attempt} failed ({cause}): {self.decision.why}"

    def wait(self) -> None:
        """The last attempt is over, the next has not started (backoff, or lost nodes away)."""
        self.running = False

    def begin(self, attempt: int) -> None:
        self.number, self.running, self.due = attempt, True, None

    def ended_event(self, attempt: int, exit_code: int) -> dict[str, Any]:
        """The details of `attempt`'s `attempt_ended` event (its number there counts from 0) and, on the chief, how
        it ended and what the policy made of it, so that a page built from the log says it as the report does
        (format_attempts); a worker knows only the number and the exit code."""
        out: dict[str, Any] = {"attempt": attempt - 1, "exit_code": exit_code}
        if not self.history or self.history[-1].attempt != attempt:
            return out
        end = self.history[-1]
        out.update({"class": end.restart_class.value if end.restart_class else None, "what": end.what,
                    "signature": end.signature, "exception": end.exception, "started_at": end.started_at,
                    "ended_at": end.ended_at})
        if self.decision is not None:
            out["next"] = self.decision.why
        return out

    def report(self) -> list[str]:
        """The chief's report of every attempt, printed before the last one's (nothing if none ended)."""
        return format_attempts(self.history, self.decision.why if self.decision else None) if self.history else []


def attempt_end_from_verdict(attempt: int, failure: Failure | None, interrupted_by: int | None, exit_code: int, *,
                started: bool, policy: RestartPolicy, started_at: float, ended_at: float) -> AttemptEnd:
    """How an attempt ended, as the policy reads it, from its verdict: the root cause (None: none),
    the user's signal if any, the exit code; started: a rank of it ever registered, on any node."""
    if failure is None and interrupted_by is None:
        return AttemptEnd(attempt, None, 0, started_at=started_at, ended_at=ended_at)
    kind = FailureKind.INTERRUPTED if interrupted_by is not None or failure is None else failure.kind
    what = failure.what if failure else f"interrupted by {signal_name(interrupted_by or 0)}"
    signum = failure.rank.signal if failure and failure.rank else None
    end, tail = ProcessEnd(exit_code, signum), failure.tail if failure else ()
    restart_class = classify(kind, end, tail, started=started, no_restart_exit_code=policy.no_restart_exit_code)
    return AttemptEnd(attempt, restart_class, exit_code, signature=signature(end, tail), what=what,
                      exception=exception_class(tail), started_at=started_at, ended_at=ended_at,
                      infrastructure=restart_class is RestartClass.RANK_FAILED and infrastructure(tail))
