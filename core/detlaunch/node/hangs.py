"""The supervisor's hang policy: a hung job is found, explained and stopped; survivors are dumped before kill.

Three things, each a few timers and questions on the parts that already exist:

- the hang watch (chief only, from its first rank's start): a timer at the job's last known progress + S;
  when it fires, the chief asks every node for its ranks' progress (progress_watch.py); if none
  moved, it asks every node for its ranks' stacks and their Flight Recorders (stacks/flight.py),
  prints them grouped with the suspects, and fails the job with a `Hung` verdict event (exit code 124).
  S is `--hang-timeout S`; without the option, REPORT_AFTER (10 minutes), and then the stacks and
  suspects are printed once and the job goes on (nothing the user did not ask to stop is stopped);
  `--hang-timeout auto` learns S (progress_watch.TimeoutLearner, from the progress the chief asks
  for every LEARN_EVERY s; kept across restarts) and reports as without it until it has learned;
  `--hang-timeout 0` turns the watch off;
- a rank that printed a whole Python traceback and is still running TRACEBACK_DELAY seconds of its
  own time later (it hangs in atexit, destroy_process_group, a non-daemon thread) fails the job
  (`StuckAfterTraceback`): its traceback is the root cause. Its own time is the wall time less what it
  spent waiting for a CPU: Python's shutdown with torch loaded takes 0.6 s of CPU, many times that on a
  loaded machine, and a rank that is only slow to exit is not stuck;
- dump before kill (`--dump-budget S`): when a rank fails, the chief asks every node for its
  surviving ranks' stacks and tells every node to stop in the same breath; each node (the chief
  too) stops its ranks once it has taken their stacks, so no node waits for the slowest one's; a
  worker whose own rank failed tells the chief at once and stops on its own only if the chief's
  stop has not come within the budget.

The questions go through control.py (the same machinery as `detlaunch status` and
`detlaunch stacks`), so the stacks come from every node over the job link.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from detlaunch.node.progress_watch import NodeProgress, ProgressWatch, TimeoutLearner, is_starting, parse_ages
from detlaunch.node.verdict import Hung, StuckAfterTraceback, VerdictEvent
from detlaunch.observe.events import EventKind
from detlaunch.outcome import Failure, FailureKind
from detlaunch.stacks.query import DEFAULT_BUDGET, StackCollector, node_answer, report_of
from detlaunch.system import procs
from detlaunch.system.eventloop import EventLoop, Timer, cancel_timer

TRACEBACK_DELAY = 5.0  # seconds of its own time a rank may take to exit after its uncaught traceback
REPORT_AFTER = 600.0  # no --hang-timeout: after this long without progress, stacks and suspects once; goes on
AUTO = "auto"  # --hang-timeout auto
LEARN_EVERY = 1.0  # --hang-timeout auto: seconds between the chief's progress questions
Answer = Callable[[dict[str, Any]], None]


class HangPolicy:
    """What the supervisor gives it: the loop, how to ask the job a question, how to fail and to say."""

    def __init__(self, loop: EventLoop, *, node: int, host: str, run_dir: str, is_chief: bool,
                 hang_timeout: float | str | None, dump_budget: float,
                 ask_job: Callable[[str, dict[str, Any], Answer], None],
                 fail: Callable[[VerdictEvent], None], say: Callable[[str], None],
                 live_ranks: Callable[[], list[tuple[int, int]]], active: Callable[[], bool],
                 emit: Callable[..., Any] = lambda *a, **k: None, proc: str = "/proc") -> None:
        self.loop, self.node, self.host, self.is_chief = loop, node, host, is_chief
        self.hang_timeout, self.dump_budget = hang_timeout, dump_budget
        self.learner = TimeoutLearner() if hang_timeout == AUTO else None
        self.announced: float | None = None  # the learned limit last told (status, event log)
        self.reported = False  # this attempt's hang was reported (no stop): once
        self.check_timer: Timer | None = None  # the watch's one timer (and, auto, the learning one)
        self.learn_timer: Timer | None = None
        self.emit = emit
        self.stragglers: Callable[[], Mapping[str, str]] = dict  # {rank: mark}, named by the straggler watch
        self.ask_job, self.fail, self.say, self.live_ranks, self.active = ask_job, fail, say, live_ranks, active
        self.run_dir, self.proc = run_dir, proc
        self.progress = NodeProgress(run_dir)
        self.collector = StackCollector(loop)
        self.watch: ProgressWatch | None = None
        self.timers: list[Timer] = []
        self.attempt = 0  # answers to a question of an earlier attempt are dropped
        self.dumping = False  # the survivors' stacks are being taken: the stop waits for them
        self.dumped: tuple[str, ...] = ()  # ... and here they are, grouped, for the report
        self.own_dumps = 0  # this node's answers to a dump before kill still being taken
        self.after_own_dumps: list[Callable[[], None]] = []  # stops waiting for them

    # -- the questions every node answers ------------------------------------------------------
    def answer_progress(self, args: Any, done: Answer) -> None:
        now = self.loop.clock()
        done({"ages": self.progress.ages(self.progress.watched(rank for rank, _ in self.live_ranks()), now),
              "starting": self.progress.starting()})

    def answer_stacks(self, args: Any, done: Answer) -> None:
        try:
            budget = max(0.1, min(float(args.get("budget") or DEFAULT_BUDGET), 10.0))
        except (TypeError, ValueError):
            budget = DEFAULT_BUDGET
        if args.get("before_stop"):  # the chief's dump before kill: this node's stop waits for the answer
            self.own_dumps += 1
            done = self._then_stops(done)
        node_answer(self.collector, self.host, self.live_ranks(), budget, done, self.run_dir, bool(args.get("flight")))

    def _then_stops(self, done: Answer) -> Answer:
        """`done`, then the stops that waited for this node's stacks (once the last such answer is out)."""
        attempt = self.attempt

        def answered(answer: dict[str, Any]) -> None:
            try:
                done(answer)
            finally:  # whatever sending or formatting it did, the stop that waits for it comes
                if attempt == self.attempt:  # else new_attempt forgot it
                    self.own_dumps -= 1
                    if not self.own_dumps:
                        stops, self.after_own_dumps = self.after_own_dumps, []
                        for stop in stops:
                            stop()

        return answered

    def stop_after_own_dumps(self, stop: Callable[[], None]) -> None:
        """Run `stop` once this node's ranks' stacks for a dump before kill are taken: now if none is."""
        if self.own_dumps:
            self.after_own_dumps.append(stop)
        else:
            stop()

    def started(self, rank: int) -> None:
        """A rank of this node started (its process runs: a warm rank's wrapper registers before its
        template has forked it, maybe while the template still imports torch). The chief's watch starts
        with its first rank: before that, the launcher or the template is still starting (torch's import
        alone takes seconds, many under load), and --start-timeout watches."""
        self.progress.started_rank(rank, self.loop.clock())
        self.collector.load()
        if self.is_chief and self.hang_timeout != 0 and self.watch is None:
            self.watch = ProgressWatch(self.limit(), self.loop.clock())
            self._arm()
            if self.learner is not None:
                self.learn_timer = self.loop.call_later(LEARN_EVERY, self._learn)

    def exited(self, rank: int) -> None:
        """A rank of this node ended: that is progress (see NodeProgress.exited)."""
        self.progress.exited(rank, self.loop.clock())

    # -- the hang watch (the chief) ------------------------------------------------------------

    def limit(self) -> float:
        """The watch's limit now: --hang-timeout S, the learned one, or REPORT_AFTER."""
        if isinstance(self.hang_timeout, (int, float)) and self.hang_timeout > 0:
            return float(self.hang_timeout)
        learned = self.learner.timeout if self.learner else None
        return REPORT_AFTER if learned is None else learned

    def stops(self) -> bool:
        """Whether a hang stops the job (a limit the user gave or asked to learn), or is only reported."""
        return isinstance(self.hang_timeout, (int, float)) or bool(self.learner and self.learner.timeout)

    def facts(self) -> dict[str, Any]:
        """For `detlaunch status` (the chief's): what --hang-timeout auto has learned so far."""
        if self.learner is None:
            return {}
        learned = self.learner.timeout
        return {"hang_timeout": f"auto: {learned:g} s learned" if learned else "auto: learning"}

    def _arm(self) -> None:
        assert self.watch is not None
        cancel_timer(self.check_timer)
        self.check_timer = self.loop.call_later(max(0.0, self.watch.deadline() - self.loop.clock()), self._check)

    def _learn(self) -> None:
        self.learn_timer = None
        if self.active():
            self.ask_job("progress", {}, self._of_this_attempt(self._on_learn))

    def _on_learn(self, answer: dict[str, Any]) -> None:
        watch, learner = self.watch, self.learner
        assert watch is not None and learner is not None
        now = self.loop.clock()
        for node in answer.get("nodes") or []:
            watch.update(int(node.get("node", -1)), parse_ages(node), now, is_starting(node))
        if learner.observe(watch.latest()) and learner.timeout is not None:
            watch.timeout = learner.timeout
            self._arm()
            if self.announced is None or learner.timeout >= 1.25 * self.announced:
                self.announced = learner.timeout
                self.emit(EventKind.HANG_TIMEOUT_LEARNED, timeout=round(learner.timeout, 3),
                          longest_interval=round(learner.longest, 3))
                self.say(f"--hang-timeout auto: {learner.timeout:g} s ({learner.factor:g} x the longest interval "
                         f"between progress, {learner.longest:.1f} s; at least {learner.floor:g} s)")
        if self.active():
            self.learn_timer = self.loop.call_later(LEARN_EVERY, self._learn)

    def _after(self, delay: float, callback: Callable[[], None]) -> None:
        """A timer of this attempt (new_attempt cancels it); fired ones are forgotten as new ones come."""
        now = self.loop.clock()
        self.timers = [t for t in self.timers if not t.cancelled and t.when > now]
        self.timers.append(self.loop.call_later(max(delay, 0.0), callback))

    def _of_this_attempt(self, callback: Answer) -> Answer:
        """`callback`, unless the answer comes after the attempt that asked is over."""
        attempt = self.attempt

        def answered(answer: dict[str, Any]) -> None:
            if self.attempt == attempt and self.watch is not None and self.active():
                callback(answer)

        return answered

    def _check(self) -> None:
        if self.active():
            self.ask_job("progress", {}, self._of_this_attempt(self._on_progress))

    def _on_progress(self, answer: dict[str, Any]) -> None:
        watch = self.watch
        assert watch is not None  # _of_this_attempt
        now = self.loop.clock()
        for node in answer.get("nodes") or []:
            watch.update(int(node.get("node", -1)), parse_ages(node), now, is_starting(node))
        if not self.active():
            return
        if not watch.hung(now):
            self._arm()
            return
        idle = watch.idle_for(now)
        if not self.stops():
            if not self.reported:  # once an attempt; the job goes on
                self.reported = True
                self.say(f"no rank has shown progress for {idle:.1f} s: every rank's stack follows; the job goes on "
                         "(--hang-timeout S stops a job that hangs for S seconds)")
                self.ask_job("stacks", {"budget": DEFAULT_BUDGET, "flight": True},
                             self._of_this_attempt(lambda answer: self._on_report_stacks(answer, idle)))
            return
        label = f"auto, {self.limit():g} s learned" if self.learner else f"{self.limit():g}"
        self.say(f"no rank has shown progress for {idle:.1f} s (--hang-timeout {label}): taking every rank's stack")
        then = self._of_this_attempt(lambda answer: self._on_hang_stacks(answer, idle))
        self.ask_job("stacks", {"budget": DEFAULT_BUDGET, "flight": True}, then)

    def _hang_report(self, answer: dict[str, Any]) -> tuple[list[str], tuple[str, ...]]:
        """Every rank's stack, grouped, the ranks already named stragglers marked; and the suspects."""
        from detlaunch.observe.stragglers import marks
        from detlaunch.stacks.groups import format_text, format_who

        report = report_of(answer, self.watch.last_progress() if self.watch else None)
        named = marks(self.stragglers())
        lines = [*format_text(report), *(f"node {n}: no answer" for n in answer.get("missing") or []),
                 *(f"rank {rank}: named a straggler before ({mark})" for rank, mark in named.items())]
        return lines, tuple(f"{format_who([(s.rank, s.node)])}: {s.why}" for s in report.suspects)

    def _on_hang_stacks(self, answer: dict[str, Any], idle: float) -> None:
        lines, suspects = self._hang_report(answer)
        self.fail(Hung(self.limit(), idle, suspects, tuple(lines), self.node, time.time(), learned=bool(self.learner)))

    def _on_report_stacks(self, answer: dict[str, Any], idle: float) -> None:
        lines, suspects = self._hang_report(answer)
        self.emit(EventKind.HANG_DETECTED, silent_for=round(idle, 3), stopping=False)
        self.say(f"the job shows no progress; suspect: {'; '.join(suspects) or 'none stands out (see the stacks)'}")
        for line in lines:
            self.say(f"  {line}")

    # -- a rank that printed its traceback and does not exit -----------------------------------
    def traceback(self, rank: int, tail: Sequence[str], wall: float) -> None:
        """The rank printed a whole traceback. It failed if, TRACEBACK_DELAY of its own time later, it still
        runs and has shown no progress since (no output line, no beat): a traceback the script handled
        (logging.exception, "Exception ignored in ...") and went on from is not a failure."""
        told = self.loop.clock()
        pid = dict(self.live_ranks()).get(rank)
        waited = procs.cpu_wait(pid, self.proc) if pid else None

        def check() -> None:
            pid = dict(self.live_ranks()).get(rank)
            if not self.active() or pid is None or self.progress.shown_since(rank, told):
                return
            now_waited = procs.cpu_wait(pid, self.proc)
            queued = now_waited - waited if waited is not None and now_waited is not None else 0.0
            own = self.loop.clock() - told - queued
            if own < TRACEBACK_DELAY:
                self._after(TRACEBACK_DELAY - own, check)  # it waited for a CPU: the rest of its own time
            else:
                self.fail(StuckAfterTraceback(rank, self.node, self.host, tuple(tail), TRACEBACK_DELAY, wall))

        self._after(TRACEBACK_DELAY, check)

    # -- dump before kill ------------------------------------------------------------------------
    def dump_before_stop(self, failure: Failure, stop: Callable[[], None]) -> bool:
        """A rank failed: take the survivors' stacks first, then `stop()`; False when there is nothing to take.

        The chief asks every node (itself too) with "before_stop": each node stops once its own
        answer is out (stop_after_own_dumps), so the chief may tell the others to stop right after
        asking; the gathered stacks reach the report before the nodes' ends do (the link keeps order).
        """
        if self.dump_budget <= 0 or failure.kind is not FailureKind.RANK or self.dumping:
            return False
        self.dumping = True

        def then() -> None:
            if self.dumping:
                self.dumping = False
                stop()

        if self.is_chief:  # the gathering answers within its own budget, whatever the nodes do
            attempt = self.attempt

            def dumped(answer: dict[str, Any]) -> None:
                if attempt != self.attempt:
                    return  # a restart came first: these stacks are not the next attempt's
                from detlaunch.stacks.groups import format_text

                self.dumped = tuple(format_text(report_of(answer)))

            self.ask_job("stacks", {"budget": self.dump_budget, "before_stop": True}, dumped)
            self.stop_after_own_dumps(then)
        else:  # the chief takes the stacks (this node's too) and sends the stop; if it does not, stop anyway
            self._after(self.dump_budget + 1.5, then)
        return True

    def hold_time(self) -> float:
        """How long a wrapper whose rank failed waits for the dump (rank.wrapper.hold_exit); 0: not at all."""
        return self.dump_budget + 2.5 if self.dump_budget > 0 else 0.0

    def stopped(self) -> None:
        """The job is being stopped anyway (the chief's verdict, a signal): no dump to wait for."""
        self.dumping = False

    def new_attempt(self) -> None:
        """The attempt is over (a restart follows): nothing of it may judge the next one."""
        for timer in self.timers:
            timer.cancel()
        self.timers.clear()
        self.attempt += 1
        cancel_timer(self.check_timer)
        cancel_timer(self.learn_timer)
        self.check_timer = self.learn_timer = None
        self.reported = False
        if self.learner is not None:
            self.learner.new_attempt()  # what it learned stays; the warm-up starts again
        self.watch = None  # re-made when the next attempt's first rank registers
        self.progress = NodeProgress(self.run_dir)  # no rank of the next attempt has started yet
        self.dumping = False
        self.dumped = ()
        self.own_dumps, self.after_own_dumps = 0, []

    def close(self) -> None:
        cancel_timer(self.check_timer)
        cancel_timer(self.learn_timer)
        for timer in self.timers:
            timer.cancel()
        self.collector.close()
