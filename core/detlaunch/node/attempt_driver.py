"""Between two attempts of a job-wide restart, on one node: the backoff, the next start, lost nodes.

attempts.Attempts keeps the count and the history and asks the restart policy; this part runs the
timers and the order of things between an attempt's end and the next one's start, on the node's
event loop. What an attempt is made of (its processes, ranks, verdict) stays the supervisor's: the
driver reaches it only through `AttemptHost`, so it reads in one sitting and the supervisor does not
carry the restart's branches.

    chief:  attempt over ─ restart_if_decided ─► backoff ─(delay over)─► next_attempt ─► start_attempt
                                                    │ a node lost meanwhile: forgotten   ▲
                                                    └─► await_rejoin ──(every node back)─┘ (--start-timeout)
                                                          a waiting spare is sent to each lost node's place
                                                          (link/spares.py): it joins again as that node; with
                                                          none, --nnodes MIN:MAX drops the place (_shrink)
    worker: the chief's "restart" ─► backoff ─(its delay, or the chief's "go")─► next_attempt

On every node the backoff also starts release_wait.ReleaseWait: the last attempt's processes (every
thread of them) gone and their GPU memory freed, within --release-timeout; next_attempt waits for it.

A worker's link hands the chief's "restart" and "go" to the driver itself (worker.AttemptOrders:
chief_restart, chief_go).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Protocol

from detlaunch.link import places
from detlaunch.link.chief import ChiefLink
from detlaunch.link.worker import WorkerLink
from detlaunch.node.phase import Phase
from detlaunch.node.process_table import ProcessTable
from detlaunch.node.release_wait import ReleaseWait
from detlaunch.node.verdict import NodeLost, VerdictEvent
from detlaunch.observe.emitter import EventEmitter
from detlaunch.observe.events import EventKind
from detlaunch.outcome import AttemptEnd
from detlaunch.planning import membership, spares
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.plan import LaunchPlan
from detlaunch.restarts.attempts import Attempts
from detlaunch.system.eventloop import EventLoop, Timer, cancel_timer


class AttemptHost(Protocol):
    """What the driver needs of the node's supervisor."""

    loop: EventLoop
    plan: LaunchPlan
    base: ClusterInfo  # the job's places at the start (planning/membership.py)
    attempts: Attempts
    events: EventEmitter
    env: dict[str, str]  # the job's environment
    processes: ProcessTable  # the last attempt's, until the next one starts

    @property
    def phase(self) -> Phase: ...

    @property
    def link(self) -> ChiefLink | WorkerLink | None: ...

    def say(self, message: str) -> None: ...
    def trace(self, message: str) -> None: ...

    def last_attempt_end(self) -> AttemptEnd:
        """How the attempt that just ended ended, as the restart policy reads it (or would, were it over now)."""

    def stopped_why(self) -> str:
        """Why the job ended while no attempt ran (a signal, a failure during the backoff)."""

    def enter_backoff(self) -> None:
        """The last attempt's processes are gone: drop its timers and verdict, enter BACKOFF."""

    def start_attempt(self, attempt: int) -> None:
        """Fresh parts for `attempt`, STARTING, and its stage."""

    def fail(self, event: VerdictEvent) -> None: ...


