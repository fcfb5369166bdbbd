"""A job's story, from its events: its attempts, nodes and ranks, each rank's span in each attempt, the marks
(failures, stops, lost nodes, a hang) and the windows between (backoff, no progress). Pure.

The page (story_html.py) and the trace (story_trace.py) draw this; neither reads an event. Its words are
the ones `detlaunch status` and the end report use, by their own functions: a rank's state is
`RankState.describe_state` of a `StatusTracker` fed that attempt's events (status.py), its note
`report.rank_note`, and the report under the timeline is `report.format_attempts` + `format_report` of the
`JobResult` the events describe (the root cause's lines and the stacks travel in `root_cause`'s details,
each attempt's class and cause in the chief's `attempt_ended`).
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Sequence

from detlaunch.exit_codes import by_signal
from detlaunch.observe.events import Event, EventKind
from detlaunch.observe.report import format_attempts, format_report, rank_note
from detlaunch.observe.status import RankState, StatusTracker
from detlaunch.observe.story_read import Foreign, Reading
from detlaunch.outcome import AttemptEnd, Failure, FailureKind, JobResult, RankStatus, RestartClass

K = EventKind
# Kinds the page draws as spans and bands, or says in its header and report: no mark of their own.
SPANS_AND_BANDS = frozenset({K.JOB_PLANNED, K.RANK_REGISTERED, K.RANK_STARTED, K.RANK_EXITED, K.ATTEMPT_STARTED,
                             K.ATTEMPT_ENDED, K.JOB_FINISHED})


@dataclasses.dataclass(frozen=True)
class Span:
    """One rank in one attempt: registered, started, ended (None: not seen), in status's and the report's words."""

    rank: int
    node: int
    attempt: int  # 1 for the first
    registered: float | None
    state: RankState
    status: RankStatus | None  # its end, as the report reads it (None: no end in the logs)
    note: str = ""  # report.rank_note: " (root cause)", " (stopped by detlaunch)"...
    cause: bool = False  # the failure that ended its attempt
    words: str = ""  # its state as `detlaunch status` says it (RankState.describe_state)

    def __post_init__(self) -> None:
        if not self.words:
            object.__setattr__(self, "words", self.state.describe_state())

    @property
    def start(self) -> float | None:
        return self.state.started_at or self.registered

    @property
    def outcome(self) -> str:
        """The span's class on the page: ok, failed, stopped, killed, running."""
        s = self.status
        if s is None:
            return "running"
        if s.killed or s.lost:
            return "killed"
        if s.stopped:
            return "stopped"
        return "ok" if not s.failed else "failed"


@dataclasses.dataclass(frozen=True)
class Mark:
    """Something that happened at one moment: on a rank's lane (rank set) or its node's."""

    time: float
    node: int
    rank: int | None
    kind: str  # failure, cause, stop, sigkill, joined, lost, replaced, launcher, sshd, or a foreign kind
    text: str


@dataclasses.dataclass(frozen=True)
class Window:
    """A stretch of the job: an attempt, the backoff before the next, the silence before a hang."""

    start: float
    end: float
    kind: str  # attempt, backoff, hang
    text: str


@dataclasses.dataclass
class Node:
    node: int
    host: str = ""
    logged: bool = False  # its own log was read (it holds its ranks' events)
    lost: bool = False


@dataclasses.dataclass
class Story:
    job_id: str = ""
    layer: str = ""
    planned_nodes: int = 0
    planned_ranks: int = 0
    start: float = 0.0
    end: float = 0.0
    exit_code: int | None = None  # None: the logs never say the job finished
    root_cause: str | None = None
    nodes: dict[int, Node] = dataclasses.field(default_factory=dict)
    spans: dict[int, list[Span]] = dataclasses.field(default_factory=dict)  # rank -> its spans, by attempt
    attempts: list[Window] = dataclasses.field(default_factory=list)
    windows: list[Window] = dataclasses.field(default_factory=list)  # backoffs and hangs
    marks: list[Mark] = dataclasses.field(default_factory=list)
    report: list[str] = dataclasses.field(default_factory=list)
    problems: str | None = None
    files: list[str] = dataclasses.field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.spans)

    @property
    def verdict(self) -> str:
        """The headline: finished, failed (and how), or what the logs do not say."""
        if self.exit_code is None:
            return "the logs end before the job did"
        if self.exit_code == 0:
            return "finished (exit 0)"
        return f"failed: {self.root_cause} (exit {self.exit_code})" if self.root_cause else \
            f"ended with exit code {self.exit_code}"

    def end_of(self, span: Span) -> float:
        """Where a span ends on the timeline: the rank's end, else (no end in the logs: a lost node's rank, a log
        cut short) its attempt's."""
        if span.state.ended_at:
            return span.state.ended_at
        band = self.attempts[span.attempt - 1] if 0 < span.attempt <= len(self.attempts) else None
        return band.end if band else self.end

    def missing_logs(self) -> list[int]:
        """Nodes of the job whose own log was not read: their ranks are not on the page."""
        return [n for n in range(self.planned_nodes) if not (n in self.nodes and self.nodes[n].logged)]


