"""How this node's part of an attempt stops: from the running ranks to nothing left (LOCAL_DONE).

On a failure, every process is signalled at once. On the user's signal, the ranks get that signal
first and the launchers are left alone until the ranks are gone, so no launcher's own SIGTERM races
the SIGINT a rank was about to handle. Either way, whatever is left after the grace period is
SIGKILLed; then the sweep: nothing the attempt started may outlive it. A second signal kills at once;
a node's first one while it already stops for another reason (a failure, the chief's verdict) is no second
one: a spawned node's SIGHUP at its stdin's end (cli/spawning.py) races the chief's verdict that way.

The phases it moves through are drawn in phase.py; the supervisor decides when to stop (its verdict)
and what comes after LOCAL_DONE (the other nodes, a restart). This part reaches the supervisor only
through `ShutdownHost`.
"""

from __future__ import annotations

import signal
import time
from typing import Protocol

from detlaunch.node.attempt_driver import AttemptDriver
from detlaunch.node.phase import Phase
from detlaunch.node.process_table import ProcessTable
from detlaunch.node.rank_registry import RankRegistry
from detlaunch.node.verdict import Decision, Interrupted, StartFailed, Verdict, VerdictEvent
from detlaunch.observe.emitter import EventEmitter
from detlaunch.observe.events import EventKind
from detlaunch.outcome import signal_name
from detlaunch.planning.plan import LaunchPlan
from detlaunch.rank import protocol as rank_protocol
from detlaunch.system.eventloop import EventLoop, Timer, cancel_timer


class ShutdownHost(Protocol):
    """What stopping needs of the node's supervisor: the current attempt's parts, and its phase."""

    loop: EventLoop
    plan: LaunchPlan
    node: int
    verdict: Verdict
    ranks: RankRegistry
    processes: ProcessTable
    events: EventEmitter
    driver: AttemptDriver

    @property
    def phase(self) -> Phase: ...

    def enter(self, phase: Phase) -> None: ...
    def say(self, message: str) -> None: ...
    def trace(self, message: str) -> None: ...
    def fail(self, event: VerdictEvent) -> None: ...
    def tell_link(self, event: VerdictEvent) -> None: ...