class AttemptDriver:
    def __init__(self, host: AttemptHost) -> None:
        self.host = host
        self.backoff_timer: Timer | None = None
        self.rejoin_timer: Timer | None = None  # chief: the bound on lost nodes coming back (--start-timeout)
        self.awaited: set[int] = set()  # a successor: places whose nodes are on their way back (await_back)
        self.awaited_timer: Timer | None = None
        # The last attempt's processes and GPU memory, before the next starts (only with restarts on).
        self.release = ReleaseWait(host.loop, timeout=host.plan.release_timeout if host.attempts.policy.enabled
                                   else 0.0, env=host.env, say=host.say, trace=host.trace,
                                   reap=lambda: self.host.processes.reap())

    # -- the chief decides ---------------------------------------------------------------------
    def restart_if_decided(self) -> bool:
        """Chief, every node's part of the attempt over: record how it ended and start another if the
        policy says so (workers follow the chief's "restart"). False: the job ends now."""
        h = self.host
        if not h.attempts.policy.enabled or not h.plan.cluster.is_chief:
            return False
        if not h.attempts.running:  # stopped during the backoff: that attempt never started
            h.attempts.stopped_waiting(h.stopped_why())
            return False
        decision = h.attempts.ended(h.last_attempt_end())
        if not decision.restart:
            return False
        h.say(h.attempts.restarting())
        if isinstance(h.link, ChiefLink):
            self._grow(decision.next_attempt)
            h.link.restart(decision.next_attempt, decision.delay)  # lost nodes are forgotten: they may rejoin
            self.fill_from_spares()  # now: the spares' joins overlap the backoff and the last attempt's release
        self.begin_backoff(decision.next_attempt, decision.delay)
        return True

    def begin_backoff(self, attempt: int, delay: float | None) -> None:
        """Every process of the last attempt is gone: wait `delay`, then start `attempt` afresh
        (None: a worker waiting for the chief's go, which comes once every lost node is back)."""
        self.host.enter_backoff()
        self.stop_waiting()
        self.release.begin(attempt, self.host.processes.remaining())
        if delay is not None:
            self.backoff_timer = self.host.loop.call_later(delay, lambda: self.next_attempt(attempt))

    def next_attempt(self, attempt: int) -> None:
        h = self.host
        if h.phase is not Phase.BACKOFF:
            return
        if not self.release.done:  # the last attempt's processes or GPU memory: not free yet
            self.release.then_run(lambda: self.next_attempt(attempt))
            return
        if isinstance(h.link, ChiefLink) and h.link.missing_nodes():
            self._await_rejoin(attempt)
            return
        h.start_attempt(attempt)

    def stop_waiting(self) -> None:
        """A signal or a failure during the backoff: the next attempt never starts."""
        cancel_timer(self.backoff_timer)
        self.backoff_timer = None
        self.release.cancel()

    # -- a worker follows ------------------------------------------------------------------------
    def chief_restart(self, attempt: int, delay: float | None) -> None:
        """Worker: the chief starts attempt `attempt` on every node after `delay` seconds
        (None: once the lost nodes are back, when the chief says go)."""
        h = self.host
        if h.phase is Phase.CLOSING:
            when = "once every lost node is back" if delay is None else f"in {delay:.1f} s"
            h.say(f"the chief restarts the job: attempt {attempt} {when}")
            self.begin_backoff(attempt, delay)
        elif h.phase is Phase.BACKOFF and delay is None and self.backoff_timer is not None:
            cancel_timer(self.backoff_timer)  # a node was lost during the backoff: wait for the chief's go
            self.backoff_timer = None
            h.say(f"the chief holds attempt {attempt} until every lost node is back")
        elif h.phase is Phase.BACKOFF and delay is not None and self.backoff_timer is None:
            # Joined, held, while the last attempt stopped (a spare in a lost node's place): it starts with the others.
            self.backoff_timer = h.loop.call_later(delay, lambda: self.next_attempt(attempt))

    def chief_go(self, attempt: int) -> None:
        """Worker: every node is back after a lost one: attempt `attempt` starts now."""
        self.next_attempt(attempt)

    def joined(self, attempt: int, hold: bool) -> bool:
        """Worker, joined with restarts on: False if this is the first attempt and it starts now;
        else wait for it (a node that was lost and started again joins a later one, maybe held)."""
        if attempt == 1 and not hold:
            return False
        self.host.say(f"joined the job at attempt {attempt}" + (": waiting for the other nodes" if hold else ""))
        self.begin_backoff(attempt, None if hold else 0.0)
        return True

    # -- lost nodes coming back (chief) ------------------------------------------------------------
    def _await_rejoin(self, attempt: int) -> None:
        """Attempt `attempt` is due, but lost nodes are not back: wait at most --start-timeout."""
        h = self.host
        assert isinstance(h.link, ChiefLink)
        h.attempts.due = attempt
        self.fill_from_spares()
        if self._shrink(attempt):
            return
        if self.rejoin_timer is None:
            spare_of = h.link.spares.coming
            lost = ", ".join(f"{n} ({h.link.addr_of(n)})" for n in h.link.missing_nodes() if n not in spare_of)
            who = [f"node(s) {lost} to join again"] if lost else []
            who += [f"spare node {spare_of[n]} ({h.link.spares.addrs.get(spare_of[n])}) to join as node {n}"
                    for n in h.link.missing_nodes() if n in spare_of]
            h.say(f"waiting for {'; '.join(who)} (at most {h.plan.start_timeout:g} s, --start-timeout)")
            self.rejoin_timer = h.loop.call_later(h.plan.start_timeout, self._rejoin_timeout)

    def fill_from_spares(self, only_excluded: bool = False) -> None:
        """Chief: send a waiting spare to each missing node's place (`only_excluded`: of those on a host kept
        out, which never join: the first attempt's start), none on such a host (the file is read now: it may
        have changed since the last attempt)."""
        h = self.host
        assert isinstance(h.link, ChiefLink)
        missing = [n for n in h.link.missing_nodes() if n not in h.link.spares.coming and n not in self.awaited]
        if not missing or not h.link.spares.waiting:
            return
        excluded = self._excluded()
        if only_excluded:
            missing = [n for n in missing if h.link.addr_of(n) in excluded]
        for node in missing:
            if not self._promote(node, excluded):
                return

    def replace_now(self, node: int) -> bool:
        """Chief: node `node` was lost as its attempt ran, and a restart for a lost node is what the policy would
        decide: a waiting spare is sent to its place now, while the attempt stops, not once it has. Its join
        overlaps the stop (link/places.joins_next: held until the restart, which then needs no go), and every
        node is to be told the new membership at once (with the stop: True, a spare was sent)."""
        h = self.host
        link = h.link
        if not isinstance(link, ChiefLink) or not link.spares.waiting or node in link.spares.coming \
                or not h.attempts.would_restart(h.last_attempt_end()):
            return False
        return self._promote(node, self._excluded())

    def _promote(self, node: int, excluded: set[str]) -> bool:
        """A waiting spare (on no host in `excluded`) to node `node`'s place, said and logged. False: none waits."""
        h = self.host
        assert isinstance(h.link, ChiefLink)
        lost_addr = h.link.addr_of(node)
        promoted = h.link.promote_spare(node, excluded)
        if promoted is None:
            return False
        spare, addr = promoted
        h.say(f"spare node {spare} ({addr}) takes the place of node {node} ({lost_addr})")
        h.events.emit(EventKind.SPARE_PROMOTED, node=node, spare=spare, host=addr, replaces=lost_addr)
        return True

    # -- a job that may shrink (--nnodes MIN:MAX, planning/membership.py) ----------------------------------
    def _shrink(self, attempt: int) -> bool:
        """Chief: places no spare fills are dropped, if the nodes left are at least --nnodes MIN: True when the
        attempt starts now (no node is waited for)."""
        h = self.host
        link = h.link
        assert isinstance(link, ChiefLink)
        drop = membership.shrink(link.missing_nodes(), link.spares.coming.keys() | self.awaited, link.live_nodes(),
                                 h.plan.settings.get("min_nodes"))
        if not drop:
            return False
        gone = ", ".join(f"{n} ({link.addr_of(n)})" for n in sorted(drop))
        places.drop(link, drop)
        ids = places.members(link)
        size = membership.describe(ids, h.base.slots, h.base.num_nodes)
        h.say(f"no spare for the place of node(s) {gone}: attempt {attempt} runs on {size} (--nnodes "
              f"{h.plan.settings.get('min_nodes')}:{h.base.num_nodes}; node and global ranks renumbered)")
        h.events.emit(EventKind.JOB_RESIZED, nodes=len(ids), ranks=sum(h.base.slots[p] for p in ids),
                      places=list(ids))
        if link.missing_nodes():
            return False
        cancel_timer(self.rejoin_timer)
        self.rejoin_timer = None
        self.next_attempt(attempt)
        return True

    def _grow(self, attempt: int) -> None:
        """Chief, restarting anyway: a shrunk job takes back a dropped place for each spare that waits (on a host
        not kept out); the restart then waits for the spares sent there."""
        h = self.host
        link = h.link
        assert isinstance(link, ChiefLink)
        dropped = places.dropped(link)
        if not dropped or not link.spares.waiting:
            return
        excluded = self._excluded()
        ready = sum(1 for n in link.spares.waiting if link.spares.addrs.get(n) not in excluded)
        lost = [n for n in link.lost_nodes() if n not in link.spares.coming]  # (a spare on its way: not waiting)
        back = membership.grow(dropped, ready - len(lost))  # the lost nodes' places come first
        if back:
            places.take_back(link, back)
            ids = places.members(link)
            h.say(f"attempt {attempt} takes back the place of node(s) {', '.join(map(str, back))}: it runs on "
                  f"{membership.describe(ids, h.base.slots, h.base.num_nodes)}, a spare in each")
            h.events.emit(EventKind.JOB_RESIZED, nodes=len(ids), ranks=sum(h.base.slots[p] for p in ids),
                          places=list(ids))

    def await_back(self, nodes: set[int], window: float) -> None:
        """A successor chief: these places' nodes were live under the lost chief and are on their way back to
        this one; no spare is sent there (nor the place dropped) for `window` seconds, a silent node's window:
        a spare sent at once would displace a node that comes back a moment later. Past it, a place whose
        node has not joined is a lost node's."""
        self.awaited = set(nodes)
        cancel_timer(self.awaited_timer)
        self.awaited_timer = self.host.loop.call_later(window, self._await_over)

    def _await_over(self) -> None:
        self.awaited_timer = None
        self.awaited = set()
        self.refill()

    def refill(self) -> None:
        """Chief, waiting for lost nodes: a spare joined or was lost meanwhile; fill the places again."""
        h = self.host
        if h.phase is Phase.BACKOFF and h.attempts.due is not None and isinstance(h.link, ChiefLink) \
                and h.link.missing_nodes():
            self.fill_from_spares()
            self._shrink(h.attempts.due)

    def _excluded(self) -> set[str]:
        return self._exclusions()[0]

    def _exclusions(self) -> tuple[set[str], Counter[str]]:
        h = self.host
        try:
            return spares.read_exclusions(h.plan.exclude_hosts)
        except Exception as e:  # noqa: BLE001 - a file that cannot be read now must not end the job
            h.say(f"warning: {e}; the job goes on")
            return set(), Counter()

    def exclude(self, node: int, addr: str, why: str, at_once: bool = False) -> None:
        """Chief: a node was lost (or sent away, `at_once`): its host is written into --exclude-hosts; it is
        out once lost twice (planning/spares.py), or at once. The file is read once."""
        h = self.host
        path = h.plan.exclude_hosts
        if not path or not isinstance(h.link, ChiefLink):
            return
        before = self._exclusions()
        if addr in before[0]:
            return
        how = spares.EXCLUDED if at_once else spares.LOST
        warning = spares.append_excluded(path, addr, why, how=how)
        if warning:
            h.say(f"warning: {warning}; the job goes on")
        elif spares.out_after_loss(before, addr, how):
            h.events.emit(EventKind.NODE_EXCLUDED, node=node, host=addr, reason=why)

    def lost_between_attempts(self, node: int, addr: str, why: str) -> None:
        """In the backoff: a node was lost while nothing ran. No attempt failed, so nothing is counted;
        as after a node lost mid-run, it is forgotten and the next attempt waits for it."""
        h = self.host
        assert isinstance(h.link, ChiefLink)
        h.link.forget_lost()
        h.say(f"lost node {node} ({addr}) while waiting to restart ({why}): attempt "
              f"{h.attempts.due or h.attempts.number + 1} waits for it to join again")
        if h.attempts.due is not None:  # the backoff is over already: the --start-timeout bound runs
            self._await_rejoin(h.attempts.due)

    def rejoined(self) -> None:
        """In the backoff: every lost node is back; the attempt starts if its backoff is over."""
        for timer in (self.rejoin_timer, self.awaited_timer):
            cancel_timer(timer)
        self.rejoin_timer = self.awaited_timer = None
        self.awaited = set()  # none is on its way any more: a node lost later is replaced at once
        due = self.host.attempts.due
        self.host.say(f"every node is back: attempt {due or self.host.attempts.number + 1} starts"
                      + ("" if due is not None else " when the backoff is over"))
        if due is not None:
            self.next_attempt(due)

    def _rejoin_timeout(self) -> None:
        """A lost node did not come back within --start-timeout: the job ends (lost node's exit code)."""
        self.rejoin_timer = None
        h = self.host
        if h.phase is not Phase.BACKOFF or not isinstance(h.link, ChiefLink):
            return
        for node in h.link.missing_nodes():
            h.fail(NodeLost(node, h.link.addr_of(node), f"it did not join again within "
                            f"{h.plan.start_timeout:g} s (--start-timeout)", time.time()))