def build(reading: Reading) -> Story:
    """The story the events of `reading` tell (merged by time, any number of nodes' logs)."""
    story = Story(problems=reading.summary(), files=list(reading.files))
    events = reading.events
    if not events and not reading.foreign:
        return story
    times = [e.time for e in events] + [f.time for f in reading.foreign]
    story.start, story.end = min(times), max(times)
    attempt_of: dict[int, int] = {}  # node -> its attempt now (1 for the first)
    trackers: dict[int, StatusTracker] = {}
    registered: dict[tuple[int, int], float] = {}
    exits: dict[tuple[int, int], RankStatus] = {}
    failures: dict[int, Event] = {}  # attempt -> its earliest failure
    ended: dict[int, Event] = {}  # attempt -> its chief's attempt_ended
    started: dict[int, float] = {}
    root: Event | None = None
    finished: Event | None = None
    stop_reasons: list[str] = []
    for e in events:
        d = e.details
        node = story.nodes.get(e.node) or story.nodes.setdefault(e.node, Node(e.node))
        attempt = attempt_of.get(e.node, 1)
        if e.kind is K.JOB_PLANNED:
            story.job_id, story.layer = e.job_id, str(d.get("layer", ""))
            story.planned_nodes = max(story.planned_nodes, int(d.get("nodes", 0)))
            story.planned_ranks = max(story.planned_ranks, int(d.get("ranks", 0)))
            node.logged = True
        elif e.kind is K.ATTEMPT_STARTED:
            attempt = attempt_of[e.node] = int(d.get("attempt", 0)) + 1
            started[attempt] = min(started.get(attempt, e.time), e.time)
        elif e.kind is K.ATTEMPT_ENDED:
            if attempt not in ended or e.node == 0:
                ended[attempt] = e
        elif e.kind is K.RANK_REGISTERED and e.rank is not None:
            node.host = str(d.get("host") or node.host)
            registered[(attempt, e.rank)] = e.time
        elif e.kind is K.RANK_EXITED and e.rank is not None:
            exits[(attempt, e.rank)] = rank_status(e, node.host)
        elif e.kind is K.FAILURE:
            was = failures.get(attempt)
            if was is None or float(d.get("at", e.time)) < float(was.details.get("at", was.time)):
                failures[attempt] = e
        elif e.kind is K.ROOT_CAUSE and (root is None or e.node == 0):
            root = e
        elif e.kind is K.JOB_FINISHED and (finished is None or e.node == 0):
            finished = e
        elif e.kind is K.STOP_REQUESTED:
            stop_reasons.append(str(d.get("reason", "")))
        if e.rank is not None and e.kind in (K.RANK_REGISTERED, K.RANK_STARTED, K.RANK_EXITED):
            tracker = trackers.get(attempt) or trackers.setdefault(attempt, StatusTracker(e.job_id))
            tracker.observe(e)
        _mark(story, e)
    for f in reading.foreign:
        story.nodes.setdefault(f.node, Node(f.node))
        story.marks.append(foreign_mark(f))
    _attempts(story, started, ended, finished)
    causes = {a: e.rank for a, e in failures.items() if e.rank is not None}
    last = max([1, *trackers, *started])
    for attempt, tracker in sorted(trackers.items()):
        failure = _failure(failures.get(attempt), root if attempt == last else None, exits, attempt)
        for rank, state in tracker.ranks.items():
            status = exits.get((attempt, rank))
            note = rank_note(status, failure) if status else ""
            story.spans.setdefault(rank, []).append(Span(rank, state.node, attempt, registered.get((attempt, rank)),
                                                         state, status, note, causes.get(attempt) == rank))
    if root is not None:
        story.root_cause = str(root.details.get("what", ""))
    if finished is not None:
        story.exit_code = int(finished.details.get("exit_code", 0))
        failure = _failure(failures.get(last), root, exits, last)
        result = JobResult(story.exit_code, tuple(s.status for s in _last_spans(story, last) if s.status),
                           failure=failure if root is not None else None,
                           interrupted_by=_signal_of(stop_reasons) if root is None else None,
                           duration=float(finished.details.get("duration", 0.0)),
                           stacks=tuple(str(x) for x in root.details.get("stacks") or ()) if root else ())
        story.report = [line.removeprefix("detlaunch: ") for line in
                        [*_attempt_lines(story, ended), *format_report(result)]]
    return story


