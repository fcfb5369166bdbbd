"""The verdict: which failure is the job's root cause, and the exit code every node exits with.

Pure: no I/O, no clock of its own. The supervisor feeds it typed events (`VerdictEvent`: a rank's end, a child's
exit, a lost node, an interrupt, a start failure, the chief's decision) and acts on each
:class:`Decision`. The rules, in order:

1. The chief's verdict is final on a worker: it replaces whatever the worker thought, and nothing
   local changes it afterwards (the chief saw every node's reports).
2. The user's interrupt stands: after it, no failure becomes the cause (the ranks are being
   stopped on purpose). A failure recorded before it stays the cause and gives the exit code.
3. The earliest failure anywhere wins. The first one stops the job at once; one reported later,
   by a rank detlaunch had not asked to stop, replaces it when it happened earlier (on two nodes a
   survivor's collective error can arrive before the report of the rank whose death caused it).
4. A launcher's exit and a start failure never replace a cause already recorded: a rank's
   report, read before its launcher's exit, wins (the launcher only passes the failure on).
"""

from __future__ import annotations

import dataclasses
import enum

import detlaunch.exit_codes as exit_codes
from detlaunch.outcome import Failure, FailureKind, ProcessEnd, RankStatus, signal_name


@dataclasses.dataclass(frozen=True)
class RankEnded:
    """A rank's end, as its wrapper (or its lost connection) told it; here or on another node."""

    status: RankStatus


@dataclasses.dataclass(frozen=True)
class ChildExited:
    """A process the supervisor started ended while the job ran: a launcher (non-zero) or a daemon."""

    name: str
    pid: int
    end: ProcessEnd
    daemon: bool
    node: int
    at: float


@dataclasses.dataclass(frozen=True)
class NodeLost:
    """Chief: a worker node's supervisor vanished (closed its link, or stopped sending heartbeats)."""

    node: int
    addr: str
    why: str
    at: float


@dataclasses.dataclass(frozen=True)
class ChiefLost:
    """Worker: the chief's supervisor vanished before the job ended."""

    addr: str
    why: str
    node: int
    at: float


@dataclasses.dataclass(frozen=True)
class Interrupted:
    """This node's detlaunch got a stop signal from the user."""

    signum: int
    node: int
    at: float


@dataclasses.dataclass(frozen=True)
class StartFailed:
    """The job could not start on this node (setup failed, a peer never answered, a timeout, the preflight)."""

    what: str
    node: int
    at: float
    exit_code: int = exit_codes.FAILED


@dataclasses.dataclass(frozen=True)
class RemoteFailure:
    """Chief: a worker node's own failure (not a rank's end), as that node described it."""

    failure: Failure


@dataclasses.dataclass(frozen=True)
class ChiefVerdict:
    """Worker: the chief's decision for the job (None: the job ended cleanly)."""

    failure: Failure | None


@dataclasses.dataclass(frozen=True)
class Hung:
    """Chief: no rank of the job, on any node, showed progress for `idle` seconds (>= --hang-timeout)."""

    timeout: float
    idle: float
    suspects: tuple[str, ...]  # "rank 1 (node 0): SIGSTOPped"
    stacks: tuple[str, ...]  # every rank's stack, grouped (stacks/groups.format_text)
    node: int
    at: float
    learned: bool = False  # --hang-timeout auto: `timeout` is the learned limit


@dataclasses.dataclass(frozen=True)
class StuckAfterTraceback:
    """A rank printed an uncaught Python traceback and had not exited `delay` seconds later (atexit, a thread)."""

    rank: int
    node: int
    host: str
    tail: tuple[str, ...]  # its stderr, the traceback in it
    delay: float
    at: float  # when it printed the traceback


# What the verdict is fed (not observe/events.Event, the record of what happened that observers get).
VerdictEvent = (RankEnded | ChildExited | NodeLost | ChiefLost | Interrupted | StartFailed | RemoteFailure
                | ChiefVerdict | Hung | StuckAfterTraceback)


class Decision(enum.Enum):
    """What an event changed: the supervisor stops the job on FIRST and tells the chief on EARLIER."""

    FIRST = "first"  # the first failure (or interrupt): stop the job, say why
    EARLIER = "earlier"  # an earlier failure replaced the cause
    IGNORED = "ignored"  # not a failure, or not the cause


