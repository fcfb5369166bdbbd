"""The node supervisor (the seed's pid_server role): one per node, owning every process it starts.

It is the policy that ties the parts together; each part knows nothing of the others:

- eventloop.EventLoop: the selector, timers and the signal self-pipe (nothing polls);
- process_table.ProcessTable: the launchers and daemons it started (output, reaping, stopping);
- rank_registry.RankRegistry: the rank wrappers' socket and their reports;
- verdict.Verdict: which failure is the root cause, and the exit code (pure);
- link.chief / link.worker: the other nodes' supervisors (the link hands questions to
  control.ControlRequests, and the chief's restarts to the attempt driver, itself), and
  link_events.LinkEvents: what the rest of the link's news means for this node;
- startup.Startup, shutdown.Shutdown: an attempt's start (daemons, sshd probes, launchers, the standby)
  and its timeout; its stop (ranks, launchers, SIGKILL, the sweep) and the user's signals;
- attempt_driver.AttemptDriver: between two attempts of a restart (the backoff, lost nodes, the next start);
- hangs.HangPolicy, node_status.NodeStatus: hangs and stacks, this node's part of `detlaunch status`;
- phase.Phase: where this node's part of the job is; succession.Succession: the job outliving its chief;
- stage_files.StageFiles: the stage's files and folders on this node, written at the start and removed at the end.

When any rank fails, it stops every other process at once (the ranks through their wrappers, the launchers
with their stop signal), SIGKILLs what is left after the grace period, exits with that rank's own exit code.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import detlaunch.exit_codes as exit_codes
from detlaunch.errors import LaunchError
from detlaunch.link.chief import ChiefLink
from detlaunch.link.control import ControlRequests, write_job_file
from detlaunch.link.worker import WorkerLink
from detlaunch.node import replan as replanning
from detlaunch.node.attempt_driver import AttemptDriver
from detlaunch.node.hangs import HangPolicy
from detlaunch.node.link_events import LinkEvents
from detlaunch.node.node_status import NodeStatus
from detlaunch.node.phase import Phase as Phase  # the phases were defined here first
from detlaunch.node.preflight import Preflight
from detlaunch.node.process_table import Child, ProcessTable
from detlaunch.node.rank_registry import RankEntry, RankRegistry, RankRules
from detlaunch.node.rank_template import RankTemplate
from detlaunch.node.shutdown import Shutdown
from detlaunch.node.stage_files import StageFiles
from detlaunch.node.startup import Startup
from detlaunch.node.straggler_watch import StragglerWatch
from detlaunch.node.succession import Succession, Takeover
from detlaunch.node.verdict import (
    ChildExited,
    Decision,
    Hung,
    RankEnded,
    StartFailed,
    Verdict,
    VerdictEvent,
    as_failure,
    naming_the_node,
)
from detlaunch.observe import story_details
from detlaunch.observe.console import FoldingConsole
from detlaunch.observe.emitter import EventEmitter, EventHook
from detlaunch.observe.events import EventKind
from detlaunch.outcome import AttemptEnd, Failure, JobResult, RankStatus
from detlaunch.planning import rank_defaults
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.config import DEDUPE_MIN_RANKS
from detlaunch.planning.plan import LaunchPlan
from detlaunch.rank import protocol as rank_protocol
from detlaunch.rank.protocol import DEFAULT_PREFIX
from detlaunch.restarts import per_attempt
from detlaunch.restarts.attempts import Attempts, attempt_end_from_verdict
from detlaunch.system.eventloop import EventLoop
from detlaunch.system.rundirs import RunDir, create_run_dir
from detlaunch.system.safefs import ensure_private_dir

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class NodeSupervisor:
    link_events: LinkEvents  # made after the parts that call it back
    def __init__(self, plan: LaunchPlan, *, err: TextIO | None = None, debug: bool = False,
                 on_event: EventHook | None = None, replan: Callable[[ClusterInfo], LaunchPlan] | None = None,
                 carried: Takeover | None = None, promoted_from: int | None = None):
        """replan: this node's plan for a cluster whose nodes moved (a spare took a lost node's place at another
        address). carried: the chief was lost under this detlaunch's last supervisor (node/succession.py).
        promoted_from: this detlaunch waited as that spare, then was sent to this place (link/places.py)."""
        self.plan = plan
        self.base = plan.cluster  # one entry per place, its node rank the place's number (planning/membership.py)
        self.replan = replan
        self.err = err or sys.stderr
        self.debug = debug
        self.node = plan.cluster.node_rank
        self.phase = Phase.STARTING
        self.started_at = time.monotonic()
        self.env = plan.process_env()
        self.loop = EventLoop()
        self.link: ChiefLink | WorkerLink | None = None
        self.prepared = False
        self.rank_defaults: dict[str, str] = {}  # made ready by _prepare (the compile cache folder)
        # Job-wide restarts (restarts/): the chief keeps the history and decides; every node counts attempts.
        self.policy = plan.restarts
        self.attempts = Attempts(self.policy)
        self.driver = AttemptDriver(self)  # the backoff, the next attempt, lost nodes coming back
        self.succession = Succession(self, carried)  # the membership shared; a lost chief succeeded
        self.control = ControlRequests(  # questions from other shells, routed over the job link
            self.loop, plan.cluster.job_id, self.node,
            chief=lambda: self.link if isinstance(self.link, ChiefLink) else None,
            worker=lambda: self.link if isinstance(self.link, WorkerLink) else None)
        c = plan.cluster
        self.events = EventEmitter(plan.cluster.job_id, self.node, path=plan.events_path, hook=on_event,
                                   warn=lambda why: self.say(f"warning: {why}; the job goes on"))
        self.hangs = HangPolicy(self.loop, node=self.node, host=c.node_addr or socket.gethostname(),
                                run_dir=plan.run_dir, is_chief=c.is_chief, hang_timeout=plan.hang_timeout,
                                dump_budget=plan.dump_budget, ask_job=self.control.ask_job, fail=self.fail,
                                say=self.say, live_ranks=self._live_ranks, active=lambda: self.phase.active,
                                emit=self.events.emit)
        self.stragglers = StragglerWatch(  # the chief names a slow rank (after the hang policy: it marks them)
            self.loop, is_chief=c.is_chief, run_dir=plan.run_dir, threshold=plan.straggler_threshold,
            action=plan.straggler_action, ask_job=self.control.ask_job, emit=self.events.emit, say=self.say,
            live_ranks=self._live_ranks, usage=lambda: self.events.tracker.usage, active=lambda: self.phase.active,
            replace=lambda node: self.link_events.replace_straggler(node))
        self.status = NodeStatus(self)
        self.stragglers.serve(self.control, self.status.answer, self.hangs,  # status, stacks, sections
                              more=lambda: self.link_events.spare_facts())
        self.control.handle("progress", self.hangs.answer_progress)
        self.run_dir: RunDir | None = None
        self.files = StageFiles(plan.stage, plan.run_dir, plan.shared_dir)
        self.console = folding_console(plan, self.loop)  # the job's console, folding repeated lines (--dedupe)
        self.startup = Startup(self)
        self.shutdown = Shutdown(self)
        self.link_events = LinkEvents(self, promoted_from)  # what the other nodes' news means here
        self.preflight = Preflight(self, start=lambda: self.startup.start_when_ready(),  # --preflight
                                   replace=self.link_events.replace_before_start,
                                   end=lambda: self.shutdown.stop(signal.SIGTERM))
        self.ranks: RankRegistry  # this attempt's (below); a warm rank's end goes to its wrapper through it
        self.template = RankTemplate(plan, self.say, lambda pid, end: self.ranks.reaped(pid, end.code, end.signal))
        self._new_attempt_parts()

    @property
    def attempt(self) -> int:
        """The attempt that runs, or comes next (1 for the first)."""
        return self.attempts.number

    def _new_attempt_parts(self) -> None:
        """What lives for one attempt only: its verdict, its processes, its ranks (its timers: startup, shutdown)."""
        plan, c = self.plan, self.plan.cluster
        self.attempt_started_at = time.monotonic()
        self.attempt_wall = time.time()
        self.verdict = Verdict()
        log_dir = per_attempt.attempt_log_dir(plan.log_dir, self.attempt, self.policy.enabled) if plan.log_dir else None
        self.processes = ProcessTable(self.loop, log_dir=log_dir, node_rank=self.node,
                                      on_output=self._on_child_output, on_exit=self._on_child_exit,
                                      on_log_error=lambda why: self.say(f"warning: {why}; the job goes on"),
                                      on_orphan=self.template.reaped)
        self.startup.spare_standby(self.processes)
        self.template.spare(self.processes.spared)
        rules = RankRules(job_id=c.job_id, node_rank=c.node_rank, first_rank=c.first_rank,
                          local_slots=c.local_slots, check_range=plan.stage.expected_ranks is None)
        self.ranks = RankRegistry(self.loop, rules, c.node_addr or socket.gethostname(),
                                  accepting=lambda: self.phase.active, welcome=self._welcome,
                                  console_fds=self.console.fds if self.console else (1, 2),
                                  on_registered=self._on_registered, on_exit=self._on_rank_exit, trace=self.trace,
                                  on_request=self._on_client_request, on_started=self._on_rank_started,
                                  on_traceback=self._on_traceback)

    def say(self, message: str) -> None:
        print(f"detlaunch: {message}", file=self.err, flush=True)

    def trace(self, message: str) -> None:
        if self.debug:
            self.say(f"[node {self.node}] {message}")

    def enter(self, phase: Phase) -> None:
        if phase is not self.phase:
            self.trace(f"phase: {self.phase.value} -> {phase.value}")
            self.phase = phase

    # -- the run -----------------------------------------------------------------------------
    def _prepare(self) -> None:
        try:
            self.run_dir = create_run_dir(self.plan.run_dir)  # fails if anything already sits at this random path
            os.mkdir(os.path.join(self.plan.run_dir, "tmp"), 0o700)  # a private TMPDIR for the job
            self.rank_defaults = ready_rank_defaults(self.plan, self.trace)
            write_job_file(self.plan.run_dir, self.plan.cluster.job_id, self.node)
            self.ranks.listen(self.plan.socket_path)
            self.template.start(self.env, self.rank_defaults, self.processes.spared)
        except OSError as e:
            raise LaunchError(f"cannot set up {self.plan.run_dir}: {e.strerror or e}") from None
        self.loop.catch_signals((*STOP_SIGNALS, signal.SIGCHLD), self._on_signal)
        self.processes.adopt_orphans()
        self.prepared = True

    def run(self) -> JobResult:
        c = self.plan.cluster
        if self.succession.carried is None:  # else the job goes on: planned and started under the lost chief
            self.events.emit(EventKind.JOB_PLANNED, layer=self.plan.layer, nodes=c.num_nodes, ranks=sum(c.slots))
            if self.policy.enabled:
                self.events.emit(EventKind.ATTEMPT_STARTED, attempt=0)
        try:
            self._prepare()
            if c.num_nodes > 1:
                self.link = self.link_events.connect()
            self.files.write()
            self.startup.run_steps(self.plan.stage.setup)
            if self.succession.begin():
                pass  # the successor: the next attempt once a majority of the nodes has joined
            elif isinstance(self.link, WorkerLink) and self.policy.enabled:
                self.startup.await_join()  # the chief's welcome says which attempt this node joins
            else:
                self.startup.start_stage()
            self.loop.run(done=lambda: self.phase is Phase.DONE, after_each=self._advance)
        except LaunchError as e:
            self.fail_to_start(str(e))
            if self.prepared:
                self.loop.run(done=lambda: self.phase is Phase.DONE, after_each=self._advance)
        finally:
            self._cleanup()
        result = node_result(self)
        if self.policy.enabled and self.attempts.running:
            self.events.emit(EventKind.ATTEMPT_ENDED, **self.attempts.ended_event(self.attempt, result.exit_code))
        if result.failure is not None and not self.succession.handing_over:
            f = result.failure
            self.events.emit(EventKind.ROOT_CAUSE, f.rank.rank if f.rank else None, what=f.what,
                             exit_code=f.exit_code, at=f.at, **story_details.root_cause(result))
        if not self.succession.handing_over:  # else the job goes on under the next supervisor
            self.events.emit(EventKind.JOB_FINISHED, exit_code=result.exit_code, duration=result.duration)
        self.events.close()
        return dataclasses.replace(result, warnings=(*result.warnings, *self.events.warnings()))

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
        self.fail(ChildExited(child.command.name, child.pid, child.exit, child.command.daemon, self.node,
                              time.time()))

    def _welcome(self) -> dict[str, Any]:
        log_dir = os.path.abspath(self.processes.log_dir) if self.processes.log_dir else None
        ranks = self.plan.console_ranks
        welcome: dict[str, Any] = {"log_dir": log_dir, "console_ranks": list(ranks) if ranks is not None else None,
                                   "prefix": self.plan.prefix, "node": self.node, "host": self.ranks.host,
                                   "hold": self.hangs.hold_time(), "strict_teardown": self.plan.strict_teardown}
        if self.plan.not_progress:  # the wrapper does not mark these as progress (RankWrapper.not_progress)
            welcome["not_progress"] = list(self.plan.not_progress)
        if self.policy.enabled:  # the wrapper sets them in front of the rank, over torchrun's own count
            welcome["env"] = per_attempt.attempt_env(self.attempt, self.policy.max_restarts)
        if self.rank_defaults:  # the wrapper sets each one the rank's environment does not have
            welcome["defaults"] = self.rank_defaults
        welcome.update(self.template.welcome())
        return welcome

    def _on_registered(self, entry: RankEntry) -> None:
        self.trace(f"rank {entry.rank} registered (wrapper pid {entry.peer_pid})")
        self.events.emit(EventKind.RANK_REGISTERED, entry.rank, host=self.ranks.host, pid=entry.peer_pid)
        self.stragglers.registered()

    def _on_rank_started(self, entry: RankEntry) -> None:
        self.events.emit(EventKind.RANK_STARTED, entry.rank, pid=entry.rank_pid)
        if entry.rank is not None:
            self.hangs.started(entry.rank)
        if entry.rank_pid:
            self.driver.release.remember(entry.rank_pid)  # its pids as nvidia-smi may show them, after its end

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
        self.events.emit(EventKind.RANK_EXITED, status.rank, **story_details.rank_exited(status))
        if self.link is not None:
            self.link.rank_exited(status)
        self.fail(RankEnded(status))

    def _on_client_request(self, entry: RankEntry, message: dict[str, Any]) -> None:
        self.control.client_request(message, lambda data: self.ranks.answer(entry, data))

    def _on_signal(self, signum: int) -> None:
        if signum != signal.SIGCHLD:
            self.shutdown.on_stop_signal(signum)
        self.processes.reap()  # a SIGCHLD coalesced into another wakeup is still reaped

    # -- deciding and stopping -------------------------------------------------------------------
    def fail(self, event: VerdictEvent) -> None:
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
            dumping = self.hangs.dump_before_stop(failure, lambda: self.shutdown.stop(signal.SIGTERM))
            self.tell_link(event)
            if dumping:
                return
        elif decision is Decision.EARLIER and failure is not None:
            self.trace(f"an earlier failure came in: {failure.what}")
            self.tell_link(event)
        if decision is not Decision.IGNORED and not self.hangs.dumping:
            self.hangs.stop_after_own_dumps(lambda: self.shutdown.stop(signal.SIGTERM))

    def fail_to_start(self, what: str, exit_code: int = exit_codes.FAILED) -> None:
        event = StartFailed(what, self.node, time.time(), exit_code)
        if self.verdict.add(event) is Decision.FIRST:
            self.say(what)
            self.tell_link(event)
        self.startup.close_probes()
        self.shutdown.stop(signal.SIGTERM)

    def tell_link(self, event: VerdictEvent) -> None:
        """Tell the other nodes (worker: the chief; chief: every worker) what stops the job."""
        failure = self.verdict.failure or as_failure(event)
        if isinstance(self.link, ChiefLink) and failure is not None:
            self.link.failed(failure)
        elif isinstance(self.link, WorkerLink) and failure is not None:
            self.link.failed(naming_the_node(failure, self.node))

    def _advance(self) -> None:
        """After every batch of events: move through the phases as far as the state allows."""
        self.shutdown.advance()  # RUNNING ... LOCAL_DONE
        if self.phase is Phase.LOCAL_DONE and (self.link is None or self.link.ready_to_finish()) \
                and (self.succession.stepped_down or not self.driver.restart_if_decided()):
            if self.link is not None:
                statuses = [e.status for e in self.ranks.ranks.values() if e.status]
                self.link.finish(self.verdict.failure, statuses)
            self.enter(Phase.CLOSING)
        if self.phase is Phase.CLOSING and (self.link is None or self.link.closed):
            self.enter(Phase.DONE)

    # -- attempts (restarts/ decides, the chief for the whole job; attempt_driver.py drives) ----------
    def last_attempt_end(self) -> AttemptEnd:
        """How the attempt that just ended ended, as the restart policy reads it."""
        v = self.verdict
        remote = self.link.remote_ranks if isinstance(self.link, ChiefLink) else {}
        return attempt_end_from_verdict(self.attempt, v.failure, v.interrupted_by, v.exit_code,
                                        started=bool(self.ranks.ranks or remote), policy=self.policy,
                                        started_at=self.attempt_wall, ended_at=time.time())

    def stopped_why(self) -> str:
        v = self.verdict
        if v.interrupted_by is not None:
            return "the job was interrupted"
        return v.failure.what if v.failure else "the job ended"

    def enter_backoff(self) -> None:
        for part in (self.startup, self.shutdown):
            part.new_attempt()
        self.status.stop_sampling()
        self.attempts.wait()
        self.stragglers.new_attempt()
        self.hangs.new_attempt()  # a traceback timer or the hang watch of the last attempt must not fire in the next
        self.events.emit(EventKind.ATTEMPT_ENDED, **self.attempts.ended_event(self.attempt, self.verdict.exit_code))
        self.verdict = Verdict()  # a signal or a failure during the wait is the job's end, not the last attempt's
        self.enter(Phase.BACKOFF)
        self.succession.changed()

    def start_attempt(self, attempt: int) -> None:
        self.startup.new_attempt()
        self.ranks.close()
        self.processes.close()
        try:
            os.unlink(self.plan.socket_path)  # the new attempt's registry listens on the same path
        except OSError:
            pass
        self.attempts.begin(attempt)
        self.events.emit(EventKind.ATTEMPT_STARTED, attempt=attempt - 1)
        self.follow_membership()  # a spare took a lost node's place at another address, or the job shrank or grew
        self._new_attempt_parts()
        self.enter(Phase.STARTING)
        if isinstance(self.link, ChiefLink):
            self.link.go()  # the nodes that waited for lost ones start too
            self.succession.changed()
        try:
            self.ranks.listen(self.plan.socket_path)
            self.startup.start_stage()
        except (LaunchError, OSError) as e:
            self.fail_to_start(str(e))

    def follow_membership(self) -> bool:  # this node's plan for the membership its link knows (node/replan.py)
        return replanning.follow(self)

    # -- the end ----------------------------------------------------------------------------------
    def _cleanup(self) -> None:
        if self.link is not None:
            self.link.close()
        self.startup.close()  # its probes, and a standby no attempt used
        self.template.stop()
        self.driver.release.cancel()
        self.succession.close()
        if not self.phase.over:
            self.processes.kill_all()
        self.processes.reap()
        if self.console is not None:
            self.console.close()
        self.control.close()
        self.preflight.close()
        self.hangs.close()
        self.stragglers.close()
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


def node_result(sup: NodeSupervisor) -> JobResult:
    """This node's JobResult: its ranks and, on the chief, every node's; the verdict; the attempts."""
    local = sup.ranks.statuses()
    remote = sup.link.remote_ranks if isinstance(sup.link, ChiefLink) else {}
    ranks = tuple(status for _, status in sorted({**remote, **local}.items()))
    failure = sup.verdict.failure
    cause = sup.verdict.cause
    if failure is not None and isinstance(cause, ChildExited):  # its output may have grown since
        child = sup.processes.children[cause.pid]
        tail = tuple(rank_protocol.last_lines(child.tail, rank_protocol.SHOWN_LINES))
        failure = Failure(failure.what, failure.exit_code, tail=tail, tail_of=child.command.name, at=failure.at,
                          kind=failure.kind)
    return JobResult(exit_code=sup.verdict.exit_code, ranks=ranks, failure=failure,
                     interrupted_by=sup.verdict.interrupted_by,
                     duration=time.monotonic() - sup.started_at, node_rank=sup.node,
                     warnings=tuple(sup.processes.log_errors), stacks=sup.hangs.dumped,
                     attempts=tuple(sup.attempts.report()))


def ready_rank_defaults(plan: LaunchPlan, trace: Callable[[str], None]) -> dict[str, str]:
    """The plan's rank defaults, with the compile cache folder made (0700, the user's own): one that
    cannot be (a read-only home, a folder of someone else's) is left to torch's default, said under --debug."""
    defaults = dict(plan.rank_defaults)
    cache = defaults.get(rank_defaults.COMPILE_CACHE_ENV)
    if cache:
        try:
            ensure_private_dir(cache)
        except (OSError, LaunchError) as e:
            trace(f"no persistent compile cache for the ranks ({cache}: {getattr(e, 'strerror', None) or e})")
            del defaults[rank_defaults.COMPILE_CACHE_ENV]
    return defaults


def folding_console(plan: LaunchPlan, loop: EventLoop) -> FoldingConsole | None:
    """--dedupe: this node's rank output goes through the supervisor (console.py); else it does not."""
    c = plan.cluster
    console = plan.console_ranks
    printing = plan.expected_ranks if console is None else max(1, sum(
        1 for r in console if c.first_rank <= r < c.first_rank + c.local_slots))
    dedupe = plan.dedupe
    if dedupe is None:
        dedupe = plan.prefix == DEFAULT_PREFIX and printing > DEDUPE_MIN_RANKS and os.isatty(1) and os.isatty(2)
    return FoldingConsole(loop, printing, plan.dedupe_window) if dedupe else None
