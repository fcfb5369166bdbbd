"""The chief is no single point of failure: the surviving nodes choose a successor and the job goes on.

    chief:     shares the Membership (link/membership.py) with every node and spare as it changes
               (at most once a heartbeat)
    the chief is lost (its link closed, or silent for HEARTBEAT_MISSES heartbeats), on every survivor:
        chief_lost: the restart policy, read from the shared history with the loss counted as a lost node,
                    allows another attempt -> this node's supervisor ends its attempt (its ranks stopped)
                    and hands `next` (a Takeover) to the next supervisor of the same detlaunch (cli/main.py)
        successor (the lowest live node rank but 0):  becomes node rank 0, listens on its own address at
                    the job's port with the job's secret (take_over); the restart state carried over
        the others: dial it as a lost node's new detlaunch would, and wait for its "go"; one that nobody
                    reaches within the grace (cut off with the chief) is passed over alike by all: the next
                    lowest live node rank takes over
    successor:  waits until more than half of the last attempt's nodes (itself included) have joined,
                within --start-timeout; then for the others of the last attempt, at most twice the
                silence that tells a node lost (those absent then are lost nodes: a partition's other
                side); then the next attempt is due and the places left (the lost chief's, the absent
                nodes') are filled as any lost node's (a spare; else that node must join again)
                without a majority: every node on its side ends with one line and exit code 1

The chief's role and global rank 0 stay on one node: the successor takes node rank 0 and its ranks,
so MASTER_ADDR and DET_CHIEF_IP name it (every layer's rendezvous is on the chief). Reaches the
supervisor only through `SuccessionHost`.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import detlaunch.exit_codes as exit_codes
from detlaunch.link.chief import ChiefLink
from detlaunch.link.membership import Membership, cluster_after, has_majority
from detlaunch.link.wire import HEARTBEAT_MISSES
from detlaunch.link.worker import WorkerLink
from detlaunch.node.attempt_driver import AttemptDriver
from detlaunch.node.phase import Phase
from detlaunch.node.verdict import ChiefLost, StartFailed, VerdictEvent
from detlaunch.observe.emitter import EventEmitter
from detlaunch.observe.events import EventKind
from detlaunch.outcome import AttemptEnd, Failure, FailureKind
from detlaunch.planning import spares
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.plan import LaunchPlan
from detlaunch.restarts.attempts import Attempts, attempt_end_from_verdict
from detlaunch.restarts.policy import RestartPolicy
from detlaunch.system.eventloop import EventLoop, Timer, cancel_timer


@dataclasses.dataclass(frozen=True)
class Takeover:
    """What one supervisor of a node hands the next once the chief was lost."""

    cluster: ClusterInfo  # this node's, after the succession (the successor's node rank is 0)
    membership: Membership  # the lost chief's last, as it numbered the nodes
    successor: int  # the successor's node rank before it took the chief's
    old_chief: str  # the lost chief's address
    why: str  # why it was lost
    secret: str  # the job's secret (the successor serves the link with it)
    at: float  # when it was lost (wall clock)
    before: ClusterInfo | None = None  # this node's, as the lost chief numbered the nodes
    gone: frozenset[int] = frozenset({0})  # the lost chief, and successors that could not be reached

    def unreachable(self) -> Takeover | None:
        """The successor could not be reached (cut off with the chief, or gone too): the next one, as every
        survivor that cannot reach it computes alike; None when none is left."""
        gone = self.gone | {self.successor}
        successor = self.membership.successor(gone)
        if successor is None or self.before is None:
            return None
        return dataclasses.replace(self, cluster=cluster_after(self.before, self.membership, successor),
                                   successor=successor, gone=gone)

    @property
    def next_attempt(self) -> int:
        return self.membership.attempt + 1


def chief_loss_end(m: Membership, old_chief: str, why: str, at: float, policy: RestartPolicy) -> AttemptEnd:
    """The running attempt's end, as a lost node's: what every survivor adds to the history alike."""
    what = f"lost the chief, node 0 ({old_chief}): {why}"
    return attempt_end_from_verdict(m.attempt, Failure(what, exit_codes.FAILED, at=at, kind=FailureKind.NODE_LOST),
                                    None, exit_codes.FAILED, started=True, policy=policy, started_at=at, ended_at=at)


def may_go_on(m: Membership, old_chief: str, why: str, at: float, policy: RestartPolicy) -> tuple[bool, str]:
    """Whether the restart policy allows the attempt after the chief's loss (every survivor reads the same
    history, so all decide alike), and why not."""
    if not policy.enabled:
        return False, "restarts are off (--max-restarts)"
    survivors = len([n for n in m.live if n != 0])
    if not has_majority(survivors, len(m.nodes)):  # e.g. a job of two nodes: no side of it can go on alone
        return False, f"its {survivors} other node(s) are no majority of the job's {len(m.nodes)}"
    if not m.running:  # lost between attempts: the next one was decided already
        return True, ""
    decision = policy.decide([*m.history, chief_loss_end(m, old_chief, why, at, policy)], _NoJitter())
    return decision.restart, decision.why


def carry_exclusions(path: str | None, hosts: tuple[str, ...], say: Callable[[str], None],
                     lost: tuple[str, ...] = ()) -> None:
    """The lost chief's exclusion file, as it counted: the hosts it kept out stay out, and each loss it counted
    of the others counts here too. This node's --exclude-hosts file (one of its own, not shared) gets the
    lines it lacks: a host kept out, as excluded; a host lost once more there than here, as lost."""
    if not path or not (hosts or lost):
        return
    try:
        known, losses = spares.read_exclusions(path)
    except Exception as e:  # noqa: BLE001 - a file that cannot be read now must not end the job
        say(f"warning: {e}; the job goes on")
        return
    missing = [(host, spares.EXCLUDED) for host in sorted(set(hosts) - known)]
    counted = Counter(h for h in lost if h not in hosts and h not in known)
    missing += [(host, spares.LOST) for host in sorted(counted) for _ in range(counted[host] - losses[host])]
    for host, how in missing:
        warning = spares.append_excluded(path, host, f"{how} as the lost chief counted it", how=how)
        if warning:
            say(f"warning: {warning}; the job goes on")


class _NoJitter:
    def random(self) -> float:
        return 0.5


class SuccessionHost(Protocol):
    loop: EventLoop
    plan: LaunchPlan
    node: int
    attempts: Attempts
    events: EventEmitter
    driver: AttemptDriver

    @property
    def phase(self) -> Phase: ...

    @property
    def link(self) -> ChiefLink | WorkerLink | None: ...

    def say(self, message: str) -> None: ...
    def trace(self, message: str) -> None: ...
    def fail(self, event: VerdictEvent) -> None: ...


class Succession:
    def __init__(self, host: SuccessionHost, carried: Takeover | None = None) -> None:
        self.host = host
        self.carried = carried  # this supervisor follows a lost chief's
        self.next: Takeover | None = None  # the chief was lost: what the next supervisor takes over
        self.share_timer: Timer | None = None
        self.shared_at = float("-inf")
        self.replaced_shared_at = float("-inf")  # share_now
        self.majority_timer: Timer | None = None  # successor: until a majority joins (--start-timeout)
        self.grace_timer: Timer | None = None  # successor: a majority joined; for the last attempt's others
        self.fallback_timer: Timer | None = None  # follower: for its successor's welcome
        self.backoff_timer: Timer | None = None
        self.backoff_over = False
        self.waiting = False  # successor: for a majority
        self.stepped_down = False  # a chief that lost a majority of its nodes (outvoted)

    # -- the chief shares the membership ------------------------------------------------------------
    def changed(self) -> None:
        """Chief: a node or spare joined or was lost, or the attempt moved: share it (at most once a heartbeat)."""
        h = self.host
        if not isinstance(h.link, ChiefLink):
            return
        if self.waiting or self.grace_timer is not None:
            self._check_majority()
        if self.share_timer is None:
            delay = max(0.0, self.shared_at + h.plan.heartbeat - h.loop.clock())
            self.share_timer = h.loop.call_later(delay, self._share)

    def share_now(self) -> None:
        """Chief: a spare was sent to a lost node's place: every node is told now, not up to a heartbeat later;
        but not twice within a heartbeat (a rack lost at once: the rest go together, in the next share)."""
        now = self.host.loop.clock()
        if now - self.replaced_shared_at < self.host.plan.heartbeat:
            self.changed()
            return
        self.replaced_shared_at = now
        cancel_timer(self.share_timer)
        self.share_timer = None
        self._share()

    def _share(self) -> None:
        self.share_timer = None
        h, link = self.host, self.host.link
        if h.phase is Phase.STARTING and h.attempts.number == 1 and isinstance(link, ChiefLink) \
                and link.missing_nodes():
            return  # the first start: shared once every node is here (no successor could start the job before)
        if isinstance(link, ChiefLink) and link.listener.fileno() >= 0:
            self.shared_at = self.host.loop.clock()
            link.share(self.membership())

    def membership(self) -> Membership:
        h = self.host
        link = h.link
        assert isinstance(link, ChiefLink)
        c = h.plan.cluster
        coming = {place: link.spares.addrs.get(spare) for place, spare in link.spares.coming.items()}  # sent there
        nodes = tuple((c.chief_addr if n == 0 else coming.get(n) or link.addrs.get(n)) or ""
                      for n in range(c.num_nodes))
        try:
            out, losses = spares.read_exclusions(h.plan.exclude_hosts)
        except Exception:  # noqa: BLE001 - a file that cannot be read now: the successor reads it itself
            out, losses = set(), Counter()
        excluded = tuple(sorted(out))
        lost = tuple(sorted(host for host in losses.elements() if host not in out))
        return Membership(nodes=nodes, live=(0, *sorted(link.live_nodes())),
                          spares=tuple(sorted((n, link.spares.addrs.get(n, "")) for n in link.spares.waiting)),
                          used_spares=tuple(sorted(link.spares.promoted)), attempt=h.attempts.number,
                          running=h.attempts.running, history=tuple(h.attempts.history), excluded=excluded,
                          lost=lost)

    # -- a worker loses the chief --------------------------------------------------------------------
    def chief_lost(self, why: str) -> None:
        """Worker: decide, from the chief's last membership, whether the job goes on under a successor."""
        h = self.host
        link = h.link
        if not isinstance(link, WorkerLink) or self.next is not None:
            return
        m, c, at = link.membership, h.plan.cluster, time.time()
        old = c.chief_addr
        successor = m.successor() if m is not None else None
        if m is None or successor is None or link.secret is None:
            h.trace("the chief was lost before it shared the job's membership: no successor")
            return
        go_on, why_not = may_go_on(m, old, why, at, h.plan.restarts)
        if not go_on:
            h.say(f"lost the chief, node 0 ({old}): no successor takes over: {why_not}")
            return
        self.next = Takeover(cluster_after(c, m, successor), m, successor, old, why, link.secret, at, before=c)
        who = "this node" if successor == h.node else f"node {successor} ({m.nodes[successor]})"
        h.say(f"lost the chief, node 0 ({old}): {why}: {who} takes over as the chief (node rank 0); attempt "
              f"{self.next.next_attempt} follows")

    @property
    def handing_over(self) -> bool:
        """The job goes on without this supervisor: under this detlaunch's next one, or (a chief that stepped
        down) under a successor elsewhere, which writes the job's log from here on."""
        return self.next is not None or self.stepped_down

    # -- a chief that lost more than half of its nodes at once -------------------------------------------
    def outvoted(self, node: int, addr: str, why: str) -> bool:
        """Chief: node `node` was lost. When more than half of the job's nodes are lost, they may hold a majority
        and follow a successor (a chief silent too long: stopped, cut off): this chief must not go on as a second
        one. It stops the job here, restarts nothing, writes no host into --exclude-hosts, and leaves."""
        h, link = self.host, self.host.link
        if self.stepped_down:
            return True
        n = h.plan.cluster.num_nodes
        if not isinstance(link, ChiefLink) or not h.plan.restarts.enabled or n < 3:
            return False
        # Those nearly as silent are lost too: nodes cut off together (a partition) went quiet within a heartbeat
        # of each other, and the link finds them lost one by one; a chief that was stopped finds them all at once.
        silence = (HEARTBEAT_MISSES - 2) * link.heartbeat
        lost = sorted(n for n, c in link.nodes.items() if c.closed or c.silent_for() > silence)
        if not has_majority(len(lost), n):
            return False
        self.stepped_down = True
        link.keep_secret = True  # the job goes on: nodes that join the successor afresh read it
        names = ", ".join(f"{n} ({link.addr_of(n)})" for n in lost)
        h.say(f"lost node(s) {names}, more than half of the job's {n} nodes: they may follow a successor "
              f"(the lowest of them), so this chief leaves the job")
        h.fail(StartFailed(f"this chief was replaced: it lost node(s) {names} ({why})", h.node, time.time()))
        return True

    # -- the successor ---------------------------------------------------------------------------------
    def begin(self) -> bool:
        """At the start of a supervisor that follows a lost chief: the event, and the successor's take-over.
        False: this node is no successor (it joins the new chief as any node rejoins)."""
        t, h = self.carried, self.host
        if t is None:
            return False
        h.events.emit(EventKind.CHIEF_CHANGED, node=0, host=t.cluster.chief_addr, successor=t.successor,
                      replaces=t.old_chief, reason=t.why, attempt=t.next_attempt - 1)
        if not isinstance(h.link, ChiefLink):  # a follower: its successor may be cut off with the lost chief
            self.fallback_timer = h.loop.call_later(self.grace, self._successor_unreachable)
            return False
        self._take_over(t, h.link)
        return True

    def _successor_unreachable(self) -> None:
        """Follower: the successor's host has not answered within the grace (no connection, no refusal). Every
        survivor that cannot reach it takes the next lowest live node rank as its successor; the majority rule
        still decides which side goes on."""
        self.fallback_timer = None
        h, t = self.host, self.carried
        assert t is not None
        if not isinstance(h.link, WorkerLink) or h.link.joined or h.link.dialer.reached or not h.phase.active:
            return  # welcomed, or its host answered (a refusal: there, not serving yet; --start-timeout bounds it)
        m, gone = t.membership, t.gone | {t.successor}
        what = f"could not reach node {t.successor} ({m.nodes[t.successor]}), the successor, within {self.grace:g} s"
        survivors = [n for n in m.live if n not in gone]
        nxt, mine = t.unreachable(), t.before.node_rank if t.before is not None else h.node
        if nxt is None or not has_majority(len(survivors), len(m.nodes)):
            h.fail(StartFailed(f"lost the chief, node 0 ({t.old_chief}), and {what}: the {len(survivors)} node(s) "
                               f"left are no majority of the job's {len(m.nodes)}", h.node, time.time()))
            return
        self.next = nxt
        who = "this node" if nxt.successor == mine else f"node {nxt.successor} ({m.nodes[nxt.successor]})"
        h.say(f"{what}: {who} takes over as the chief (node rank 0)")
        h.fail(ChiefLost(m.nodes[t.successor], f"not reached within {self.grace:g} s", h.node, time.time()))

    def _take_over(self, t: Takeover, link: ChiefLink) -> None:
        h, m = self.host, t.membership
        h.attempts.history[:] = m.history
        h.attempts.number = m.attempt
        delay, counted = 0.0, ""
        if m.running:  # the attempt that ran ended with the chief: a lost node's end, counted as one
            decision = h.attempts.ended(chief_loss_end(m, t.old_chief, t.why, t.at, h.plan.restarts))
            delay, counted = decision.delay, f"attempt {t.next_attempt} is {decision.why}; "
        link.attempt, link.holding = t.next_attempt, True  # every node joins held, and waits for "go"
        link.spares.promoted.update({n: -1 for n in m.used_spares})  # never admitted as spares again
        h.events.emit(EventKind.NODE_LOST, node=t.successor, host=t.old_chief, reason=f"the chief: {t.why}")
        carry_exclusions(h.plan.exclude_hosts, m.excluded, h.say, m.lost)
        h.driver.exclude(t.successor, t.old_chief, f"the chief: {t.why}")
        n = h.plan.cluster.num_nodes
        h.say(f"this node is the chief now (node rank 0, was node {t.successor}): {counted}waiting for more than "
              f"half of the last attempt's {n} nodes to join within {h.plan.start_timeout:g} s")
        h.driver.begin_backoff(t.next_attempt, None)
        # The nodes live under the lost chief come back: their places wait for them, not for a spare, a while.
        h.driver.await_back({n for n in m.live if n not in (0, t.successor)}, HEARTBEAT_MISSES * h.plan.heartbeat)
        self.waiting = True
        self.majority_timer = h.loop.call_later(h.plan.start_timeout, self._no_majority)
        self.backoff_timer = h.loop.call_later(delay, self._backoff_done)
        self._check_majority()

    def _joined(self) -> int:
        """The successor and the last attempt's nodes joined to it (the lost chief's place is a spare's)."""
        link, t = self.host.link, self.carried
        assert isinstance(link, ChiefLink) and t is not None
        return 1 + len(link.live_nodes() - {t.successor})

    def _absent(self) -> set[int]:
        """The last attempt's live nodes (as the successor numbers them) not joined to it yet."""
        link, t = self.host.link, self.carried
        assert isinstance(link, ChiefLink) and t is not None
        return set(t.membership.succeeded_by(t.successor).live) - {0} - link.live_nodes()

    def _check_majority(self) -> None:
        """A majority joined: the job goes on once the others of the last attempt are here too, or were given
        the time that tells a node lost twice over (`grace`: the survivors find the chief lost a heartbeat or so
        apart, and each first stops its ranks); those still absent then are lost nodes (a partition's other
        side), their places a spare's."""
        h, link = self.host, self.host.link
        n = h.plan.cluster.num_nodes
        if self.waiting:
            if isinstance(link, ChiefLink) and not has_majority(1 + len(link.nodes), n):
                return  # not even with every node that joined (counted first: O(1) a join, not O(n))
            joined = self._joined()
            if not has_majority(joined, n):
                return
            self.waiting = False
            cancel_timer(self.majority_timer)
            self.majority_timer = None
            h.say(f"{joined} of the last attempt's {n} nodes are here (a majority): the job goes on")
            if self._absent():
                self.grace_timer = h.loop.call_later(self.grace, self._grace_over)
                return
        elif self.grace_timer is None or self._absent():
            return
        cancel_timer(self.grace_timer)
        self.grace_timer = None
        if self.backoff_over:
            self._next_attempt()

    @property
    def grace(self) -> float:
        """Twice the silence that tells a node lost."""
        return 2 * HEARTBEAT_MISSES * float(self.host.plan.heartbeat)

    def _grace_over(self) -> None:
        self.grace_timer = None
        h, link = self.host, self.host.link
        if h.phase is not Phase.BACKOFF or not isinstance(link, ChiefLink):
            return
        why = f"it did not join the new chief within {self.grace:g} s"
        for node in sorted(self._absent()):
            addr = link.addr_of(node)
            h.say(f"lost node {node} ({addr}): {why}")
            h.events.emit(EventKind.NODE_LOST, node=node, host=addr, reason=why)
            h.driver.exclude(node, addr, why)
        if self.backoff_over:
            self._next_attempt()

    def _backoff_done(self) -> None:
        self.backoff_timer = None
        self.backoff_over = True
        if not self.waiting and self.grace_timer is None:
            self._next_attempt()

    def _next_attempt(self) -> None:
        h, t = self.host, self.carried
        assert t is not None
        if h.phase is Phase.BACKOFF:
            h.driver.next_attempt(t.next_attempt)  # the lost chief's place: a spare, or its node joins again

    def _no_majority(self) -> None:
        """Too few nodes reached this side: another side may hold the majority; this one ends."""
        self.majority_timer = None
        h, link = self.host, self.host.link
        if not self.waiting or h.phase is not Phase.BACKOFF or not isinstance(link, ChiefLink):
            return
        self.waiting = False
        c, t = h.plan.cluster, self.carried
        assert t is not None
        absent = [n for n in range(1, c.num_nodes) if n not in link.live_nodes() and n != t.successor]
        names = ", ".join(f"{n} ({link.addr_of(n)})" for n in absent)
        h.fail(StartFailed(f"lost the chief and reached only {self._joined()} of the last attempt's {c.num_nodes} "
                           f"nodes within {h.plan.start_timeout:g} s, no majority: could not reach node(s) {names}",
                           h.node, time.time()))

    def close(self) -> None:
        for timer in (self.share_timer, self.majority_timer, self.grace_timer, self.backoff_timer,
                      self.fallback_timer):
            cancel_timer(timer)