class Shutdown:
    def __init__(self, host: ShutdownHost) -> None:
        self.host = host
        self.kill_timer: Timer | None = None  # the grace period's end
        self.sweep_timer: Timer | None = None  # the sweep's deadline
        self.signalled = False  # this node had a stop signal: the next one kills at once

    def new_attempt(self) -> None:
        """The last attempt's timers must not fire in the next one."""
        cancel_timer(self.kill_timer)
        cancel_timer(self.sweep_timer)
        self.kill_timer = self.sweep_timer = None

    def stop(self, rank_signal: int, ranks_first: bool = False) -> None:
        """Stop this node's part of the job: ranks through their wrappers, then the launchers (ranks_first:
        the launchers once the ranks are gone)."""
        h = self.host
        if h.phase is Phase.BACKOFF:  # no attempt runs: the job ends here, without another
            h.driver.stop_waiting()
            h.enter(Phase.LOCAL_DONE)
            return
        if not h.phase.active:
            return
        h.events.emit(EventKind.STOP_REQUESTED, reason=self._reason())
        h.ranks.release()
        asked = h.ranks.signal_live(rank_signal)
        if ranks_first and asked:
            h.enter(Phase.STOPPING_RANKS)
        else:
            h.enter(Phase.STOPPING)
            self._stop_children()
        self.kill_timer = h.loop.call_later(h.plan.grace_period, self.kill_all)

    def _reason(self) -> str:
        v = self.host.verdict
        if v.decided_by_chief:
            return "chief"
        if v.failure is not None:
            return "failure"
        if v.interrupted_by is not None:
            return f"signal {signal_name(v.interrupted_by)}"
        return "finished"

    def _stop_children(self) -> None:
        h = self.host
        clean = not h.verdict.stopping
        registered = {entry.peer_pid for entry in h.ranks.ranks.values()}
        for child in h.processes.live():
            if child.command.rank is not None and child.pid in registered:
                continue  # a rank this supervisor started is signalled once, as a rank (see stop)
            # After a clean end, sshd sessions finish delivering their ranks' exit statuses.
            h.processes.stop(child, with_sessions=child.command.daemon and not clean)

    def kill_all(self) -> None:
        h = self.host
        if h.phase is Phase.SWEEPING or h.phase.over:
            return  # sweeping: the sweep's own deadline kills what is left, and says so
        h.enter(Phase.KILLING)
        left = h.processes.leftovers()
        h.ranks.kill_live()
        count = h.processes.kill_all()
        if count:
            h.trace(f"SIGKILLed {count} process(es)")
            h.events.emit(EventKind.SIGKILL_SENT, pids=left)

    def advance(self) -> None:
        """After every batch of events: from RUNNING towards LOCAL_DONE, as far as the state allows."""
        h = self.host
        if h.phase is Phase.RUNNING and self._ranks_over():
            registered, expected = len(h.ranks.ranks), h.plan.expected_ranks
            if registered < expected:
                h.fail(StartFailed(f"the launcher ended, but only {registered} of {expected} "
                                   f"rank(s) ever started on node {h.node}", h.node, time.time()))
            else:
                self.stop(signal.SIGTERM)
        ranks_done = h.ranks.all_reported()
        if h.phase is Phase.STOPPING_RANKS and ranks_done:
            h.enter(Phase.STOPPING)
            self._stop_children()
        if h.phase is Phase.STOPPING and ranks_done and h.ranks.ranks and h.verdict.stopping:
            # No rank of this node runs any more: a launcher's own shutdown (torchrun takes a
            # second) is not worth waiting for, and it has nothing left to clean up.
            self.kill_all()
        if h.phase.stopping and not h.processes.live() and not h.ranks.wrappers_connected():
            h.enter(Phase.SWEEPING)
            self.sweep_timer = h.loop.call_later(self._sweep_wait(), self.sweep_deadline)
        if h.phase is Phase.SWEEPING:
            self._sweep()

    def _sweep_wait(self) -> float:
        """How long leftovers may take to end on their own. No rank is left to save anything: at most
        LEFTOVER_WAIT of the grace period. But after a clean end, a daemon's sessions (sshd: the chief's
        launcher's ssh connection to this node, whose remote launcher is reporting its ranks' exit 0)
        get the whole grace period: killed, the remote launcher's ssh exits 255 and a job whose ranks all
        succeeded fails on the chief (deepspeed's launcher polls its ranks once a second, then exits: on a
        loaded machine, more than 5 s)."""
        h = self.host
        grace = float(h.plan.grace_period)
        daemons = any(c.daemon for c in h.plan.stage.commands)
        if daemons and not h.verdict.stopping:
            return max(grace, 1.0)
        return max(min(grace, rank_protocol.LEFTOVER_WAIT), 1.0)

    def _ranks_over(self) -> bool:
        """RUNNING: every launcher has exited (daemons only, as sshd: every expected rank came and went)."""
        h = self.host
        launchers = h.processes.launchers()
        if launchers:
            return all(not c.running for c in launchers)
        return len(h.ranks.ranks) >= h.plan.expected_ranks and h.ranks.all_reported()

    def _sweep(self) -> None:
        """The job is over on this node (SWEEPING): nothing it started may outlive it.

        After a clean end, leftovers (an sshd session delivering its rank's exit status) get
        a while to finish on their own (_sweep_wait); after a failure they are killed now. Orphans
        are re-parented to this subreaper, so each exit wakes the loop and this runs again;
        whatever is still there at the deadline is SIGKILLed (see sweep_deadline).
        """
        h = self.host
        leftovers = h.processes.leftovers()
        if not leftovers:
            h.enter(Phase.LOCAL_DONE)
        elif h.verdict.stopping:
            h.trace(f"killing {len(leftovers)} leftover process(es): {leftovers}")
            h.processes.kill_all()

    def sweep_deadline(self) -> None:
        h = self.host
        if h.phase is not Phase.SWEEPING:
            return
        leftovers = h.processes.leftovers()
        if leftovers:
            h.say(f"killing process(es) that outlived the job: {leftovers}")
            h.processes.kill_all()
            h.events.emit(EventKind.SIGKILL_SENT, pids=leftovers)
            h.processes.reap()
        h.enter(Phase.LOCAL_DONE)

    def on_stop_signal(self, signum: int) -> None:
        """SIGINT, SIGTERM or SIGHUP from the user: what it does depends on where this node's part is."""
        h = self.host
        name = signal_name(signum)
        interrupt = Interrupted(signum, h.node, time.time())
        signalled, self.signalled = self.signalled, True
        if h.phase in (Phase.LOCAL_DONE, Phase.CLOSING):  # the chief, waiting for the other nodes
            h.say(f"{name} received: not waiting for the other nodes")
            if h.verdict.add(interrupt) is Decision.FIRST:
                h.tell_link(interrupt)
            h.enter(Phase.DONE)
        elif h.phase is Phase.BACKOFF:  # between attempts: nothing runs, and nothing will
            h.say(f"{name} received while waiting to restart: not restarting")
            h.verdict.add(interrupt)
            h.tell_link(interrupt)
            self.stop(signum)
        elif h.phase is Phase.SWEEPING:  # the ranks are gone; only leftovers remain
            h.say(f"{name} received: not waiting for what is left of the job")
            self.sweep_deadline()
        elif h.phase.stopping and not signalled:  # for a failure, or the chief's verdict: not a second signal
            h.say(f"{name} received: the job is already stopping (again to kill at once)")
        elif not h.phase.active or h.verdict.interrupted_by is not None:
            h.say(f"{name} again: killing every process of the job now")
            self.kill_all()
        else:
            h.verdict.add(interrupt)
            h.say(f"{name} received: stopping the job (again to kill at once; SIGKILL in "
                  f"{h.plan.grace_period:g} s)")
            h.tell_link(interrupt)
            self.stop(signum, ranks_first=True)
