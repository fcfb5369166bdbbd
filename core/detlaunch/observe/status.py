"""What `detlaunch status` shows: a snapshot of every rank, as data, JSON and a text table.

`JobStatus` and `RankState` are frozen data a supervisor builds from what it knows (its rank
registry, the events, the last output line of each rank) and ships over its socket and the job
link as JSON. Rendering is pure (the caller gives `now`), so the table is unit-tested.
`StatusTracker` builds them from the same events the log holds (so status, log and report
agree), plus what events do not carry: output and heartbeat times, and CPU and memory samples.
The CPU % and RSS columns come from `detlaunch.observe.sampler` (in the supervisor; this module, which
`detlaunch status` imports, stays free of psutil).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detlaunch.observe.events import Event

STATUS_VERSION = 1
STARTING, RUNNING, EXITED, STOPPED = "starting", "running", "exited", "stopped"
STATES = (STARTING, RUNNING, EXITED, STOPPED)
_MB = 1024 * 1024


class JobPhase(enum.StrEnum):
    """The job's phase as `detlaunch status` shows it, in order (a restart goes back to RUNNING).

    Read from the events (StatusTracker), so that status and the event log agree. Another fact than
    a node supervisor's Phase (node/phase.py): that is where one node's state machine is, with the
    steps of stopping, sweeping and closing only that supervisor acts on (--debug traces it).
    """

    STARTING = "starting"  # planned: no rank has started yet
    RUNNING = "running"  # a rank started (in this attempt)
    STOPPING = "stopping"  # the job is being stopped: a failure, a signal, or its end
    FINISHED = "finished"  # over


@dataclasses.dataclass(frozen=True)
class RankState:
    """One rank, now. Times are wall clock (seconds since the epoch); None: not known (yet).

    state: starting (registered, not yet running), running, exited (by itself: see exit_code or
    signal), stopped (detlaunch stopped it: a consequence of the job stopping, not a cause).
    cpu_percent and rss: of the rank's whole process tree (data loader workers included).
    straggler: the chief's mark once it named the rank a straggler ("0.50x (step)"; observe/stragglers.py).
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
    straggler: str | None = None

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"rank state {self.state!r} is not one of {', '.join(STATES)}")

    def describe_state(self) -> str:
        """``running``; ``exit 3`` or ``killed by SIGKILL``; ``stopped (exit 143)``."""
        if self.state not in (EXITED, STOPPED) or (self.state == STOPPED and self.exit_code is None
                                                   and not self.signal):
            return self.state
        from detlaunch.outcome import ProcessEnd  # not at import: only an ended rank needs it

        # An event's end: {"code": null, "signal": N} when a signal ended the rank.
        ended = (ProcessEnd.killed(self.signal) if self.signal else ProcessEnd(self.exit_code or 0)).describe()
        return ended if self.state == EXITED else f"stopped ({ended})"


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """The job as one node (or, on the chief, the whole job) sees it at `taken_at`.

    phase: where the job is: a JobPhase (or, from JSON, its text); from a node that could not
    answer, why not (cli/control.py shows it in the phase's place).
    root_cause: the root cause's one line, once there is one.
    hang_timeout: what --hang-timeout auto has learned ("auto: 60 s learned"), from the chief.
    spares: the spare nodes as the chief sees them ("node 3 (10.0.0.4) waiting"), from the chief.
    size: with --nnodes MIN:MAX, the nodes the job runs on now ("2 of 3 (--nnodes 2:3)"), from the chief.
    """

    job_id: str
    phase: str
    taken_at: float
    ranks: tuple[RankState, ...] = ()
    root_cause: str | None = None
    hang_timeout: str | None = None
    spares: tuple[str, ...] = ()
    size: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(sorted(self.ranks, key=lambda r: r.rank)))
        object.__setattr__(self, "spares", tuple(self.spares))

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


def merge(parts: list[JobStatus]) -> JobStatus:
    """The whole job from each node's status (the chief's first): its phase, every node's ranks."""
    chief = parts[0]
    return dataclasses.replace(chief, ranks=tuple(r for p in parts for r in p.ranks),
                               root_cause=next((p.root_cause for p in parts if p.root_cause), None))


RANK_FIELDS = frozenset(f.name for f in dataclasses.fields(RankState))
PHASES = tuple(JobPhase)  # in order