def as_failure(event: VerdictEvent) -> Failure | None:
    """The failure an event stands for, as this node's report shows it.

    A rank's clean end, or one detlaunch asked for, is none.
    """
    match event:
        case RankEnded(status=s):
            if not s.failed or s.stopped:
                return None
            how = f"exited with code {s.exit_code}" if not s.signal and not s.lost else s.describe()
            return Failure(f"rank {s.rank} on node {s.node_rank} ({s.host}) {how}", s.exit_code or exit_codes.FAILED,
                           rank=s, tail=s.tail, tail_of=f"rank {s.rank}", at=s.wall, kind=FailureKind.RANK)
        case ChildExited(daemon=True):
            return Failure(f"{event.name} (pid {event.pid}) ended before the job did: {event.end.describe()}",
                           event.end.code or exit_codes.FAILED, tail_of=event.name, at=event.at,
                           kind=FailureKind.DAEMON)
        case ChildExited():
            if event.end.ok:
                return None
            return Failure(f"{event.name} exited: {event.end.describe()} "
                           "(no rank on this node reported a failure first)", event.end.code,
                           tail_of=event.name, at=event.at, kind=FailureKind.LAUNCHER)
        case NodeLost():
            return Failure(f"lost node {event.node} ({event.addr}): {event.why}", exit_codes.FAILED, at=event.at,
                           kind=FailureKind.NODE_LOST)
        case ChiefLost():
            return Failure(f"lost the chief ({event.addr}): {event.why}", exit_codes.FAILED, at=event.at,
                           kind=FailureKind.CHIEF_LOST)
        case Interrupted():
            return Failure(f"node {event.node} was interrupted by {signal_name(event.signum)}",
                           exit_codes.by_signal(event.signum), at=event.at, kind=FailureKind.INTERRUPTED)
        case StartFailed():
            return Failure(event.what, event.exit_code, at=event.at, kind=FailureKind.START)
        case Hung():
            who = "; ".join(event.suspects) or "none stands out (see the stacks)"
            limit = f"auto, learned {event.timeout:g}" if event.learned else f"{event.timeout:g}"
            return Failure(f"the job hung: no rank showed progress for {event.idle:.1f} s (--hang-timeout "
                           f"{limit}); suspect: {who}", exit_codes.HANG, tail=event.stacks,
                           tail_of="every rank's stack", at=event.at, kind=FailureKind.HANG)
        case StuckAfterTraceback():
            status = RankStatus(rank=event.rank, node_rank=event.node, exit_code=None, tail=event.tail,
                                wall=event.at, host=event.host)
            return Failure(f"rank {event.rank} on node {event.node} ({event.host}) printed a traceback and had "
                           f"not exited {event.delay:g} s later", exit_codes.FAILED, rank=status, tail=event.tail,
                           tail_of=f"rank {event.rank}", at=event.at, kind=FailureKind.RANK)
        case RemoteFailure():
            return event.failure
        case ChiefVerdict():
            return event.failure
    raise TypeError(f"not a verdict event: {event!r}")  # pragma: no cover


def naming_the_node(failure: Failure, node: int) -> Failure:
    """The failure as the chief will show it: a launcher's, a daemon's or a start failure does not
    name its node by itself ("node 1: torchrun exited: exit 1 ...")."""
    if failure.kind in (FailureKind.LAUNCHER, FailureKind.DAEMON, FailureKind.START):
        return dataclasses.replace(failure, what=f"node {node}: {failure.what}")
    return failure


class Verdict:
    """The job's root cause so far, and the exit code it gives."""

    def __init__(self) -> None:
        self.failure: Failure | None = None
        self.cause: VerdictEvent | None = None  # the event behind `failure`
        self.interrupted_by: int | None = None
        self.decided_by_chief = False

    def add(self, event: VerdictEvent) -> Decision:
        if isinstance(event, ChiefVerdict):
            first = not self.decided_by_chief
            self.decided_by_chief = True
            if event.failure is not None:
                self.failure, self.cause = event.failure, event
            return Decision.FIRST if first else Decision.EARLIER
        if self.decided_by_chief:
            return Decision.IGNORED
        if isinstance(event, Interrupted):
            if self.interrupted_by is not None:
                return Decision.IGNORED
            self.interrupted_by = event.signum
            return Decision.FIRST if self.failure is None else Decision.IGNORED
        if self.interrupted_by is not None:
            return Decision.IGNORED
        failure = as_failure(event)
        if failure is None:
            return Decision.IGNORED
        if self.failure is None:
            self.failure, self.cause = failure, event
            return Decision.FIRST
        weak = failure.kind in (FailureKind.LAUNCHER, FailureKind.START)
        if not weak and failure.at < self.failure.at:
            self.failure, self.cause = failure, event
            return Decision.EARLIER
        return Decision.IGNORED

    @property
    def stopping(self) -> bool:
        """Whether the job is ending for a reason other than its ranks' clean exits."""
        return self.failure is not None or self.interrupted_by is not None

    @property
    def exit_code(self) -> int:
        if self.failure is not None:
            return self.failure.exit_code
        if self.interrupted_by is not None:
            return exit_codes.by_signal(self.interrupted_by)
        return exit_codes.OK
