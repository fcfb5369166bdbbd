"""Job-wide restarts: what ended an attempt, and whether the job starts another. Pure: no I/O.

The chief decides for the whole job, once per failure, from the history of every attempt so
far: one count for the job, whatever the number of nodes and however fast a node comes back
(torchrun's per-node counts restart a job more often than asked, pytorch/pytorch#108158).

    attempt ends ─► AttemptEnd.from_failure (classify + signature) ─► RestartPolicy.decide ─► RestartDecision
                                                                         │
    format_attempts(history, decision) ◄─────────────────────────────────┘   (the end report)

A failure is retried unless retrying cannot help: the job never started, a user error that the
same code will raise again, the script's own "do not restart me" exit code, or the user's signal.
Two attempts in a row failing the same way (exit code and last traceback line) are a crash loop.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import math
import os
import re
import signal as signals
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from detlaunch.errors import ConfigError
from detlaunch.numbers import Number
from detlaunch.outcome import describe_exit

RESTART_COUNT_ENV = "DETLAUNCH_RESTART_COUNT"
TORCHELASTIC_RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
TORCHELASTIC_MAX_RESTARTS_ENV = "TORCHELASTIC_MAX_RESTARTS"
# detlaunch's own restart options, removed from the job's processes: a detlaunch nested in the job must
# not restart its part on its own (the outer chief restarts the whole job, and counts once).
OPTION_ENV = ("DETLAUNCH_MAX_RESTARTS", "DETLAUNCH_MAX_NODE_RESTARTS")

# The exit code a script uses to say "do not restart me" (--no-restart-exit-code). 64 is the first of
# sysexits.h's codes (64-78), which mail systems treat as permanent failures; Python (0, 1, 2), the
# shell (126, 127), signals (128+N) and Determined's launch layers (77-79) never produce it by accident.
NO_RESTART_EXIT_CODE = 64

# Exit code 2 is "bad usage": argparse, click and `python missing.py` exit with it.
USAGE_EXIT_CODE = 2

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


class FailureClass(enum.Enum):
    """What ended an attempt, as the restart policy classes it (report.FailureKind says what failed). The value is the
    name users write in --restart-on."""

    START_FAILURE = "start-failure"  # the job failed before any rank started
    USER_ERROR = "user-error"  # exit 2, or a traceback ending in one of USER_ERRORS
    NO_RESTART = "no-restart"  # a rank exited with the "do not restart me" exit code
    RANK_FAILED = "rank-failed"  # a rank exited non-zero or was killed by a signal
    NODE_LOST = "node-lost"  # a node stopped answering (preempted, crashed, unplugged)
    HANG = "hang"  # no progress for too long
    INTERRUPTED = "interrupted"  # the user's signal: never restarted


RETRIED_BY_DEFAULT = frozenset({FailureClass.RANK_FAILED, FailureClass.NODE_LOST, FailureClass.HANG})
# Where the exit code (and the traceback) is the rank's own; otherwise it is detlaunch's (1 for a lost
# node or a job that never started), and --restart-on/--no-restart-on exit codes and classes do not apply.
RANK_KINDS = frozenset({FailureClass.RANK_FAILED, FailureClass.USER_ERROR, FailureClass.NO_RESTART})


# -- what ended an attempt -------------------------------------------------------------------

# An exception line, as the traceback's last line prints it: "ValueError: boom", "torch.OutOfMemoryError: ...".
_EXCEPTION_LINE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?::\s?(.*))?$")
# Without the "Traceback" header (cut off from a long tail) only a name that looks like an exception counts.
_EXCEPTION_NAME = re.compile(r"(Error|Exception|Exit|Interrupt|Failure|Iteration)$")
# torch.distributed's excepthook prefixes every traceback line with "[rankN]: " once a process group exists.
_TORCH_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
# What differs on every run of the same failure: object addresses, ephemeral ports ("[127.0.0.1]:14738").
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_PORT = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}\]?:)\d+")


def last_exception(tail_lines: Sequence[str]) -> str:
    """The exception line that ended the last traceback in a rank's last stderr lines, or "".

    Reads the last "Traceback (most recent call last):" and takes the first unindented line after
    it (frames and source lines are indented), so output printed after the traceback (atexit
    warnings) does not hide it. When the header was cut off, the last unindented line naming an
    exception (``...Error: ...``) counts. torch's "[rankN]: " prefix is removed first.
    """
    tail_lines = [_TORCH_RANK_PREFIX.sub("", line) for line in tail_lines]
    headers = [i for i, line in enumerate(tail_lines) if line.startswith("Traceback (most recent call last)")]
    if headers:
        for line in tail_lines[headers[-1] + 1 :]:
            if line.strip() and not line[0].isspace() and _EXCEPTION_LINE.match(line.rstrip()):
                return line.rstrip()
        return ""
    for line in reversed(tail_lines):
        m = _EXCEPTION_LINE.match(line.rstrip())
        if m and line.strip() and not line[0].isspace() and _EXCEPTION_NAME.search(m.group(1)):
            return line.rstrip()
    return ""


def exception_name(line: str) -> str:
    """The class in an exception line: "ModuleNotFoundError: No module named 'x'" -> "ModuleNotFoundError"."""
    m = _EXCEPTION_LINE.match(line)
    return m.group(1) if m and line else ""


def signature(exit_code: int | None, signal: int | None, tail_lines: Sequence[str]) -> str:
    """The root cause's identity for the crash-loop breaker: how it ended and its last traceback line.

    Memory addresses and the ports of IPv4 addresses are blanked (they differ on every run); nothing
    else is, so a message that names a different step or file is a different failure (the job got further).
    """
    line = _PORT.sub(r"\1?", _ADDRESS.sub("0x?", last_exception(tail_lines)))
    how = describe_exit(exit_code, signal)
    return f"{how}: {line}" if line else how


def classify(
    exit_code: int | None,
    signal: int | None,
    tail_lines: Sequence[str],
    started: bool,
    lost: bool = False,
    hung: bool = False,
    interrupted: bool = False,
    no_restart_exit_code: int | None = NO_RESTART_EXIT_CODE,
) -> FailureClass:
    """What kind of failure ended an attempt, from its root cause.

    In this order, the first that applies: the user's signal; the script's "do not restart me"
    exit code; a lost node (infrastructure, even before the ranks started); a hang; a user error
    (exit 2, or a traceback ending in one of USER_ERRORS: more telling than "did not start" when
    the launcher itself could not import); the job never started (no rank registered); else a
    failed rank.
    """
    if interrupted:
        return FailureClass.INTERRUPTED
    if signal is None and no_restart_exit_code is not None and exit_code == no_restart_exit_code:
        return FailureClass.NO_RESTART
    if lost:
        return FailureClass.NODE_LOST
    if hung:
        return FailureClass.HANG
    if (signal is None and exit_code == USAGE_EXIT_CODE) or _short(exception_name(last_exception(tail_lines))) \
            in USER_ERRORS:
        return FailureClass.USER_ERROR
    if not started:
        return FailureClass.START_FAILURE
    return FailureClass.RANK_FAILED


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


@dataclasses.dataclass(frozen=True)
class AttemptEnd:
    """How one attempt of the job ended. kind None: it finished (every rank exited 0).

    attempt: 1 for the first. signature: see signature(). what: the root cause's line from the
    report ("rank 1 on node 0 (127.0.0.1) exited with code 3"). exception: the class its last
    traceback line names, "" if none. Times are wall-clock seconds.
    """

    attempt: int
    kind: FailureClass | None
    exit_code: int
    signature: str = ""
    what: str = ""
    exception: str = ""
    started_at: float = 0.0
    ended_at: float = 0.0

    @classmethod
    def from_failure(
        cls, attempt: int, exit_code: int, signal: int | None, tail_lines: Sequence[str], what: str, *,
        started: bool, lost: bool = False, hung: bool = False, interrupted: bool = False,
        no_restart_exit_code: int | None = NO_RESTART_EXIT_CODE, started_at: float = 0.0, ended_at: float = 0.0,
    ) -> AttemptEnd:
        kind = classify(exit_code, signal, tail_lines, started, lost, hung, interrupted, no_restart_exit_code)
        line = last_exception(tail_lines)
        return cls(attempt=attempt, kind=kind, exit_code=exit_code, signature=signature(exit_code, signal, tail_lines),
                   what=what, exception=exception_name(line), started_at=started_at, ended_at=ended_at)

    @property
    def cause(self) -> str:
        """The short form users read: the exception line if there is one, else how it ended."""
        return self.signature.split(": ", 1)[1] if ": " in self.signature else self.signature


# -- the policy ------------------------------------------------------------------------------


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


Item = int | str  # an exit code, a FailureClass value, or an exception class name


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """When the chief starts the job again. Data: shown by --dry-run, decided by decide().

    max_restarts: restarts after failures, job-wide (0: restarts are off).
    max_node_restarts: restarts after a lost node, counted apart (None: as many as max_restarts).
    A preemption is not the code's fault and must not spend the budget meant for the code's
    failures (ray-project/ray#41285); it still has a budget, because detlaunch cannot tell a
    preemption from a machine the job itself brings down. With max_restarts 0 and no
    max_node_restarts given, nothing restarts: jobs that did not ask see no change.
    restart_on / no_restart_on: exit codes, FailureClass values, exception class names (as printed,
    or their last dotted part) that override the defaults (RETRIED_BY_DEFAULT). An exit code or a
    class is more specific than a kind and wins over it; exit codes and classes apply to a rank's
    own end only (RANK_KINDS). INTERRUPTED is never restarted.
    no_restart_exit_code: the exit code a script uses to say "do not restart me" (None: none).
    Backoff before restart k (1-based): min(cap, initial * factor**(k-1)), less up to `jitter` of it
    at random (jitter 1 is "full jitter", 0 none): spreads the nodes of many jobs restarting at once.
    crash_loop_limit: that many attempts in a row failing the same way (by signature) stop the job
    (0: never). A lost node is never part of a crash loop.
    """

    max_restarts: int = 0
    max_node_restarts: int | None = None
    restart_on: tuple[Item, ...] = ()
    no_restart_on: tuple[Item, ...] = ()
    no_restart_exit_code: int | None = NO_RESTART_EXIT_CODE
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
        """Whether this kind of failure is worth another attempt, and the reason when it is not."""
        assert end.kind is not None
        if end.kind is FailureClass.INTERRUPTED:
            return False, "interrupted by a signal: not restarting"
        specific: list[Item] = []
        if end.kind in RANK_KINDS:
            specific = [end.exit_code, end.exception, _short(end.exception)] if end.exception else [end.exit_code]
        for items in (specific, [end.kind.value]):
            refused = [i for i in items if i in self.no_restart_on]
            if refused:
                return False, f"{_label(refused[0])} is in --no-restart-on: not restarting"
            if any(i in self.restart_on for i in items):
                return True, ""
        if end.kind in RETRIED_BY_DEFAULT:
            return True, ""
        if end.kind is FailureClass.USER_ERROR:
            if end.exception and _short(end.exception) in USER_ERRORS:
                name = _short(end.exception)
                return False, f"{name} is a user error: not restarting (--restart-on {name} retries it)"
            return False, f"exit code {end.exit_code} is bad usage: not restarting (--restart-on {end.exit_code} " \
                          "retries it)"
        if end.kind is FailureClass.NO_RESTART:
            return False, f"exit code {end.exit_code} asks not to be restarted: not restarting"
        return False, "the job failed before any rank started: not restarting (--restart-on start-failure retries it)"

    def decide(self, history: Sequence[AttemptEnd], rng: Rng) -> RestartDecision:
        """After the last attempt of `history` ended: start another one, or end the job, and why."""
        if not history:
            raise ValueError("decide() needs the attempt that just ended")
        last = history[-1]
        if last.kind is None:
            return RestartDecision(False, f"attempt {last.attempt} finished")
        ok, why = self.retryable(last)
        if not ok:
            return RestartDecision(False, why)
        if self.crash_loop_limit and last.kind is not FailureClass.NODE_LOST:
            run = history[-self.crash_loop_limit :]
            if len(run) == self.crash_loop_limit and all(
                    e.signature == last.signature and e.kind is not FailureClass.NODE_LOST for e in run):
                first = run[0].attempt
                who = f"attempt {last.attempt} failed the same way as attempt {first}" if len(run) == 2 else \
                    f"attempts {first}-{last.attempt} failed the same way"
                return RestartDecision(False, f"{who} ({last.cause}): not restarting (crash loop)")
        lost = last.kind is FailureClass.NODE_LOST
        used = sum(1 for e in history[:-1] if (e.kind is FailureClass.NODE_LOST) == lost)
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
            "retried_by_default": sorted(k.value for k in RETRIED_BY_DEFAULT),
            "user_errors": sorted(USER_ERRORS), "usage_exit_code": USAGE_EXIT_CODE,
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
                 f"  restarted: {', '.join(sorted(k.value for k in RETRIED_BY_DEFAULT))}; not: start-failure, "
                 f"user-error (exit {USAGE_EXIT_CODE}, {', '.join(sorted(USER_ERRORS))}), interrupted"]
        if self.no_restart_exit_code is not None:
            lines.append(f"  exit code {self.no_restart_exit_code}: the script asks not to be restarted")
        if self.restart_on:
            lines.append(f"  --restart-on {','.join(map(str, self.restart_on))}")
        if self.no_restart_on:
            lines.append(f"  --no-restart-on {','.join(map(str, self.no_restart_on))}")
        if self.crash_loop_limit:
            lines.append(f"  crash loop: {self.crash_loop_limit} attempts in a row failing the same way "
                         "(exit code and last traceback line) end the job")
        lo = 1 - self.backoff_jitter
        waits = [min(self.backoff_cap, self.backoff_initial * self.backoff_factor ** k) for k in range(3)]
        lines.append(f"  backoff: {self.backoff_initial:g} s, x{self.backoff_factor:g} per restart, at most "
                     f"{self.backoff_cap:g} s, up to {self.backoff_jitter:.0%} less at random ("
                     + ", ".join(f"restart {k + 1} after {w * lo:.3g}-{w:.3g} s" for k, w in enumerate(waits)) + ")")
        return lines


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
        if item == FailureClass.INTERRUPTED.value:
            raise ConfigError("'interrupted' cannot be in --restart-on or --no-restart-on: the user's signal "
                              "always ends the job")


# -- the end report --------------------------------------------------------------------------


def format_attempts(history: Sequence[AttemptEnd], decision: RestartDecision | None) -> list[str]:
    """The report's lines for a job of several attempts: each one's root cause, and why the next
    started or why none did (`decision`: the one taken after the last).

    Printed before the last attempt's own report (format_report), which ends with the job's exit
    code: the last attempt's root cause's, history[-1].exit_code.
    """
    lines = [f"detlaunch: {len(history)} attempt(s):"]
    for n, end in enumerate(history):
        took = f" after {end.ended_at - end.started_at:.1f} s" if end.ended_at > end.started_at else ""
        if end.kind is None:
            lines.append(f"detlaunch:   attempt {end.attempt}: finished{took} (exit 0)")
            continue
        cause = f"{end.what} ({end.cause})" if end.what and end.exception else end.what or end.cause
        lines.append(f"detlaunch:   attempt {end.attempt}: {end.kind.value}{took}: {cause}")
        if n + 1 < len(history):
            nxt = history[n + 1]
            gap = f" {nxt.started_at - end.ended_at:.1f} s later" if nxt.started_at > end.ended_at else ""
            lines.append(f"detlaunch:     -> attempt {nxt.attempt} started{gap}")
        elif decision is not None:
            lines.append(f"detlaunch:     -> {decision.why}")
    return lines


# -- what each attempt's ranks see, and where their logs go ----------------------------------


def attempt_env(attempt: int, max_restarts: int | None = None) -> dict[str, str]:
    """Variables every rank of `attempt` (1 for the first) sees: the number of restarts so far.

    TORCHELASTIC_RESTART_COUNT too, for scripts written for torchrun (torchrun's own count is per
    node and its agent sets it in the workers' environment, over ours: the rank wrapper must set
    these in front of the rank). DETLAUNCH_MAX_RESTARTS is not set: it is detlaunch's own option
    variable and would configure a detlaunch nested in the job.
    """
    if attempt < 1:
        raise ValueError(f"attempts count from 1, not {attempt}")
    env = {RESTART_COUNT_ENV: str(attempt - 1), TORCHELASTIC_RESTART_COUNT_ENV: str(attempt - 1)}
    if max_restarts is not None:
        env[TORCHELASTIC_MAX_RESTARTS_ENV] = str(max_restarts)
    return env


def attempt_log_dir(log_dir: str, attempt: int, restarts_enabled: bool) -> str:
    """The folder for one attempt's logs under --log-dir: LOG_DIR/attempt-N, or LOG_DIR itself
    when restarts are off (rank-R.log stays where it always was, for every script reading it).

    With restarts on, the first attempt has its folder too: a job's layout follows its options,
    never its outcome, so a tool reading the logs needs no "did it restart?" branch.
    """
    return os.path.join(log_dir, f"attempt-{attempt}") if restarts_enabled else log_dir


def rank_log_path(log_dir: str, rank: int, attempt: int, restarts_enabled: bool) -> str:
    return os.path.join(attempt_log_dir(log_dir, attempt, restarts_enabled), f"rank-{rank}.log")


# -- options ---------------------------------------------------------------------------------

_KINDS = {k.value for k in FailureClass}
_CLASS_NAME = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*$")


def parse_item(text: str) -> Item:
    """One entry of --restart-on / --no-restart-on: an exit code, SIGNAME (as 128+N), a kind, a class."""
    text = text.strip()
    if text.isdigit():
        code = int(text)
        if code > 255:
            raise ValueError(f"exit code {code} is more than 255")
        return code
    if text.upper().startswith("SIG") and text.upper() in signals.Signals.__members__:
        return 128 + signals.Signals[text.upper()].value
    kind = text.lower().replace("_", "-")
    if kind in _KINDS:
        return kind
    if _CLASS_NAME.match(text):
        return text
    raise ValueError(text)


def item_list(text: str) -> tuple[Item, ...]:
    return tuple(parse_item(t) for t in text.split(",") if t.strip())


item_list.__name__ = "list of exit codes (3, SIGKILL), failure kinds (" + ", ".join(sorted(_KINDS)) + \
    ") or exception classes (ValueError)"


T = TypeVar("T")


def _checked(name: str, convert: Callable[[str], T], ok: Callable[[T], bool]) -> Callable[[str], T]:
    """An argparse type: convert, then check; `name` is what the error line calls a valid value."""
    def parse(text: str) -> T:
        value = convert(text)
        if not ok(value):
            raise ValueError(text)
        return value

    parse.__name__ = name
    return parse


# The numeric restart options, part of config.NUMBERS (their one definition: default and range). Bounded
# so that no wait overflows a timer (select refuses ~25 days) and no count is silly: a day, a million.
_D = RestartPolicy()
NUMBERS = {
    "max_restarts": Number(int, 0, 10**6, 0),
    "max_node_restarts": Number(int, 0, 10**6),
    "restart_backoff": Number(float, 0, 86400, _D.backoff_initial, "s"),
    "restart_backoff_max": Number(float, 0, 86400, _D.backoff_cap, "s"),
}
_exit_code = _checked("exit code", int, lambda v: 1 <= v <= 255)


def optional_exit_code(text: str) -> int | None:
    return None if text.strip().lower() in ("none", "off", "") else _exit_code(text)


optional_exit_code.__name__ = "exit code (1-255, or none)"


def add_restart_options(parser: argparse.ArgumentParser) -> None:
    """The restart options, as a group of the main parser (config.build_parser calls this)."""
    d, n = RestartPolicy(), NUMBERS
    g = parser.add_argument_group("restarts (job-wide, decided by the chief; see docs/RESTARTS.md)")
    g.add_argument("--max-restarts", type=n["max_restarts"], default=n["max_restarts"].default, metavar="N",
                   help="restart the whole job on every node at most N times after a failure (default 0: off)")
    g.add_argument("--max-node-restarts", type=n["max_node_restarts"], metavar="N",
                   help="restarts after a lost node, counted apart (default: as many as --max-restarts); the node's "
                   "detlaunch, started again, must join within --start-timeout")
    g.add_argument("--restart-on", type=item_list, default=(), metavar="LIST",
                   help="also restart on these: exit codes, SIGNAMEs, kinds (user-error, start-failure...) "
                   "or exception classes, comma-separated")
    g.add_argument("--no-restart-on", type=item_list, default=(), metavar="LIST",
                   help="never restart on these (same forms as --restart-on)")
    g.add_argument("--no-restart-exit-code", type=optional_exit_code, default=d.no_restart_exit_code, metavar="N",
                   help=f"a rank exiting with N asks not to be restarted (default {d.no_restart_exit_code}; none: off)")
    g.add_argument("--restart-backoff", type=n["restart_backoff"], default=d.backoff_initial, metavar="S",
                   help=f"wait before the first restart, doubled for each next one (default {d.backoff_initial:g})")
    g.add_argument("--restart-backoff-max", type=n["restart_backoff_max"], default=d.backoff_cap, metavar="S",
                   help=f"the longest wait between attempts (default {d.backoff_cap:g})")


def policy_from_options(options: Mapping[str, Any]) -> RestartPolicy:
    """The policy from parsed options (values as add_restart_options' types give them, or their text)."""
    d = RestartPolicy()

    def get(name: str, convert: Any, default: Any) -> Any:
        value = options.get(name)
        if value is None:
            return default
        if isinstance(value, str):  # from DETLAUNCH_* or a config file, not through the parser
            flag = "--" + name.replace("_", "-")
            try:
                return convert(str(value))
            except argparse.ArgumentTypeError as e:
                raise ConfigError(f"{flag} {value!r}: {e}") from None
            except ValueError:
                raise ConfigError(f"{flag} {value!r} is not a valid {convert.__name__}") from None
        return tuple(value) if convert is item_list else value

    return RestartPolicy(
        max_restarts=get("max_restarts", NUMBERS["max_restarts"], 0),
        max_node_restarts=get("max_node_restarts", NUMBERS["max_node_restarts"], None),
        restart_on=get("restart_on", item_list, ()),
        no_restart_on=get("no_restart_on", item_list, ()),
        no_restart_exit_code=d.no_restart_exit_code if "no_restart_exit_code" not in options
        else get("no_restart_exit_code", optional_exit_code, None),
        backoff_initial=get("restart_backoff", NUMBERS["restart_backoff"], d.backoff_initial),
        backoff_cap=get("restart_backoff_max", NUMBERS["restart_backoff_max"], d.backoff_cap),
    )


__all__ = [
    "AttemptEnd", "RestartDecision", "FailureClass", "RestartPolicy", "add_restart_options", "attempt_env",
    "attempt_log_dir", "classify", "format_attempts", "last_exception", "policy_from_options", "rank_log_path",
    "signature",
]
