"""How an attempt starts on this node: its daemons, then its launchers once every peer is ready, within --start-timeout.

Files and setup steps are the job's, done once (the supervisor's); each attempt starts its daemons
(a per-job sshd) afresh, so nothing of an attempt outlives it and a restart runs exactly a first
start's path. The launchers start once every peer's sshd answered; ranks this supervisor starts
itself (Command.rank) also wait for the whole job link, as torchrun's rendezvous would have it. With
restarts on, the next attempt's launcher is started ahead, past its imports (standby.py), and a
worker's stage waits for the chief's welcome, which says which attempt it joins.

Whatever of this has not happened within --start-timeout fails the start, naming what is missing.
This part reaches the supervisor only through `StartupHost`.
"""

from __future__ import annotations

import time
from typing import Protocol

from detlaunch.errors import LaunchError
from detlaunch.link.chief import ChiefLink
from detlaunch.link.dial import SshdProbe, probe_sshds
from detlaunch.link.worker import WorkerLink
from detlaunch.node.attempt_driver import AttemptDriver
from detlaunch.node.node_status import NodeStatus
from detlaunch.node.phase import Phase
from detlaunch.node.preflight import Preflight
from detlaunch.node.process_table import ProcessTable
from detlaunch.node.rank_registry import RankRegistry
from detlaunch.node.standby import Standby
from detlaunch.node.verdict import StartFailed, VerdictEvent
from detlaunch.observe.emitter import EventEmitter
from detlaunch.observe.events import EventKind
from detlaunch.planning.plan import LaunchPlan
from detlaunch.restarts.attempts import Attempts
from detlaunch.system.eventloop import EventLoop, Timer, cancel_timer


class StartupHost(Protocol):
    """What starting needs of the node's supervisor: the plan, the current attempt's parts, the link."""

    loop: EventLoop
    plan: LaunchPlan
    node: int
    env: dict[str, str]
    processes: ProcessTable
    ranks: RankRegistry
    events: EventEmitter
    attempts: Attempts
    driver: AttemptDriver
    status: NodeStatus
    preflight: Preflight
    attempt_started_at: float

    @property
    def phase(self) -> Phase: ...

    @property
    def link(self) -> ChiefLink | WorkerLink | None: ...

    def enter(self, phase: Phase) -> None: ...
    def trace(self, message: str) -> None: ...
    def fail(self, event: VerdictEvent) -> None: ...
    def fail_to_start(self, what: str) -> None: ...