class StatusTracker:
    """A node's live `JobStatus`, kept up to date from its events, output lines and samples.

    Events change the rank rows; output and heartbeat times and samples (many, cheap) are kept
    apart in plain dicts and only joined to the rows when a snapshot is asked for.
    """

    def __init__(self, job_id: str) -> None:
        from detlaunch.observe.events import (
            EventKind,  # the supervisor's side only: `detlaunch status` does not load events.py
        )

        self.phase_of = {EventKind.JOB_PLANNED: JobPhase.STARTING, EventKind.RANK_STARTED: JobPhase.RUNNING,
                         EventKind.STOP_REQUESTED: JobPhase.STOPPING, EventKind.JOB_FINISHED: JobPhase.FINISHED}
        self.job_id = job_id
        self.phase = JobPhase.STARTING
        self.root_cause: str | None = None
        self.ranks: dict[int, RankState] = {}
        self.last_output: dict[int, float] = {}
        self.last_heartbeat: dict[int, float] = {}
        self.usage: dict[int, tuple[float | None, int | None]] = {}  # rank -> (cpu %, rss)

    def observe(self, event: Event) -> None:
        """Apply one event (any kind; those that say nothing about status change nothing)."""
        from detlaunch.observe.events import EventKind

        d, rank = event.details, event.rank
        phase = self.phase_of.get(event.kind)
        if phase and PHASES.index(phase) > PHASES.index(self.phase):
            self.phase = phase
        if event.kind == EventKind.ROOT_CAUSE:
            self.root_cause = str(d.get("what", ""))
        elif event.kind == EventKind.ATTEMPT_STARTED and int(d.get("attempt", 0)) > 0:
            self.phase = JobPhase.RUNNING
            self.ranks = {r: dataclasses.replace(s, restarts=s.restarts + 1) for r, s in self.ranks.items()}
        if rank is None:
            return
        was = self.ranks.get(rank) or RankState(rank, event.node, str(d.get("host", "")))
        if event.kind == EventKind.RANK_REGISTERED:
            self.ranks[rank] = dataclasses.replace(was, node=event.node, host=str(d.get("host", was.host)),
                                                   state=STARTING, exit_code=None, signal=None, ended_at=None)
        elif event.kind == EventKind.RANK_STARTED:
            self.ranks[rank] = dataclasses.replace(was, pid=d.get("pid"), state=RUNNING, started_at=event.time)
        elif event.kind == EventKind.RANK_EXITED:
            self.ranks[rank] = dataclasses.replace(was, state=STOPPED if d.get("stopped") else EXITED,
                                                   exit_code=d.get("code"), signal=d.get("signal"),
                                                   ended_at=d.get("wall", event.time))
            self.usage.pop(rank, None)  # its processes are gone

    def answer(self, host: str, last_seen: Mapping[int, tuple[float | None, float | None]],
               root_cause: str | None, restarts: int, now: float) -> dict[str, Any]:
        """This node's part of `detlaunch status`, ready for JSON: the snapshot at `now` and what the
        supervisor knows beyond the events (each rank's last output line and heartbeat, from its
        progress records; the verdict's root cause; the restarts so far)."""
        for rank, (output, beat) in last_seen.items():
            if output is not None:
                self.last_output[rank] = output
            if beat is not None:
                self.last_heartbeat[rank] = beat
        snapshot = self.snapshot(now)
        return {"host": host, "phase": snapshot.phase, "taken_at": snapshot.taken_at,
                "root_cause": snapshot.root_cause if root_cause is None else root_cause,
                "ranks": [{**dataclasses.asdict(r), "restarts": restarts} for r in snapshot.ranks]}

    def snapshot(self, now: float) -> JobStatus:
        """The status at `now` (wall clock)."""
        rows = []
        for rank, row in self.ranks.items():
            cpu, rss = self.usage.get(rank, (None, None))
            rows.append(dataclasses.replace(row, last_output=self.last_output.get(rank),
                                            last_heartbeat=self.last_heartbeat.get(rank), cpu_percent=cpu, rss=rss))
        return JobStatus(self.job_id, self.phase, now, tuple(rows), self.root_cause)


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
    if status.hang_timeout:
        lines.append(f"hang timeout: {status.hang_timeout}")
    if status.size:
        lines.append(f"nodes: {status.size}")
    if status.spares:
        lines.append(f"spares: {'; '.join(status.spares)}")
    columns: tuple[str, ...] = COLUMNS
    rows: list[tuple[str, ...]] = [_row(r, now) for r in status.ranks]
    if any(r.straggler for r in status.ranks):  # the column appears once the chief has named one
        columns = (*COLUMNS, "STRAGGLER")
        rows = [(*row, r.straggler or "-") for row, r in zip(rows, status.ranks, strict=True)]
    rows = [columns, *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    for row in rows:
        cells = (cell.rjust(w) if name in _RIGHT else cell.ljust(w) for cell, w, name in zip(row, widths, columns,
                                                                                           strict=True))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


CLEAR_AND_HOME = "\x1b[H\x1b[2J"


def watch_frame(text: str, tty: bool) -> str:
    """One refresh of ``--watch``: drawn in place on a terminal; on a pipe or file, appended as is
    (escape codes would only be noise there), a blank line between frames."""
    return CLEAR_AND_HOME + text if tty else text + "\n"
