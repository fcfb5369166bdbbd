"""The node supervisor (the seed's pid_server role): one per node, owning every process it starts.

It is the policy that ties the parts together; each part knows nothing of the others:

- eventloop.EventLoop: the selector, timers and the signal self-pipe (nothing polls);
- process_table.ProcessTable: the launchers and daemons it started (output, reaping, stopping);
- rank_registry.RankRegistry: the rank wrappers' socket and their reports;
- verdict.Verdict: which failure is the root cause, and the exit code (pure);
- joblink / dial: the other nodes' supervisors, and peers' sshd greetings.
- attempt_driver.AttemptDriver: between two attempts of a restart (the backoff, lost nodes, the next start);
- phase.Phase: where this node's part of the job is, drawn in one docstring.
- stage_files.StageFiles: the stage's files and folders on this node, written at the start and removed at the end.

When any rank fails, it stops every other process at once (the ranks through their
wrappers, the launchers with their stop signal), SIGKILLs whatever is left after the
grace period, and exits with the first failing rank's own exit code.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import time
from typing import Any, TextIO

from detlaunch.errors import LaunchError
from detlaunch.link.control import ControlRequests, write_job_file
from detlaunch.link.dial import SshdProbe, probe_sshds
from detlaunch.link.joblink import ChiefLink, WorkerLink
from detlaunch.node.attempt_driver import AttemptDriver
from detlaunch.node.hangs import HangPolicy
from detlaunch.node.phase import Phase as Phase  # the phases were defined here first
from detlaunch.node.process_table import Child, ProcessTable
from detlaunch.node.progress_watch import last_seen
from detlaunch.node.rank_registry import RankEntry, RankRegistry, RankRules
from detlaunch.node.stage_files import StageFiles
from detlaunch.node.standby import Standby
from detlaunch.node.verdict import (
    ChiefLost,
    ChiefVerdict,
    ChildExited,
    Decision,
    Event,
    Hung,
    Interrupted,
    NodeLost,
    RankEnded,
    RemoteFailure,
    StartFailed,
    Verdict,
    as_failure,
    naming_the_node,
)
from detlaunch.observe.console import FoldingConsole
from detlaunch.observe.emitter import EventEmitter, EventHook
from detlaunch.observe.events import EventKind
from detlaunch.observe.sampler import ProcessTreeSampler
from detlaunch.outcome import AttemptEnd, Failure, JobResult, RankStatus, signal_name
from detlaunch.planning.config import DEDUPE_MIN_RANKS
from detlaunch.planning.plan import LaunchPlan
from detlaunch.rank import protocol as rank_protocol
from detlaunch.rank.protocol import DEFAULT_PREFIX
from detlaunch.restarts import per_attempt
from detlaunch.restarts.attempts import Attempts, attempt_end
from detlaunch.system.eventloop import EventLoop, Timer, cancel_timer
from detlaunch.system.rundirs import RunDir, create_run_dir

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SAMPLE_EVERY = 2.0  # seconds between CPU/RSS samples of the ranks (for `detlaunch status`), while they run


class NodeSupervisor:
    def __init__(self, plan: LaunchPlan, *, err: TextIO | None = None, debug: bool = False,
                 on_event: EventHook | None = None):
        self.plan = plan
        self.err = err or sys.stderr
        self.debug = debug
        self.node = plan.cluster.node_rank
        self.phase = Phase.STARTING
        self.started_at = time.monotonic()
        self.env = plan.process_env()
        self.loop = EventLoop()
        self.link: ChiefLink | WorkerLink | None = None
        self.link_up = False  # chief: every node joined; worker: joined the chief (rank commands wait for it)
        self.prepared = False
        # Job-wide restarts (restarts/): the chief keeps the history and decides; every node counts attempts.
        self.policy = plan.restarts
        self.attempts = Attempts(self.policy)
        self.driver = AttemptDriver(self)  # the backoff, the next attempt, lost nodes coming back
        self.control = ControlRequests(  # questions from other shells, routed over the job link
            self.loop, plan.cluster.job_id, self.node,
            chief=lambda: self.link if isinstance(self.link, ChiefLink) else None,
            worker=lambda: self.link if isinstance(self.link, WorkerLink) else None)
        self.control.handle("status", self._status)
        c = plan.cluster
        self.hangs = HangPolicy(self.loop, node=self.node, host=c.node_addr or socket.gethostname(),
                                run_dir=plan.run_dir, is_chief=c.is_chief, hang_timeout=plan.hang_timeout,
                                dump_budget=plan.dump_budget, ask_job=self.control.ask_job, fail=self._fail,
                                say=self.say, live_ranks=self._live_ranks, active=lambda: self.phase.active)
        self.control.handle("stacks", self.hangs.answer_stacks)
        self.control.handle("progress", self.hangs.answer_progress)
        self.run_dir: RunDir | None = None
        self.files = StageFiles(plan.stage, plan.run_dir, plan.shared_dir)
        self.events = EventEmitter(plan.cluster.job_id, self.node, path=plan.events_path, hook=on_event,
                                   warn=lambda why: self.say(f"warning: {why}; the job goes on"))
        self.console = self._folding_console()  # the job's console, folding repeated lines (--dedupe)
        self.sampler: ProcessTreeSampler | None = None
        self.standby: Standby | None = None  # the next attempt's launcher, started ahead (restarts on)
        self._new_attempt_parts()

    @property
    def attempt(self) -> int:
        """The attempt that runs, or comes next (1 for the first)."""
        return self.attempts.number

    def _new_attempt_parts(self) -> None:
        """What lives for one attempt only: its verdict, its processes, its ranks and its timers."""
        plan, c = self.plan, self.plan.cluster
        self.attempt_started_at = time.monotonic()
        self.attempt_wall = time.time()
        self.verdict = Verdict()
        log_dir = per_attempt.attempt_log_dir(plan.log_dir, self.attempt, self.policy.enabled) if plan.log_dir else None
        self.processes = ProcessTable(self.loop, log_dir=log_dir, node_rank=self.node,
                                      on_output=self._on_child_output, on_exit=self._on_child_exit,
                                      on_log_error=lambda why: self.say(f"warning: {why}; the job goes on"))
        if self.standby is not None:
            self.processes.spared.add(self.standby.pid)
        rules = RankRules(job_id=c.job_id, node_rank=self.node, first_rank=c.first_rank,
                          local_slots=c.local_slots, check_range=plan.stage.expected_ranks is None)
        self.ranks = RankRegistry(self.loop, rules, c.node_addr or socket.gethostname(),
                                  accepting=lambda: self.phase.active, welcome=self._welcome,
                                  console_fds=self.console.fds if self.console else (1, 2),
                                  on_registered=self._on_registered, on_exit=self._on_rank_exit, trace=self.trace,
                                  on_request=self._on_client_request, on_started=self._on_rank_started,
                                  on_traceback=self._on_traceback)
        self.probes: list[SshdProbe] = []
        self.kill_timer: Timer | None = None
        self.sample_timer: Timer | None = None  # one chain per attempt: cancelled between attempts
        self.start_timer: Timer | None = None
        self.sweep_timer: Timer | None = None
        self.awaiting_join = False  # worker: the stage starts once the chief said which attempt this is

    # -- output ------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        print(f"detlaunch: {message}", file=self.err, flush=True)

    def trace(self, message: str) -> None:
        if self.debug:
            self.say(f"[node {self.node}] {message}")

    def _folding_console(self) -> FoldingConsole | None:
        """--dedupe: this node's rank output goes through the supervisor (console.py); else it does not."""
        plan = self.plan
        c = plan.cluster
        console = plan.console_ranks
        printing = plan.expected_ranks if console is None else max(1, sum(
            1 for r in console if c.first_rank <= r < c.first_rank + c.local_slots))
        dedupe = plan.dedupe
        if dedupe is None:
            dedupe = (plan.prefix == DEFAULT_PREFIX and printing > DEDUPE_MIN_RANKS
                      and os.isatty(1) and os.isatty(2))
        return FoldingConsole(self.loop, printing, plan.dedupe_window) if dedupe else None

    def _enter(self, phase: Phase) -> None:
        if phase is not self.phase:
            self.trace(f"phase: {self.phase.value} -> {phase.value}")
            self.phase = phase

    # -- setup -------------------------------------------------------------------------------
    def _prepare(self) -> None:
        try:
            self.run_dir = create_run_dir(self.plan.run_dir)  # fails if anything already sits at this random path
            os.mkdir(os.path.join(self.plan.run_dir, "tmp"), 0o700)  # a private TMPDIR for the job
            write_job_file(self.plan.run_dir, self.plan.cluster.job_id, self.node)
            self.ranks.listen(self.plan.socket_path)
        except OSError as e:
            raise LaunchError(f"cannot set up {self.plan.run_dir}: {e.strerror or e}") from None
        self.loop.catch_signals((*STOP_SIGNALS, signal.SIGCHLD), self._on_signal)
        self.processes.adopt_orphans()
        self.prepared = True

    def _run_steps(self, steps: tuple[tuple[str, ...], ...]) -> None:
        for argv in steps:
            self.trace(f"running {' '.join(argv)}")
            self.processes.run_step(argv, self.env, self.plan.start_timeout)

    def _start(self, command_index: int) -> None:
        command = self.plan.stage.commands[command_index]
        standby = None
        if self.standby is not None and command.standby is not None:  # only the launcher it was started for
            standby, self.standby = self.standby, None
            if not standby.fits(command.argv, {**self.env, **command.env}):
                self.processes.drop_standby(standby)
                standby = None
        child = self.processes.start(command, self.env, standby)
        self.trace(f"started {command.name} (pid {child.pid}{', its standby' if standby else ''})")
        self.events.emit(EventKind.LAUNCHER_STARTED, name=command.name, pid=child.pid)

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> JobResult:
        c = self.plan.cluster
        self.events.emit(EventKind.JOB_PLANNED, layer=self.plan.layer, nodes=c.num_nodes, ranks=sum(c.slots))
        if self.policy.enabled:
            self.events.emit(EventKind.ATTEMPT_STARTED, attempt=0)
        try:
            self._prepare()
            if self.plan.cluster.num_nodes > 1:
                self.link = (ChiefLink(self.loop, self.plan, self) if self.plan.cluster.is_chief
                             else WorkerLink(self.loop, self.plan, self))
            self.files.write()
            self._run_steps(self.plan.stage.setup)
            if self._joins_first():
                self._await_join()
            else:
                self._start_stage()
            self.loop.run(done=lambda: self.phase is Phase.DONE, after_each=self._advance)
        except LaunchError as e:
            self.fail_to_start(str(e))
            if self.prepared:
                self.loop.run(done=lambda: self.phase is Phase.DONE, after_each=self._advance)
        finally:
            self._cleanup()
        result = self._result()
        if self.policy.enabled and self.attempts.running:
            self.events.emit(EventKind.ATTEMPT_ENDED, attempt=self.attempt - 1, exit_code=result.exit_code)
        if result.failure is not None:
            f = result.failure
            self.events.emit(EventKind.ROOT_CAUSE, f.rank.rank if f.rank else None, what=f.what,
                             exit_code=f.exit_code, at=f.at)
        self.events.emit(EventKind.JOB_FINISHED, exit_code=result.exit_code, duration=result.duration)
        self.events.close()
        return dataclasses.replace(result, warnings=(*result.warnings, *self.events.warnings()))

    def _start_stage(self) -> None:
        """One attempt's processes: the daemons, then (once every peer's sshd answers) the launchers.

        Files and setup steps are the job's, done once; each attempt starts its daemons (per-job sshd)
        afresh, so nothing of an attempt outlives it and a restart runs exactly a first start's path.
        """
        for i, cmd in enumerate(self.plan.stage.commands):
            if cmd.daemon:
                self._start(i)
        self.start_timer = self.loop.call_at(self.attempt_started_at + self.plan.start_timeout,
                                             self._on_start_timeout)
        self.probes = probe_sshds(self.loop, self.plan.stage.wait_for_sshd, self._on_peer_ready, self.fail_to_start)
        if not self.probes:
            self._start_when_ready()

    def _start_launchers(self) -> None:
        if self.phase is not Phase.STARTING:
            return
        self._enter(Phase.RUNNING)
        self.sampler = ProcessTreeSampler()
        self.sample_timer = self.loop.call_later(SAMPLE_EVERY, self._sample)
        try:
            self._run_steps(self.plan.stage.prelaunch)
            for i, cmd in enumerate(self.plan.stage.commands):
                if not cmd.daemon:
                    self._start(i)
            self._start_standby()
        except LaunchError as e:
            self.fail_to_start(str(e))

    def _start_standby(self) -> None:
        """Restarts on: the next attempt's launcher starts now, past its imports (Command.standby)."""
        launchers = [c for c in self.plan.stage.commands if c.standby is not None and not c.daemon]
        restarts_left = self.policy.restarts_after(self.attempt, self.plan.cluster.num_nodes)
        if restarts_left <= 0 or self.standby is not None or len(launchers) != 1:
            return
        command = launchers[0]
        assert command.standby is not None
        self.standby = Standby.spawn(command.argv, {**self.env, **command.env}, command.standby)
        if self.standby is not None:
            self.processes.spared.add(self.standby.pid)
            self.trace(f"standby {command.name} for the next attempt (pid {self.standby.pid})")

    def _on_peer_ready(self, probe: SshdProbe) -> None:
        self.trace(f"sshd {probe.host}:{probe.port} answered")
        self.events.emit(EventKind.SSHD_READY, host=probe.host, port=probe.port)
        if all(p.ready for p in self.probes):
            self._start_when_ready()

    def _start_when_ready(self) -> None:
        """Launchers start once every peer's sshd answered. Ranks this supervisor starts itself
        (Command.rank) also wait for the whole job link: every node is there before any rank
        starts, as torchrun's rendezvous would have it, and no node can finish before it joined."""
        starts_ranks = self.link is not None and any(c.rank is not None for c in self.plan.stage.commands)
        if all(p.ready for p in self.probes) and (self.link_up or not starts_ranks):
            self._start_launchers()

    # -- events from the parts -----------------------------------------------------------------
    def _on_child_output(self, child: Child, data: bytes) -> None:
        if self.debug:
            for line in rank_protocol.last_lines(data, 10**9):
                self.say(f"[{child.command.name}] {line}")

    def _on_child_exit(self, child: Child) -> None:
        assert child.exit is not None
        self.trace(f"{child.command.name} (pid {child.pid}) ended: {child.exit.describe()}")
        if not self.phase.active:
            return
        if not child.command.daemon and not child.exit.ok:
            self.ranks.drain()  # a rank's report already sent wins over its launcher's exit
        self._fail(ChildExited(child.command.name, child.pid, child.exit, child.command.daemon, self.node,
                               time.time()))

    def _welcome(self) -> dict[str, Any]:
        log_dir = os.path.abspath(self.processes.log_dir) if self.processes.log_dir else None
        ranks = self.plan.console_ranks
        welcome: dict[str, Any] = {"log_dir": log_dir, "console_ranks": list(ranks) if ranks is not None else None,
                                   "prefix": self.plan.prefix, "node": self.node, "host": self.ranks.host,
                                   "hold": self.hangs.hold_time()}
        if self.policy.enabled:  # the wrapper sets them in front of the rank, over torchrun's own count
            welcome["env"] = per_attempt.attempt_env(self.attempt, self.policy.max_restarts)
        return welcome

    def _on_registered(self, entry: RankEntry) -> None:
        self.trace(f"rank {entry.rank} registered (wrapper pid {entry.peer_pid})")
        self.events.emit(EventKind.RANK_REGISTERED, entry.rank, host=self.ranks.host, pid=entry.peer_pid)
        if entry.rank is not None:
            self.hangs.registered(entry.rank)

    def _on_rank_started(self, entry: RankEntry) -> None:
        self.events.emit(EventKind.RANK_STARTED, entry.rank, pid=entry.rank_pid)

    def _on_traceback(self, entry: RankEntry, message: dict[str, Any]) -> None:
        assert entry.rank is not None
        self.trace(f"rank {entry.rank} printed a traceback")
        self.hangs.traceback(entry.rank, [str(t) for t in message.get("tail") or ()],
                             float(message.get("wall") or time.time()))

    def _live_ranks(self) -> list[tuple[int, int]]:
        """(rank, pid) of this node's ranks that run (the pids are this supervisor's namespace's)."""
        return [(r, e.rank_pid) for r, e in sorted(self.ranks.ranks.items()) if e.status is None and e.rank_pid]

    def _on_rank_exit(self, status: RankStatus) -> None:
        self.trace(f"rank {status.rank} ended: {status.describe()}")
        self.hangs.exited(status.rank)
        self.events.emit(EventKind.RANK_EXITED, status.rank, code=None if status.signal else status.exit_code,
                         signal=status.signal, wall=status.wall, stopped=status.stopped)
        if self.link is not None:
            self.link.rank_exited(status)
        self._fail(RankEnded(status))

    def _on_signal(self, signum: int) -> None:
        if signum != signal.SIGCHLD:
            self._on_stop_signal(signum)
        self.processes.reap()  # a SIGCHLD coalesced into another wakeup is still reaped

    def _on_stop_signal(self, signum: int) -> None:
        name = signal_name(signum)
        interrupt = Interrupted(signum, self.node, time.time())
        if self.phase in (Phase.LOCAL_DONE, Phase.CLOSING):  # the chief, waiting for the other nodes
            self.say(f"{name} received: not waiting for the other nodes")
            if self.verdict.add(interrupt) is Decision.FIRST:
                self._tell_link(interrupt)
            self._enter(Phase.DONE)
        elif self.phase is Phase.BACKOFF:  # between attempts: nothing runs, and nothing will
            self.say(f"{name} received while waiting to restart: not restarting")
            self.verdict.add(interrupt)
            self._tell_link(interrupt)
            self._stop(signum)
        elif self.phase is Phase.SWEEPING:  # the ranks are gone; only leftovers remain
            self.say(f"{name} received: not waiting for what is left of the job")
            self._sweep_deadline()
        elif not self.phase.active or self.verdict.interrupted_by is not None:
            self.say(f"{name} again: killing every process of the job now")
            self._kill_all()
        else:
            self.verdict.add(interrupt)
            self.say(f"{name} received: stopping the job (again to kill at once; SIGKILL in "
                     f"{self.plan.grace_period:g} s)")
            self._tell_link(interrupt)
            self._stop(signum, ranks_first=True)

    def _on_start_timeout(self) -> None:
        missing = self.link.missing_nodes() if self.link is not None else []
        timeout = self.plan.start_timeout
        if missing and self.phase.active:
            if self.plan.cluster.is_chief:
                self.fail_to_start(f"node(s) {', '.join(map(str, missing))} never joined the job within "
                                   f"{timeout:g} s (--start-timeout): is detlaunch running "
                                   "there, with the same host list and --control-port?")
            else:
                host = self.plan.cluster.chief_addr
                self.fail_to_start(f"never reached the chief at {host}:{self.plan.control_port} within "
                                   f"{timeout:g} s (--start-timeout): is detlaunch running there?")
        elif self.phase is Phase.STARTING:
            waiting = ", ".join(f"{p.host}:{p.port}" for p in self.probes if not p.ready)
            self.fail_to_start(f"sshd on {waiting} did not answer within {timeout:g} s "
                               "(is detlaunch running on that node, with the same --ssh-port?)")
        elif isinstance(self.link, WorkerLink):
            return  # joined: the chief, waiting for the whole job, decides when to give up
        elif self.phase is Phase.RUNNING and len(self.ranks.ranks) < self.plan.expected_ranks:
            self._fail(StartFailed(f"only {len(self.ranks.ranks)} of {self.plan.expected_ranks} rank(s) started "
                                   f"on node {self.node} within {timeout:g} s (--start-timeout): "
                                   "are the other nodes up?", self.node, time.time()))

    # -- the other nodes (joblink's ChiefEvents and WorkerEvents) ------------------------------
    def joined(self) -> None:
        """Chief: every node has joined the job; worker: this node joined the chief."""
        self.link_up = True
        if self.phase.over:  # this node's part has ended: a late welcome only carries its goodbye
            return
        if self.phase is Phase.BACKOFF and isinstance(self.link, ChiefLink):
            self.driver.rejoined()
        elif self.awaiting_join:
            self._joined_attempt()
        else:
            self._start_when_ready()

    def remote_rank_exit(self, status: RankStatus) -> None:
        """Chief: a worker node's rank ended."""
        self._fail(RankEnded(status))

    def remote_failure(self, failure: Failure) -> None:
        """Chief: a worker node failed for another reason (its sshd died, it was interrupted...)."""
        self._fail(RemoteFailure(failure))

    def node_lost(self, node: int, addr: str, why: str) -> None:
        """Chief: a worker node's supervisor vanished."""
        self.events.emit(EventKind.NODE_LOST, node=node, host=addr, reason=why)
        self.control.node_gone(node)
        if self.phase is Phase.BACKOFF and self.policy.enabled:
            self.driver.lost_between_attempts(node, addr, why)
        elif self.phase.active:
            self._fail(NodeLost(node, addr, why, time.time()))

    def chief_verdict(self, failure: Failure | None) -> None:
        """Worker: the chief decided the job is over; its verdict is this node's too."""
        was_active = self.phase.active
        self.hangs.stopped()
        self.verdict.add(ChiefVerdict(failure))
        if was_active and failure is not None:
            self.say(f"the chief stopped the job: {failure.what}")
        self.hangs.stop_after_own_dumps(lambda: self._stop(signal.SIGTERM))  # the chief asked for them first

    def chief_restart(self, attempt: int, delay: float | None) -> None:
        """Worker: the chief starts attempt `attempt` on every node after `delay` seconds."""
        self.driver.chief_restart(attempt, delay)

    def chief_go(self, attempt: int) -> None:
        """Worker: every node is back after a lost one: attempt `attempt` starts now."""
        self.driver.next_attempt(attempt)

    def chief_lost(self, why: str) -> None:
        """Worker: the chief's supervisor vanished before the job ended."""
        self.control.close()  # questions passed to it will get no answer
        if self.phase.active or self.phase is Phase.BACKOFF:
            self._fail(ChiefLost(self.plan.cluster.chief_addr, why, self.node, time.time()))

    def node_joined(self, node: int, addr: str) -> None:
        """Chief: a worker node's supervisor joined the job link."""
        self.events.emit(EventKind.NODE_JOINED, node=node, host=addr)

    def link_failed_to_start(self, what: str) -> None:
        self.fail_to_start(what)

    # -- questions from another shell (control.py routes them; the link's events come through here) --
    def _on_client_request(self, entry: RankEntry, message: dict[str, Any]) -> None:
        self.control.client_request(message, lambda data: self.ranks.answer(entry, data))

    def remote_ask(self, node: int, key: int, what: str, args: dict[str, Any]) -> None:
        self.control.remote_ask(node, key, what, args)

    def remote_reply(self, node: int, key: int, data: Any) -> None:
        self.control.part(key, node, data)

    def chief_request(self, key: int, what: str, args: dict[str, Any]) -> None:
        self.control.chief_request(key, what, args)

    def chief_answer(self, key: int, data: dict[str, Any]) -> None:
        self.control.answered(key, data)

    def _status(self, args: Any, done: Any) -> None:
        """This node's part of `detlaunch status` (status.StatusTracker.answer); each rank's last
        output and heartbeat come from its progress records (the ones the hang watch reads)."""
        seen = last_seen(self.plan.run_dir, self.ranks.ranks)
        failure = self.verdict.failure
        done(self.events.tracker.answer(self.ranks.host, seen, failure.what if failure else None,
                                        self.attempt - 1, time.time()))

    def _sample(self) -> None:
        """CPU % and RSS of each running rank's process tree, every SAMPLE_EVERY s while ranks run."""
        if not (self.phase.active or self.phase.stopping) or self.sampler is None:
            return
        usage = self.events.tracker.usage
        for rank, entry in self.ranks.ranks.items():
            if entry.status is None and entry.rank_pid:
                sample = self.sampler.sample(entry.rank_pid)
                if sample is not None:
                    usage[rank] = (sample.cpu_percent, sample.rss)
        self.sample_timer = self.loop.call_later(SAMPLE_EVERY, self._sample)

    # -- deciding and stopping -------------------------------------------------------------------
    def _fail(self, event: Event) -> None:
        """Feed the verdict; the first failure stops the job at once (see verdict.py for the rules)."""
        decision = self.verdict.add(event)
        failure = self.verdict.failure
        if isinstance(event, Hung) and decision is Decision.FIRST:
            self.events.emit(EventKind.HANG_DETECTED, silent_for=round(event.idle, 3))
        if decision in (Decision.FIRST, Decision.EARLIER) and failure is not None:
            self.events.emit(EventKind.FAILURE, failure.rank.rank if failure.rank else None, what=failure.what,
                             exit_code=failure.exit_code, at=failure.at)
        if decision is Decision.FIRST and failure is not None:
            self.say(f"{failure.what}: stopping the job")
            # The chief's dump asks every node for its stacks first: each stops once its own are taken.
            dumping = self.hangs.dump_before_stop(failure, lambda: self._stop(signal.SIGTERM))
            self._tell_link(event)
            if dumping:
                return
        elif decision is Decision.EARLIER and failure is not None:
            self.trace(f"an earlier failure came in: {failure.what}")
            self._tell_link(event)
        if decision is not Decision.IGNORED and not self.hangs.dumping:
            self.hangs.stop_after_own_dumps(lambda: self._stop(signal.SIGTERM))

    def fail_to_start(self, what: str) -> None:
        event = StartFailed(what, self.node, time.time())
        if self.verdict.add(event) is Decision.FIRST:
            self.say(what)
            self._tell_link(event)
        for probe in self.probes:
            probe.close()
        self._stop(signal.SIGTERM)

    def _tell_link(self, event: Event) -> None:
        """Tell the other nodes (worker: the chief; chief: every worker) what stops the job."""
        failure = self.verdict.failure or as_failure(event)
        if isinstance(self.link, ChiefLink) and failure is not None:
            self.link.failed(failure)
        elif isinstance(self.link, WorkerLink) and failure is not None:
            self.link.failed(naming_the_node(failure, self.node))

    def _stop(self, rank_signal: int, ranks_first: bool = False) -> None:
        """Stop this node's part of the job: ranks through their wrappers, then the launchers.

        On a failure, everything is signalled at once. On the user's signal, the ranks get that
        signal first and the launchers are left alone until the ranks are gone, so no launcher's
        own SIGTERM races the SIGINT a rank was about to handle. Either way, whatever is left
        after the grace period is SIGKILLed.
        """
        if self.phase is Phase.BACKOFF:  # no attempt runs: the job ends here, without another
            self.driver.stop_waiting()
            self._enter(Phase.LOCAL_DONE)
            return
        if not self.phase.active:
            return
        self.events.emit(EventKind.STOP_REQUESTED, reason=self._stop_reason())
        self.ranks.release()
        asked = self.ranks.signal_live(rank_signal)
        if ranks_first and asked:
            self._enter(Phase.STOPPING_RANKS)
        else:
            self._enter(Phase.STOPPING)
            self._stop_children()
        self.kill_timer = self.loop.call_later(self.plan.grace_period, self._kill_all)

    def _stop_reason(self) -> str:
        v = self.verdict
        if v.decided_by_chief:
            return "chief"
        if v.failure is not None:
            return "failure"
        if v.interrupted_by is not None:
            return f"signal {signal_name(v.interrupted_by)}"
        return "finished"

    def _stop_children(self) -> None:
        clean = not self.verdict.stopping
        registered = {entry.peer_pid for entry in self.ranks.ranks.values()}
        for child in self.processes.live():
            if child.command.rank is not None and child.pid in registered:
                continue  # a rank this supervisor started is signalled once, as a rank (see _stop)
            # After a clean end, sshd sessions finish delivering their ranks' exit statuses.
            self.processes.stop(child, with_sessions=child.command.daemon and not clean)

    def _kill_all(self) -> None:
        if self.phase is Phase.SWEEPING or self.phase.over:
            return  # sweeping: the sweep's own deadline kills what is left, and says so
        self._enter(Phase.KILLING)
        left = self.processes.leftovers()
        self.ranks.kill_live()
        count = self.processes.kill_all()
        if count:
            self.trace(f"SIGKILLed {count} process(es)")
            self.events.emit(EventKind.SIGKILL_SENT, pids=left)

    def _advance(self) -> None:
        """After every batch of events: move through the phases as far as the state allows."""
        if self.phase is Phase.RUNNING and self._ranks_over():
            registered, expected = len(self.ranks.ranks), self.plan.expected_ranks
            if registered < expected:
                self._fail(StartFailed(f"the launcher ended, but only {registered} of {expected} "
                                       f"rank(s) ever started on node {self.node}", self.node, time.time()))
            else:
                self._stop(signal.SIGTERM)
        ranks_done = self.ranks.all_reported()
        if self.phase is Phase.STOPPING_RANKS and ranks_done:
            self._enter(Phase.STOPPING)
            self._stop_children()
        if self.phase is Phase.STOPPING and ranks_done and self.ranks.ranks and self.verdict.stopping:
            # No rank of this node runs any more: a launcher's own shutdown (torchrun takes a
            # second) is not worth waiting for, and it has nothing left to clean up.
            self._kill_all()
        if self.phase.stopping and not self.processes.live() and not self.ranks.wrappers_connected():
            self._enter(Phase.SWEEPING)
            self.sweep_timer = self.loop.call_later(max(self.plan.grace_period, 1.0), self._sweep_deadline)
        if self.phase is Phase.SWEEPING:
            self._sweep()
        if self.phase is Phase.LOCAL_DONE and (self.link is None or self.link.ready_to_finish()) \
                and not self.driver.restart_if_decided():
            if self.link is not None:
                statuses = [e.status for e in self.ranks.ranks.values() if e.status]
                self.link.finish(self.verdict.failure, statuses)
            self._enter(Phase.CLOSING)
        if self.phase is Phase.CLOSING and (self.link is None or self.link.closed):
            self._enter(Phase.DONE)

    def _ranks_over(self) -> bool:
        """RUNNING: every launcher has exited (daemons only, as sshd: every expected rank came and went)."""
        launchers = self.processes.launchers()
        if launchers:
            return all(not c.running for c in launchers)
        return len(self.ranks.ranks) >= self.plan.expected_ranks and self.ranks.all_reported()

    def _sweep(self) -> None:
        """The job is over on this node (SWEEPING): nothing it started may outlive it.

        After a clean end, leftovers (an sshd session delivering its rank's exit status) get
        the grace period to finish on their own; after a failure they are killed now. Orphans
        are re-parented to this subreaper, so each exit wakes the loop and this runs again;
        whatever is still there at the deadline is SIGKILLed (see _sweep_deadline).
        """
        leftovers = self.processes.leftovers()
        if not leftovers:
            self._enter(Phase.LOCAL_DONE)
        elif self.verdict.stopping:
            self.trace(f"killing {len(leftovers)} leftover process(es): {leftovers}")
            self.processes.kill_all()

    def _sweep_deadline(self) -> None:
        if self.phase is not Phase.SWEEPING:
            return
        leftovers = self.processes.leftovers()
        if leftovers:
            self.say(f"killing process(es) that outlived the job: {leftovers}")
            self.processes.kill_all()
            self.events.emit(EventKind.SIGKILL_SENT, pids=leftovers)
            self.processes.reap()
        self._enter(Phase.LOCAL_DONE)

    # -- attempts (restarts/policy.py decides, the chief for the whole job; attempt_driver.py drives) ---------
    def attempt_end(self) -> AttemptEnd:
        """How the attempt that just ended ended, as the restart policy reads it."""
        v = self.verdict
        remote = self.link.remote_ranks if isinstance(self.link, ChiefLink) else {}
        return attempt_end(self.attempt, v.failure, v.interrupted_by, v.exit_code,
                           started=bool(self.ranks.ranks or remote), policy=self.policy,
                           started_at=self.attempt_wall, ended_at=time.time())

    def stopped_why(self) -> str:
        v = self.verdict
        if v.interrupted_by is not None:
            return "the job was interrupted"
        return v.failure.what if v.failure else "the job ended"

    def end_attempt(self) -> None:
        for timer in (self.kill_timer, self.start_timer, self.sweep_timer, self.sample_timer):
            cancel_timer(timer)
        self.attempts.wait()
        self.hangs.new_attempt()  # a traceback timer or the hang watch of the last attempt must not fire in the next
        self.events.emit(EventKind.ATTEMPT_ENDED, attempt=self.attempt - 1, exit_code=self.verdict.exit_code)
        self.verdict = Verdict()  # a signal or a failure during the wait is the job's end, not the last attempt's
        self._enter(Phase.BACKOFF)

    def start_attempt(self, attempt: int) -> None:
        for probe in self.probes:
            probe.close()
        self.ranks.close()
        self.processes.close()
        try:
            os.unlink(self.plan.socket_path)  # the new attempt's registry listens on the same path
        except OSError:
            pass
        self.attempts.begin(attempt)
        self.events.emit(EventKind.ATTEMPT_STARTED, attempt=attempt - 1)
        self._new_attempt_parts()
        self._enter(Phase.STARTING)
        if isinstance(self.link, ChiefLink):
            self.link.go()  # the nodes that waited for lost ones start too
        try:
            self.ranks.listen(self.plan.socket_path)
            self._start_stage()
        except (LaunchError, OSError) as e:
            self.fail_to_start(str(e))

    def fail(self, event: Event) -> None:
        self._fail(event)

    def _joins_first(self) -> bool:
        """Worker with restarts on: its stage waits for the chief's welcome, which says which attempt it
        joins (a node that was lost and started again joins a later one, and may have to wait for go)."""
        return isinstance(self.link, WorkerLink) and self.policy.enabled

    def _await_join(self) -> None:
        self.awaiting_join = True
        self.start_timer = self.loop.call_at(self.attempt_started_at + self.plan.start_timeout,
                                             self._on_start_timeout)

    def _joined_attempt(self) -> None:
        """Worker: joined; start the attempt the chief runs (or wait for its go)."""
        assert isinstance(self.link, WorkerLink)
        self.awaiting_join = False
        cancel_timer(self.start_timer)
        if not self.driver.joined(self.link.attempt, self.link.hold):
            self._start_stage()

    def attempts_report(self) -> list[str]:
        """The chief's report of every attempt, printed before the last one's (restarts on only)."""
        return self.attempts.report()

    # -- the end ----------------------------------------------------------------------------------
    def _cleanup(self) -> None:
        if self.link is not None:
            self.link.close()
        if self.standby is not None:  # no attempt followed
            self.standby.stop()
            self.standby = None
        if not self.phase.over:
            self.processes.kill_all()
        self.processes.reap()
        for probe in self.probes:
            probe.close()
        if self.console is not None:
            self.console.close()
        self.control.close()
        self.hangs.close()
        self.ranks.close()
        self.processes.close()
        self.loop.close()
        try:
            os.unlink(self.plan.socket_path)
        except OSError:
            pass
        self.files.remove()
        if self.run_dir is not None:
            self.run_dir.close()

    def _result(self) -> JobResult:
        local = self.ranks.statuses()
        remote = self.link.remote_ranks if isinstance(self.link, ChiefLink) else {}
        ranks = tuple(status for _, status in sorted({**remote, **local}.items()))
        failure = self.verdict.failure
        cause = self.verdict.cause
        if failure is not None and isinstance(cause, ChildExited):  # its output may have grown since
            child = self.processes.children[cause.pid]
            tail = tuple(rank_protocol.last_lines(child.tail, rank_protocol.SHOWN_LINES))
            failure = Failure(failure.what, failure.exit_code, tail=tail, tail_of=child.command.name, at=failure.at,
                              kind=failure.kind)
        return JobResult(exit_code=self.verdict.exit_code, ranks=ranks, failure=failure,
                         interrupted_by=self.verdict.interrupted_by,
                         duration=time.monotonic() - self.started_at, node_rank=self.node,
                         warnings=tuple(self.processes.log_errors), stacks=self.hangs.dumped)
