"""This node's part of `detlaunch status`: each rank's state, last output and heartbeat, and its CPU and memory.

The state comes from the job's events (observe/status.StatusTracker), the last output and heartbeat
from each rank's progress records (the ones the hang watch reads), and CPU % and RSS from a sample
of each running rank's process tree every SAMPLE_EVERY seconds, taken only while ranks run (a
status question is rare; a sample then would come too late to say anything about the recent past).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from detlaunch.node.phase import Phase
from detlaunch.node.progress_watch import last_seen
from detlaunch.node.rank_registry import RankRegistry
from detlaunch.node.verdict import Verdict
from detlaunch.observe.emitter import EventEmitter
from detlaunch.observe.sampler import ProcessTreeSampler
from detlaunch.planning.plan import LaunchPlan
from detlaunch.system.eventloop import EventLoop, Timer, cancel_timer

SAMPLE_EVERY = 2.0  # seconds between CPU/RSS samples of the ranks, while they run


class StatusHost(Protocol):
    """What the status needs of the node's supervisor: the current attempt's ranks and verdict."""

    loop: EventLoop
    plan: LaunchPlan
    ranks: RankRegistry
    verdict: Verdict
    events: EventEmitter

    @property
    def phase(self) -> Phase: ...

    @property
    def attempt(self) -> int: ...


class NodeStatus:
    def __init__(self, host: StatusHost) -> None:
        self.host = host
        self.sampler: ProcessTreeSampler | None = None  # made once ranks first run: it is not needed before
        self.timer: Timer | None = None  # one chain per attempt: cancelled between attempts

    def start_sampling(self) -> None:
        """The attempt's launchers start: sample its ranks every SAMPLE_EVERY s from now on."""
        self.sampler = ProcessTreeSampler()
        self.timer = self.host.loop.call_later(SAMPLE_EVERY, self._sample)

    def stop_sampling(self) -> None:
        cancel_timer(self.timer)
        self.timer = None

    def _sample(self) -> None:
        h = self.host
        if not (h.phase.active or h.phase.stopping) or self.sampler is None:
            return
        usage = h.events.tracker.usage
        for rank, entry in h.ranks.ranks.items():
            if entry.status is None and entry.rank_pid:
                sample = self.sampler.sample(entry.rank_pid)
                if sample is not None:
                    usage[rank] = (sample.cpu_percent, sample.rss)
        self.timer = h.loop.call_later(SAMPLE_EVERY, self._sample)

    def answer(self, args: Any, done: Any) -> None:
        """The "status" question (control.py): this node's part of the answer (status.StatusTracker.answer)."""
        h = self.host
        seen = last_seen(h.plan.run_dir, h.ranks.ranks)
        failure = h.verdict.failure
        done(h.events.tracker.answer(h.ranks.host, seen, failure.what if failure else None, h.attempt - 1,
                                     time.time()))
