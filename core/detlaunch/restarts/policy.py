"""The restart policy: whether the job starts another attempt, after how long, and why. Pure: no I/O.

The chief decides for the whole job, once per failure, from the history of every attempt so
far: one count for the job, whatever the number of nodes and however fast a node comes back
(torchrun's per-node counts restart a job more often than asked, pytorch/pytorch#108158).

    attempt ends ─► AttemptEnd (classify.py: its RestartClass, its signature) ─► RestartPolicy.decide ─► RestartDecision

A failure is retried unless retrying cannot help: the job never started, a user error that the
same code will raise again, the script's own "do not restart me" exit code, or the user's signal.
Two attempts in a row failing the same way (exit code and last traceback line, or what the C++ side
printed) are a crash loop; a lost node, a NCCL timeout or a network error never is.
The options that make a policy are in options.py; the report of the attempts in observe/report.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Protocol

import detlaunch.exit_codes as exit_codes
from detlaunch.errors import ConfigError
from detlaunch.outcome import AttemptEnd, RestartClass
from detlaunch.restarts.classify import USER_ERRORS, short_name

RETRIED_BY_DEFAULT = frozenset({RestartClass.RANK_FAILED, RestartClass.NODE_LOST, RestartClass.HANG})
# Where the exit code (and the traceback) is the rank's own; otherwise it is detlaunch's (1 for a lost
# node or a job that never started), and --restart-on/--no-restart-on exit codes and exception classes do not apply.
RANK_CLASSES = frozenset({RestartClass.RANK_FAILED, RestartClass.USER_ERROR, RestartClass.NO_RESTART})


class Rng(Protocol):
    """What decide() needs of a random generator (random.Random has it; tests seed one)."""

    def random(self) -> float: ...


@dataclasses.dataclass(frozen=True)
class RestartDecision:
    """Restart or not, after how long, and why (one line the user reads in the report)."""

    restart: bool
    why: str
    delay: float = 0.0
    next_attempt: int = 0  # the attempt that starts, when restart


Item = int | str  # an exit code, a RestartClass value, or an exception class name


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """When the chief starts the job again. Data: shown by --dry-run, decided by decide().

    max_restarts: restarts after failures, job-wide (0: restarts are off).
    max_node_restarts: restarts after a lost node, counted apart (None: as many as max_restarts).
    A preemption is not the code's fault and must not spend the budget meant for the code's
    failures (ray-project/ray#41285); it still has a budget, because detlaunch cannot tell a
    preemption from a machine the job itself brings down. With max_restarts 0 and no
    max_node_restarts given, nothing restarts: jobs that did not ask see no change.
    restart_on / no_restart_on: exit codes, RestartClass values, exception class names (as printed,
    or their last dotted part) that override the defaults (RETRIED_BY_DEFAULT). An exit code or an
    exception class is more specific than a restart class and wins over it; exit codes and exception
    classes apply to a rank's own end only (RANK_CLASSES). INTERRUPTED is never restarted.
    no_restart_exit_code: the exit code a script uses to say "do not restart me" (None: none).
    Backoff before restart k (1-based): min(cap, initial * factor**(k-1)), less up to `jitter` of it
    at random (jitter 1 is "full jitter", 0 none): spreads the nodes of many jobs restarting at once.
    crash_loop_limit: that many attempts in a row failing the same way (by signature) stop the job
    (0: never). A lost node, a NCCL timeout or a network error is never part of a crash loop (loops()).
    """

    max_restarts: int = 0
    max_node_restarts: int | None = None
    restart_on: tuple[Item, ...] = ()
    no_restart_on: tuple[Item, ...] = ()
    no_restart_exit_code: int | None = exit_codes.NO_RESTART
    backoff_initial: float = 1.0
    backoff_factor: float = 2.0
    backoff_cap: float = 30.0
    backoff_jitter: float = 0.5
    crash_loop_limit: int = 2

    def __post_init__(self) -> None:
        check_policy(self)

    @property
    def node_restarts(self) -> int:
        return self.max_restarts if self.max_node_restarts is None else self.max_node_restarts

    @property
    def enabled(self) -> bool:
        """Whether any attempt but the first can ever start (what per-attempt log folders follow)."""
        return self.max_restarts > 0 or self.node_restarts > 0

    def restarts_after(self, attempt: int, num_nodes: int) -> int:
        """At most how many attempts can still follow `attempt` (a node cannot be lost on one node)."""
        lost_node = self.node_restarts if num_nodes > 1 else 0
        return self.max_restarts + lost_node - (attempt - 1)

    def backoff(self, restart: int, rng: Rng) -> float:
        """Seconds to wait before restart number `restart` (1 for the first), in [0, backoff_cap]."""
        try:
            grown = self.backoff_initial * self.backoff_factor ** (restart - 1)
        except OverflowError:  # far past any cap
            grown = math.inf
        base = min(self.backoff_cap, grown) if self.backoff_initial > 0 else 0.0
        return max(0.0, base * (1.0 - self.backoff_jitter * rng.random()))

    def retryable(self, end: AttemptEnd) -> tuple[bool, str]:
        """Whether an attempt that ended this way is worth another one, and the reason when it is not."""
        assert end.restart_class is not None
        if end.restart_class is RestartClass.INTERRUPTED:
            return False, "interrupted by a signal: not restarting"
        specific: list[Item] = []
        if end.restart_class in RANK_CLASSES:
            specific = [end.exit_code, end.exception, short_name(end.exception)] if end.exception else [end.exit_code]
        for items in (specific, [end.restart_class.value]):
            refused = [i for i in items if i in self.no_restart_on]
            if refused:
                return False, f"{_label(refused[0])} is in --no-restart-on: not restarting"
            if any(i in self.restart_on for i in items):
                return True, ""
        if end.restart_class in RETRIED_BY_DEFAULT:
            return True, ""
        if end.restart_class is RestartClass.USER_ERROR:
            if end.exception and short_name(end.exception) in USER_ERRORS:
                name = short_name(end.exception)
                return False, f"{name} is a user error: not restarting (--restart-on {name} retries it)"
            return False, f"exit code {end.exit_code} is bad usage: not restarting (--restart-on {end.exit_code} " \
                          "retries it)"
        if end.restart_class is RestartClass.NO_RESTART:
            return False, f"exit code {end.exit_code} asks not to be restarted: not restarting"
        return False, "the job failed before any rank started: not restarting (--restart-on start-failure retries it)"

    def decide(self, history: Sequence[AttemptEnd], rng: Rng) -> RestartDecision:
        """After the last attempt of `history` ended: start another one, or end the job, and why."""
        if not history:
            raise ValueError("decide() needs the attempt that just ended")
        last = history[-1]
        if last.restart_class is None:
            return RestartDecision(False, f"attempt {last.attempt} finished")
        ok, why = self.retryable(last)
        if not ok:
            return RestartDecision(False, why)
        if self.crash_loop_limit and loops(last):
            run = history[-self.crash_loop_limit :]
            if len(run) == self.crash_loop_limit and all(e.signature == last.signature and loops(e) for e in run):
                first = run[0].attempt
                who = f"attempt {last.attempt} failed the same way as attempt {first}" if len(run) == 2 else \
                    f"attempts {first}-{last.attempt} failed the same way"
                return RestartDecision(False, f"{who} ({last.cause}): not restarting (crash loop)")
        lost = last.restart_class is RestartClass.NODE_LOST
        used = sum(1 for e in history[:-1] if (e.restart_class is RestartClass.NODE_LOST) == lost)
        budget = self.node_restarts if lost else self.max_restarts
        what = "restarts after a lost node" if lost else "restarts"
        if budget == 0:
            flag = "--max-node-restarts" if lost and self.max_node_restarts is not None else "--max-restarts"
            return RestartDecision(False, f"restarts are off ({flag} 0): not restarting")
        if used >= budget:
            return RestartDecision(False, f"all {budget} {what} used: not restarting")
        delay = self.backoff(len(history), rng)
        note = " (a lost node: not counted against --max-restarts)" if lost else ""
        return RestartDecision(True, f"restart {used + 1} of {budget}{note} in {delay:.1f} s", delay, last.attempt + 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "max_restarts": self.max_restarts, "max_node_restarts": self.node_restarts,
            "restart_on": list(self.restart_on), "no_restart_on": list(self.no_restart_on),
            "retried_by_default": sorted(c.value for c in RETRIED_BY_DEFAULT),
            "user_errors": sorted(USER_ERRORS), "usage_exit_code": exit_codes.USAGE,
            "no_restart_exit_code": self.no_restart_exit_code, "crash_loop_limit": self.crash_loop_limit,
            "backoff": {"initial": self.backoff_initial, "factor": self.backoff_factor, "cap": self.backoff_cap,
                        "jitter": self.backoff_jitter},
        }

    def describe(self) -> list[str]:
        """The policy as --dry-run prints it."""
        if not self.enabled:
            return ["restarts: off (--max-restarts 0): the first failure ends the job"]
        lines = [f"restarts: at most {self.max_restarts} after failures, {self.node_restarts} after lost nodes "
                 "(job-wide, counted by the chief)",
                 f"  restarted: {', '.join(sorted(c.value for c in RETRIED_BY_DEFAULT))}; not: start-failure, "
                 f"user-error (exit {exit_codes.USAGE}, {', '.join(sorted(USER_ERRORS))}), interrupted"]
        if self.no_restart_exit_code is not None:
            lines.append(f"  exit code {self.no_restart_exit_code}: the script asks not to be restarted")
        if self.restart_on:
            lines.append(f"  --restart-on {','.join(map(str, self.restart_on))}")
        if self.no_restart_on:
            lines.append(f"  --no-restart-on {','.join(map(str, self.no_restart_on))}")
        if self.crash_loop_limit:
            lines.append(f"  crash loop: {self.crash_loop_limit} attempts in a row failing the same way "
                         "(exit code and last traceback line) end the job; a lost node, a NCCL timeout or "
                         "network error never does")
        lo = 1 - self.backoff_jitter
        waits = [min(self.backoff_cap, self.backoff_initial * self.backoff_factor ** k) for k in range(3)]
        lines.append(f"  backoff: {self.backoff_initial:g} s, x{self.backoff_factor:g} per restart, at most "
                     f"{self.backoff_cap:g} s, up to {self.backoff_jitter:.0%} less at random ("
                     + ", ".join(f"restart {k + 1} after {w * lo:.3g}-{w:.3g} s" for k, w in enumerate(waits)) + ")")
        return lines


def loops(end: AttemptEnd) -> bool:
    """Whether an attempt that ended this way can be part of a crash loop: not a lost node, nor a NCCL timeout
    or network error (AttemptEnd.infrastructure): a bad link or peer fails the same way on every attempt as
    readily as code does, and --max-restarts is the user's bound for it."""
    return end.restart_class is not RestartClass.NODE_LOST and not end.infrastructure


def _label(item: Item) -> str:
    return f"exit code {item}" if isinstance(item, int) else str(item)


def check_policy(policy: RestartPolicy) -> None:
    """One clear line for a value that makes no sense (the dataclass's own check)."""
    def number(name: str, value: float, low: float = 0.0, high: float = math.inf) -> None:
        if not (math.isfinite(value) and low <= value <= high):
            top = "" if high == math.inf else f" and at most {high:g}"
            raise ConfigError(f"{name} {value!r} is out of range: give a number of at least {low:g}{top}")

    for name, count in (("--max-restarts", policy.max_restarts), ("--max-node-restarts", policy.node_restarts),
                        ("the crash-loop limit", policy.crash_loop_limit)):
        if count < 0:
            raise ConfigError(f"{name} {count} is negative: give 0 (off) or more")
    number("--restart-backoff", policy.backoff_initial)
    number("--restart-backoff-max", policy.backoff_cap)
    number("the backoff factor", policy.backoff_factor, low=1.0)
    number("the backoff jitter", policy.backoff_jitter, high=1.0)
    if policy.backoff_initial > policy.backoff_cap:
        raise ConfigError(f"--restart-backoff {policy.backoff_initial:g} is more than --restart-backoff-max "
                          f"{policy.backoff_cap:g}: raise the maximum or lower the first backoff")
    both = set(policy.restart_on) & set(policy.no_restart_on)
    if both:
        raise ConfigError(f"{', '.join(sorted(map(str, both)))} is in both --restart-on and --no-restart-on: "
                          "keep it in one")
    for item in (*policy.restart_on, *policy.no_restart_on):
        if item == RestartClass.INTERRUPTED.value:
            raise ConfigError("'interrupted' cannot be in --restart-on or --no-restart-on: the user's signal "
                              "always ends the job")


__all__ = ["RETRIED_BY_DEFAULT", "RANK_CLASSES", "Item", "RestartDecision", "RestartPolicy", "Rng", "check_policy"]