def rank_status(e: Event, host: str) -> RankStatus:
    """A rank's end as the report reads it, from its rank_exited event."""
    d = e.details
    sig = d.get("signal")
    code = d.get("code")
    return RankStatus(rank=int(e.rank or 0), node_rank=e.node,
                      exit_code=by_signal(int(sig)) if sig else int(code or 0), signal=int(sig) if sig else None,
                      wall=float(d.get("wall", e.time)), host=host, stopped=bool(d.get("stopped")),
                      killed=bool(d.get("killed")), lost=bool(d.get("lost")), ended=str(d.get("ended") or ""),
                      teardown_signal=int(d["teardown_signal"]) if d.get("teardown_signal") else None)


def _failure(failure: Event | None, root: Event | None, exits: dict[tuple[int, int], RankStatus],
             attempt: int) -> Failure | None:
    """The Failure the report reads for an attempt: the job's root cause for the last, else its earliest failure."""
    e = root or failure
    if e is None:
        return None
    d = e.details
    status = exits.get((attempt, e.rank)) if e.rank is not None else None
    if status is not None and "tail" not in d:  # a log without the lines: said as for a rank that sent none
        status = dataclasses.replace(status, lost=True)
    try:
        kind = FailureKind(str(d.get("failure_kind") or (FailureKind.RANK if e.rank is not None
                                                         else FailureKind.START)))
    except ValueError:
        kind = FailureKind.START
    return Failure(str(d.get("what", "")), int(d.get("exit_code", 1)), rank=status,
                   tail=tuple(str(x) for x in d.get("tail") or ()), tail_of=str(d.get("tail_of") or ""),
                   at=float(d.get("at", e.time)), kind=kind)


def _last_spans(story: Story, attempt: int) -> list[Span]:
    return [s for spans in story.spans.values() for s in spans if s.attempt == attempt]


def _signal_of(reasons: Sequence[str]) -> int | None:
    """The user's signal a stop_requested names (`signal SIGINT`), for the report's "interrupted by"."""
    for reason in reasons:
        if reason.startswith("signal "):
            try:
                return int(signal.Signals[reason.split(" ", 1)[1]])
            except KeyError:
                return None
    return None


def _attempts(story: Story, started: dict[int, float], ended: dict[int, Event], finished: Event | None) -> None:
    """The attempts as bands (one, the whole job, when restarts were off), and the backoffs between them."""
    if not started:
        story.attempts.append(Window(story.start, finished.time if finished else story.end, "attempt", "attempt 1"))
        return
    for n in sorted(started):
        end = ended[n].time if n in ended else (started[n + 1] if n + 1 in started else story.end)
        code = ended[n].details.get("exit_code") if n in ended else None
        how = "" if code is None else f": exit {code}"
        story.attempts.append(Window(started[n], end, "attempt", f"attempt {n}{how}"))
        if n + 1 in started and n in ended:
            story.windows.append(Window(ended[n].time, started[n + 1], "backoff",
                                        f"backoff: attempt {n + 1} started "
                                        f"{started[n + 1] - ended[n].time:.1f} s later"))


