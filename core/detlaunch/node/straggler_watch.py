"""The straggler watch: the chief asks every node for its ranks' section figures and CPU, and names the slow rank.

Every POLL_EVERY seconds while ranks run, the chief asks the job the "sections" question (the same
path as `detlaunch status` and the hang watch: link/control.py, each node answering over the job
link). A node answers from what it already holds: each live rank's section table, read from its
progress file (rank/sections.py: no message from the rank), and the CPU % its sampler took
(node_status.py). The judge is pure (observe/stragglers.py); this part only asks, and tells: a
console line once per rank and attempt, a `straggler` event (docs/EVENTS.md), and the marks
`detlaunch status`, `detlaunch stacks` and the hang report show.

`--straggler-action replace` treats the straggler's node as lost so that a spare takes its place
(`replace`, given by the supervisor: False while the job has no spares, and then it warns).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from detlaunch.observe.events import EventKind
from detlaunch.observe.stragglers import Finding, RankKey, StragglerDetector
from detlaunch.rank.progress import progress_path
from detlaunch.rank.sections import read_sections
from detlaunch.system.eventloop import EventLoop, Timer, cancel_timer

POLL_EVERY = 1.0  # seconds between the chief's questions while ranks run
WARN, REPLACE = "warn", "replace"
Answer = Callable[[dict[str, Any]], None]


class StragglerWatch:
    def __init__(self, loop: EventLoop, *, is_chief: bool, run_dir: str, threshold: float, action: str,
                 ask_job: Callable[[str, dict[str, Any], Answer], None], emit: Callable[..., Any],
                 say: Callable[[str], None], live_ranks: Callable[[], list[tuple[int, int]]],
                 usage: Callable[[], Mapping[int, tuple[float | None, int | None]]], active: Callable[[], bool],
                 replace: Callable[[int], bool] = lambda node: False) -> None:
        self.loop, self.is_chief, self.run_dir, self.threshold, self.action = loop, is_chief, run_dir, threshold, action
        self.ask_job, self.emit, self.say, self.live_ranks, self.usage, self.active = (ask_job, emit, say, live_ranks,
                                                                                       usage, active)
        self.replace = replace
        self.detector = StragglerDetector(threshold)
        self.timer: Timer | None = None
        self.attempt = 0
        self.said_no_spares = False

    # -- every node: its answer -----------------------------------------------------------------
    def answer(self, args: Any, done: Answer) -> None:
        """The "sections" question: [[rank, {section: [calls, seconds]}, cpu % or None]] of this node's live ranks."""
        usage = self.usage()
        ranks = []
        for rank, _pid in self.live_ranks():
            figures = read_sections(progress_path(self.run_dir, rank))
            ranks.append([rank, {name: [calls, total] for name, (calls, total) in figures.items()},
                          usage.get(rank, (None, None))[0]])
        done({"ranks": ranks})

    def serve(self, control: Any, status: Callable[[Any, Answer], None], hangs: Any,
              more: Callable[[], dict[str, Any]] = dict) -> None:
        """Register this node's answers with the control requests (link/control.py): "sections", and
        "status" and "stacks" (`hangs.answer_stacks`) joined on the chief by its facts about the job
        (the stragglers' marks, what --hang-timeout auto learned); the hang report marks them too."""
        hangs.stragglers = self.marks

        def facts() -> dict[str, Any]:
            return {"stragglers": self.marks(), **hangs.facts(), **more()} if self.is_chief else {}

        control.handle("status", with_job_facts(status, facts))
        control.handle("stacks", with_job_facts(hangs.answer_stacks, facts))
        control.handle("sections", self.answer)

    # -- the chief: asking and judging -----------------------------------------------------------
    def registered(self) -> None:
        """A rank of this node started: the chief's watch runs from its first rank on."""
        if self.is_chief and self.timer is None:
            self.timer = self.loop.call_later(POLL_EVERY, self._ask)

    def _ask(self) -> None:
        self.timer = None
        if not self.active():
            return
        attempt = self.attempt
        self.timer = self.loop.call_later(POLL_EVERY, lambda: None)  # held: no second question while one is out
        self.ask_job("sections", {}, lambda answer: self._judge(answer, attempt))

    def _judge(self, answer: Mapping[str, Any], attempt: int) -> None:
        if attempt != self.attempt:
            return  # asked by an attempt that is over
        figures, cpu = parse_answer(answer)
        for finding in self.detector.update(figures, cpu):
            self._name(finding)
        cancel_timer(self.timer)
        self.timer = self.loop.call_later(POLL_EVERY, self._ask) if self.active() else None

    def _name(self, finding: Finding) -> None:
        action = self.action
        if action == REPLACE and not self.replace(finding.node):
            action = WARN
            if not self.said_no_spares:
                self.said_no_spares = True
                self.say("--straggler-action replace needs --spares (a node to take the straggler's place): "
                         "warning only")
        self.say(finding.describe() + (f"; node {finding.node} is replaced by a spare" if action == REPLACE else ""))
        self.emit(EventKind.STRAGGLER, finding.rank, node=finding.node, action=action, **finding.details())

    def marks(self) -> dict[str, str]:
        """{rank: mark} of this attempt's stragglers (JSON keys are strings), for status, stacks and the hang report."""
        return {str(rank): f.mark() for (rank, _node), f in sorted(self.detector.named.items())}

    def new_attempt(self) -> None:
        """The attempt is over: the next one's ranks are judged afresh."""
        cancel_timer(self.timer)
        self.timer = None
        self.attempt += 1
        self.detector = StragglerDetector(self.threshold)

    def close(self) -> None:
        cancel_timer(self.timer)
        self.timer = None


def parse_answer(answer: Mapping[str, Any]) -> tuple[dict[RankKey, dict[str, tuple[int, float]]],
                                                    dict[RankKey, float | None]]:
    """The job's answer to "sections", checked: each rank's figures and CPU % (malformed entries skipped)."""
    figures: dict[RankKey, dict[str, tuple[int, float]]] = {}
    cpu: dict[RankKey, float | None] = {}
    for node in answer.get("nodes") or []:
        for item in node.get("ranks") or [] if isinstance(node, dict) else []:
            try:
                rank, sections, percent = item
                key = (int(rank), int(node.get("node", -1)))
                figures[key] = {str(n): (int(c), float(t)) for n, (c, t) in dict(sections).items()}
                cpu[key] = None if percent is None else float(percent)
            except (TypeError, ValueError):
                continue
    return figures, cpu


def with_job_facts(handler: Callable[[Any, Answer], None], facts: Callable[[], dict[str, Any]]) -> Callable[
        [Any, Answer], None]:
    """`handler`, its answer joined by the chief's facts about the job (its stragglers, its learned hang timeout)."""

    def answer(args: Any, done: Answer) -> None:
        handler(args, lambda data: done({**data, **facts()} if isinstance(data, dict) else data))

    return answer