class Startup:
    def __init__(self, host: StartupHost) -> None:
        self.host = host
        self.probes: list[SshdProbe] = []  # this attempt's: each peer's sshd, until it answers
        self.timer: Timer | None = None  # this attempt's --start-timeout
        self.awaiting_join = False  # worker: the stage starts once the chief said which attempt this is
        self.standby: Standby | None = None  # the next attempt's launcher, started ahead (restarts on)
        self.link_up = False  # chief: every node joined; worker: joined the chief (rank commands wait for it)

    def run_steps(self, steps: tuple[tuple[str, ...], ...]) -> None:
        h = self.host
        for argv in steps:
            h.trace(f"running {' '.join(argv)}")
            h.processes.run_step(argv, h.env, h.plan.start_timeout)

    def start_stage(self) -> None:
        """One attempt's processes: the daemons, then (once every peer's sshd answers) the launchers."""
        h = self.host
        for i, cmd in enumerate(h.plan.stage.commands):
            if cmd.daemon:
                self._start(i)
        self._arm_timeout()
        self.probes = probe_sshds(h.loop, h.plan.stage.wait_for_sshd, self._on_peer_ready, h.fail_to_start)
        if not self.probes:
            self.start_when_ready()

    def _arm_timeout(self) -> None:
        self.timer = self.host.loop.call_at(self.host.attempt_started_at + self.host.plan.start_timeout,
                                            self._on_timeout)

    def await_join(self) -> None:
        """Worker with restarts on: the stage waits for the chief's welcome (within --start-timeout)."""
        self.awaiting_join = True
        self._arm_timeout()

    def joined(self, link: WorkerLink) -> None:
        """Worker: joined; start the attempt the chief runs (or wait for its go)."""
        self.awaiting_join = False
        cancel_timer(self.timer)
        if not self.host.driver.joined(link.attempt, link.hold):
            self.start_stage()

    def reprobe(self) -> None:
        """The plan changed before the launchers started (a spare took a node's place): the sshds it waits for
        are probed again, and the launchers start once they answer."""
        h = self.host
        self.close_probes()
        self.probes = probe_sshds(h.loop, h.plan.stage.wait_for_sshd, self._on_peer_ready, h.fail_to_start)
        if not self.probes:
            self.start_when_ready()

    def _on_peer_ready(self, probe: SshdProbe) -> None:
        self.host.trace(f"sshd {probe.host}:{probe.port} answered")
        self.host.events.emit(EventKind.SSHD_READY, host=probe.host, port=probe.port)
        if all(p.ready for p in self.probes):
            self.start_when_ready()

    def start_when_ready(self) -> None:
        """Launchers start once every peer's sshd answered, and, when this supervisor starts ranks itself,
        once the whole job link is up: every node is there before any rank starts, as torchrun's
        rendezvous would have it, and no node can finish before it joined."""
        h = self.host
        starts_ranks = h.link is not None and any(c.rank is not None for c in h.plan.stage.commands)
        if all(p.ready for p in self.probes) and (self.link_up or not starts_ranks) \
                and not h.preflight.holds(self.link_up):  # --preflight: node/preflight.py
            self._start_launchers()

    def _start_launchers(self) -> None:
        h = self.host
        if h.phase is not Phase.STARTING:
            return
        h.enter(Phase.RUNNING)
        h.status.start_sampling()
        try:
            self.run_steps(h.plan.stage.prelaunch)
            for i, cmd in enumerate(h.plan.stage.commands):
                if not cmd.daemon:
                    self._start(i)
            self._start_standby()
        except LaunchError as e:
            h.fail_to_start(str(e))

    def _start(self, command_index: int) -> None:
        h = self.host
        command = h.plan.stage.commands[command_index]
        standby = None
        if self.standby is not None and command.standby is not None:  # only the launcher it was started for
            standby, self.standby = self.standby, None
            if not standby.fits(command.argv, {**h.env, **command.env}):
                h.processes.drop_standby(standby)
                standby = None
        child = h.processes.start(command, h.env, standby)
        h.trace(f"started {command.name} (pid {child.pid}{', its standby' if standby else ''})")
        h.events.emit(EventKind.LAUNCHER_STARTED, name=command.name, pid=child.pid)

    def _start_standby(self) -> None:
        """Restarts on: the next attempt's launcher starts now, past its imports (Command.standby)."""
        h = self.host
        launchers = [c for c in h.plan.stage.commands if c.standby is not None and not c.daemon]
        restarts_left = h.attempts.policy.restarts_after(h.attempts.number, h.plan.cluster.num_nodes)
        if restarts_left <= 0 or self.standby is not None or len(launchers) != 1:
            return
        command = launchers[0]
        assert command.standby is not None
        self.standby = Standby.spawn(command.argv, {**h.env, **command.env}, command.standby)
        self.spare_standby(h.processes)
        if self.standby is not None:
            h.trace(f"standby {command.name} for the next attempt (pid {self.standby.pid})")

    def spare_standby(self, processes: ProcessTable) -> None:
        """An attempt's processes: the idle standby is not one of them (it waits for the next attempt)."""
        if self.standby is not None:
            processes.spared.add(self.standby.pid)

    def _on_timeout(self) -> None:
        h = self.host
        missing = h.link.missing_nodes() if h.link is not None else []
        timeout = h.plan.start_timeout
        if missing and h.phase.active:
            if h.plan.cluster.is_chief:
                h.fail_to_start(f"node(s) {', '.join(map(str, missing))} never joined the job within "
                                f"{timeout:g} s (--start-timeout): is detlaunch running "
                                "there, with the same host list and --link-port?")
            else:
                host = h.plan.cluster.chief_addr
                h.fail_to_start(f"never reached the chief at {host}:{h.plan.link_port} within "
                                f"{timeout:g} s (--start-timeout): is detlaunch running there?")
        elif h.phase is Phase.STARTING and h.preflight.due() and all(p.ready for p in self.probes):
            if not isinstance(h.link, WorkerLink):  # a worker waits for the chief's verdict
                h.fail_to_start(f"the preflight did not finish within {timeout:g} s (--start-timeout)")
        elif h.phase is Phase.STARTING:
            waiting = ", ".join(f"{p.host}:{p.port}" for p in self.probes if not p.ready)
            h.fail_to_start(f"sshd on {waiting} did not answer within {timeout:g} s "
                            "(is detlaunch running on that node, with the same --ssh-port?)")
        elif isinstance(h.link, WorkerLink):
            return  # joined: the chief, waiting for the whole job, decides when to give up
        elif h.phase is Phase.RUNNING and (started := self._started_ranks()) < h.plan.expected_ranks:
            registered = len(h.ranks.ranks)
            why = (f"{registered - started} wait for the rank template's imports" if registered > started
                   else "are the other nodes up?")
            h.fail(StartFailed(f"only {started} of {h.plan.expected_ranks} rank(s) started "
                               f"on node {h.node} within {timeout:g} s (--start-timeout): {why}",
                               h.node, time.time()))

    def _started_ranks(self) -> int:
        """This node's ranks whose process started (or ended): a warm rank's wrapper registers first and then
        waits for the template to fork it."""
        return sum(1 for e in self.host.ranks.ranks.values() if e.rank_pid or e.status is not None)

    def close_probes(self) -> None:
        for probe in self.probes:
            probe.close()

    def new_attempt(self) -> None:
        """The last attempt's probes and timeout must not act in the next one."""
        self.close_probes()
        self.probes = []
        cancel_timer(self.timer)
        self.timer = None
        self.awaiting_join = False

    def close(self) -> None:
        self.new_attempt()
        if self.standby is not None:  # no attempt followed
            self.standby.stop()
            self.standby = None