def _attempt_lines(story: Story, ended: dict[int, Event]) -> list[str]:
    """report.format_attempts of the attempts the chief's attempt_ended events describe (restarts on)."""
    if not ended or any("class" not in e.details for e in ended.values()):
        return []
    history = []
    for n, e in sorted(ended.items()):
        d = e.details
        band = story.attempts[n - 1] if n - 1 < len(story.attempts) else None
        history.append(AttemptEnd(n, RestartClass(d["class"]) if d.get("class") else None, int(d.get("exit_code", 0)),
                                  signature=str(d.get("signature") or ""), what=str(d.get("what") or ""),
                                  exception=str(d.get("exception") or ""),
                                  started_at=float(d.get("started_at") or (band.start if band else 0.0)),
                                  ended_at=float(d.get("ended_at") or e.time)))
    why = ended[max(ended)].details.get("next")
    return format_attempts(history, str(why) if why else None)


def _mark(story: Story, e: Event) -> None:
    d = e.details
    text = None
    kind = e.kind.value
    if e.kind is K.FAILURE:
        text, kind = f"failure: {d.get('what', '')}", "failure"
    elif e.kind is K.ROOT_CAUSE:
        text, kind = f"root cause: {d.get('what', '')}", "cause"
    elif e.kind is K.STOP_REQUESTED:
        text, kind = f"node {e.node} stops the job ({d.get('reason', '')})", "stop"
    elif e.kind is K.SIGKILL_SENT:
        text, kind = f"SIGKILL sent to {len(d.get('pids') or ())} process(es) left after the grace period", "sigkill"
    elif e.kind is K.NODE_LOST:
        story.nodes[e.node].lost = True
        text, kind = f"node {e.node} ({d.get('host', '')}) lost: {d.get('reason', '')}", "lost"
    elif e.kind is K.NODE_JOINED:
        node = story.nodes[e.node]
        host = str(d.get("host", ""))
        if node.lost and node.host and host != node.host:
            text, kind = f"node {e.node}: {host} took the place of {node.host}", "replaced"
        else:
            text, kind = f"node {e.node} ({host}) joined" + (" again" if node.lost else ""), "joined"
        node.host, node.lost = host or node.host, False
    elif e.kind is K.LAUNCHER_STARTED:
        text, kind = f"{d.get('name', '')} started (pid {d.get('pid', '?')})", "launcher"
    elif e.kind is K.SSHD_READY:
        text, kind = f"sshd ready on {d.get('host', '')}:{d.get('port', '')}", "sshd"
    elif e.kind is K.HANG_DETECTED:
        silent = float(d.get("silent_for", 0.0))
        story.windows.append(Window(e.time - silent, e.time, "hang", f"no progress anywhere for {silent:.1f} s: hang"))
        text, kind = f"hang: no progress anywhere for {silent:.1f} s", "hang"
    elif e.kind not in SPANS_AND_BANDS:  # a kind without words of its own here (a later one): shown as it is
        story.marks.append(foreign_mark(Foreign(e.time, e.node, e.rank, e.kind.value, e.details)))
    if text is not None:
        story.marks.append(Mark(e.time, e.node, e.rank if e.kind is K.FAILURE else None, kind, text))


# Words for kinds this page has no code of its own for (spares: planning/spares.py), by name: (mark, text).
WORDS = {"spare_joined": ("joined", "spare node {node} ({host}) joined: it waits for a lost node's place"),
         "spare_promoted": ("replaced", "spare {spare} ({host}) takes the place of node {node} ({replaces})"),
         "node_excluded": ("lost", "node {node}'s host {host} is excluded from now on: {reason}"),
         "job_resized": ("replaced", "the next attempt runs on {nodes} node(s), {ranks} rank(s) (--nnodes MIN:MAX)")}


def foreign_mark(f: Foreign) -> Mark:
    """A kind without code of its own here (a newer one's: `straggler`...): its words if WORDS has them, else its
    name and its details."""
    if f.kind in WORDS:
        kind, words = WORDS[f.kind]
        try:
            return Mark(f.time, f.node, f.rank, kind, words.format(node=f.node, **f.details))
        except (KeyError, IndexError, ValueError):
            pass
    details = ", ".join(f"{k}={v}" for k, v in f.details.items())
    return Mark(f.time, f.node, f.rank, f.kind, f"{f.kind}: {details}" if details else f.kind)


