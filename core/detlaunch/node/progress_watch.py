"""Whether a job hangs: no rank of the job, on any node, has shown progress for `--hang-timeout` seconds.

A rank's progress is its heartbeat (``detlaunch.rank.progress(step)``) once it sends them, else its
last output line (the wrapper marks the time of each read of the rank's pipes), else its start.
So a job where only rank 0 prints is not hung while rank 0 prints, and a rank that beats is judged
by its beats alone: a loop that prints warnings but no longer beats is not progress.

Each node knows its own ranks (`NodeProgress`, which reads their progress files); the chief alone
decides (`ProgressWatch`, pure: every time is given, nothing is read). The chief never polls: its
timer fires when the job's last known progress is `timeout` old, it asks every node for the age of
each rank's last progress (one question over the job link, see control.py), and either the job is
hung or the timer is set again for the new deadline. Ages, not times, cross the link: each node
measures them on its own monotonic clock, so the nodes' clocks need not agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from detlaunch.rank.progress import OUTPUT_RECORD, progress_path, read_progress

RankKey = tuple[int, int]  # (rank, node)


def latest_progress(started: float, output: float | None, beat: float | None) -> float:
    """A rank's last sign of progress (monotonic): its heartbeat if it sends any, else its last output."""
    shown = beat if beat is not None else output
    return started if shown is None else max(started, shown)


class ProgressWatch:
    """The chief's view of every rank's last progress, on the chief's monotonic clock."""

    def __init__(self, timeout: float, started: float) -> None:
        self.timeout = timeout
        self.started = started  # when watching began (the chief's first rank started): it counts as progress
        self.last: dict[RankKey, float] = {}
        self.starting: dict[int, float] = {}  # node: when it last said none of its ranks has started yet

    def update(self, node: int, ages: Iterable[tuple[int, float]], now: float, starting: bool = False) -> None:
        """A node's answer: for each of its live ranks, how long ago it last showed progress.
        starting: none of its ranks has started yet (its launcher is still starting: deepspeed's imports
        torch on every node, for seconds under load): that is not a hang, --start-timeout watches it."""
        if starting:
            self.starting[node] = now
        for rank, age in ages:
            key = (rank, node)
            self.last[key] = max(self.last.get(key, self.started), now - max(0.0, age))

    def latest(self) -> float:
        return max([self.started, *self.last.values(), *self.starting.values()])

    def deadline(self) -> float:
        """When the job is hung if nothing more is heard of it."""
        return self.latest() + self.timeout

    def hung(self, now: float) -> bool:
        return now >= self.deadline()

    def idle_for(self, now: float) -> float:
        return now - self.latest()

    def last_progress(self) -> dict[int, float]:
        """{rank: its last progress}, for the suspects (the ranks that stopped first)."""
        return {rank: t for (rank, _node), t in self.last.items()}


class NodeProgress:
    """One node's ranks: when each started, and (read from its progress file) its last beat or output."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.started: dict[int, float] = {}
        self.ended: dict[int, float] = {}

    def started_rank(self, rank: int, now: float) -> None:
        self.started[rank] = now

    def exited(self, rank: int, now: float) -> None:
        """A rank's exit is its last progress: the job is silent only from then on (a launcher that
        lingers after its ranks is watched from their exit, not from their start)."""
        self.ended[rank] = now

    def watched(self, live: Iterable[int]) -> list[int]:
        """The ranks whose age the hang watch asks for: the live ones and those that ended."""
        return sorted({*live, *self.ended})

    def starting(self) -> bool:
        """No rank of this node has started yet (in this attempt)."""
        return not self.started

    def shown_since(self, rank: int, since: float) -> bool:
        """Whether `rank` printed a line or sent a beat after `since` (monotonic)."""
        path = progress_path(self.run_dir, rank)
        return any(r is not None and r.monotonic > since
                   for r in (read_progress(path), read_progress(path, OUTPUT_RECORD)))

    def ages(self, ranks: Iterable[int], now: float) -> list[tuple[int, float]]:
        """[(rank, seconds since its last progress)] for `ranks` (see watched)."""
        out = []
        for rank in ranks:
            path = progress_path(self.run_dir, rank)
            beat, output = read_progress(path), read_progress(path, OUTPUT_RECORD)
            last = latest_progress(self.started.get(rank, now), output.monotonic if output else None,
                                   beat.monotonic if beat else None)
            out.append((rank, now - max(last, self.ended.get(rank, last))))
        return out


def last_seen(run_dir: str, ranks: Iterable[int]) -> dict[int, tuple[float | None, float | None]]:
    """{rank: (wall time of its last output, of its last heartbeat)} for `detlaunch status`: the same
    records the hang watch reads (the wrapper marks each read of the rank's pipes; no message)."""
    seen = {}
    for rank in ranks:
        path = progress_path(run_dir, rank)
        output, beat = read_progress(path, OUTPUT_RECORD), read_progress(path)
        seen[rank] = (output.at if output else None, beat.at if beat else None)
    return seen


def is_starting(node_answer: Mapping[str, object]) -> bool:
    return node_answer.get("starting") is True


def parse_ages(node_answer: Mapping[str, object]) -> list[tuple[int, float]]:
    """A node's answer to the "progress" question, checked (a malformed entry is skipped)."""
    ages = []
    for item in node_answer.get("ages") or []:  # type: ignore[attr-defined]
        try:
            rank, age = item
            ages.append((int(rank), float(age)))
        except (TypeError, ValueError):
            continue
    return ages


class TimeoutLearner:
    """`--hang-timeout auto`: the limit learned from the job itself, as NVIDIA's ft_launcher does.

    Fed the job's latest progress (monotonic) each time the chief asks; each time it moves, the gap
    since the last is an interval between progress. The first WARMUP gaps of each attempt are not
    counted (imports, compilation, the first collectives); after them the limit is FACTOR times the
    longest interval seen, never under FLOOR. The longest interval is kept across restarts (a restart
    does not make the job faster); only the warm-up starts again.
    """

    FACTOR, FLOOR, WARMUP = 5.0, 60.0, 3

    def __init__(self, factor: float = FACTOR, floor: float = FLOOR, warmup: int = WARMUP) -> None:
        self.factor, self.floor, self.warmup = factor, floor, warmup
        self.longest = 0.0  # the longest interval between progress counted so far (all attempts)
        self.counted = 0  # intervals counted, all attempts
        self.seen = 0  # intervals seen in this attempt (the warm-up's)
        self.last: float | None = None

    def observe(self, latest: float) -> bool:
        """The job's latest progress now; True when the learned limit changed (first learned, or grew)."""
        before = self.timeout
        if self.last is not None and latest > self.last:
            self.seen += 1
            if self.seen > self.warmup:
                self.counted += 1
                self.longest = max(self.longest, latest - self.last)
        self.last = latest if self.last is None else max(self.last, latest)
        return self.timeout != before

    @property
    def timeout(self) -> float | None:
        """The learned limit; None while nothing is learned yet (the warm-up of the first attempt)."""
        return max(self.floor, self.factor * self.longest) if self.counted else None

    def new_attempt(self) -> None:
        self.last, self.seen = None, 0
