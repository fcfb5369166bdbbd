"""What `detlaunch status` shows: a snapshot of every rank, as data, JSON and a text table.

`JobStatus` and `RankState` are frozen data a supervisor builds from what it knows (its rank
registry, the events, the last output line of each rank) and ships over its socket and the job
link as JSON. Rendering is pure (the caller gives `now`), so the table is unit-tested.
The CPU % and RSS columns come from `detlaunch.sampler` (in the supervisor; this module, which
`detlaunch status` imports, stays free of psutil).
"""

from __future__ import annotations

import dataclasses
import json

from .report import describe_exit

STATUS_VERSION = 1
STARTING, RUNNING, EXITED, STOPPED = "starting", "running", "exited", "stopped"
STATES = (STARTING, RUNNING, EXITED, STOPPED)
_MB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class RankState:
    """One rank, now. Times are wall clock (seconds since the epoch); None: not known (yet).

    state: starting (registered, not yet running), running, exited (by itself: see exit_code or
    signal), stopped (detlaunch stopped it: a consequence of the job stopping, not a cause).
    cpu_percent and rss: of the rank's whole process tree (data loader workers included).
    """

    rank: int
    node: int
    host: str
    pid: int | None = None
    state: str = STARTING
    exit_code: int | None = None
    signal: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    last_output: float | None = None
    last_heartbeat: float | None = None
    cpu_percent: float | None = None
    rss: int | None = None
    restarts: int = 0

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"rank state {self.state!r} is not one of {', '.join(STATES)}")

    def describe_state(self) -> str:
        """``running``; ``exit 3`` or ``killed by SIGKILL``; ``stopped (exit 143)``."""
        if self.state == EXITED:
            return describe_exit(self.exit_code, self.signal)
        if self.state == STOPPED and (self.exit_code is not None or self.signal):
            return f"stopped ({describe_exit(self.exit_code, self.signal)})"
        return self.state


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """The job as one node (or, on the chief, the whole job) sees it at `taken_at`.

    phase: the supervisor's phase (starting, running, stopping, finished).
    root_cause: the root cause's one line, once there is one.
    """

    job_id: str
    phase: str
    taken_at: float
    ranks: tuple[RankState, ...] = ()
    root_cause: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(sorted(self.ranks, key=lambda r: r.rank)))

    def to_json(self) -> str:
        obj = {"v": STATUS_VERSION, **dataclasses.asdict(self)}
        return json.dumps(obj, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> JobStatus:
        """Parse `to_json`'s output; ValueError says what is wrong."""
        try:
            obj = json.loads(text)
            if not isinstance(obj, dict) or obj.pop("v", None) != STATUS_VERSION:
                raise ValueError(f"not a status of version {STATUS_VERSION}")
            ranks = tuple(RankState(**r) for r in obj.pop("ranks"))
            return cls(**obj, ranks=ranks)
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"malformed status: {e}") from None


def format_duration(seconds: float) -> str:
    """``3.2s``, ``12m03s``, ``5h07m``."""
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def format_age(then: float | None, now: float) -> str:
    return "-" if then is None else f"{format_duration(now - then)} ago"


COLUMNS = ("NODE", "HOST", "RANK", "PID", "STATE", "RUN TIME", "LAST OUTPUT", "HEARTBEAT", "CPU %", "RSS MB",
           "RESTARTS")
_RIGHT = {"RANK", "PID", "RUN TIME", "CPU %", "RSS MB", "RESTARTS"}


def _row(r: RankState, now: float) -> tuple[str, ...]:
    run = "-" if r.started_at is None else format_duration((r.ended_at or now) - r.started_at)
    return (str(r.node), r.host, str(r.rank), "-" if r.pid is None else str(r.pid), r.describe_state(), run,
            format_age(r.last_output, now), format_age(r.last_heartbeat, now),
            "-" if r.cpu_percent is None else f"{r.cpu_percent:.1f}",
            "-" if r.rss is None else f"{r.rss / _MB:.1f}", str(r.restarts))


def render_table(status: JobStatus, now: float) -> str:
    """The table `detlaunch status` prints: a header line, the root cause if any, a row per rank."""
    nodes = len({r.node for r in status.ranks})
    lines = [f"job {status.job_id}: {status.phase}, {len(status.ranks)} rank(s) on {nodes} node(s)"]
    if status.root_cause:
        lines.append(f"root cause: {status.root_cause}")
    rows = [COLUMNS, *(_row(r, now) for r in status.ranks)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        cells = (cell.rjust(w) if name in _RIGHT else cell.ljust(w) for cell, w, name in zip(row, widths, COLUMNS,
                                                                                           strict=True))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


CLEAR_AND_HOME = "\x1b[H\x1b[2J"


def watch_frame(text: str, tty: bool) -> str:
    """One refresh of ``--watch``: drawn in place on a terminal; on a pipe or file, appended as is
    (escape codes would only be noise there), a blank line between frames."""
    return CLEAR_AND_HOME + text if tty else text + "\n"
