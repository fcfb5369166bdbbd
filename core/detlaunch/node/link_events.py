"""What the job link tells this node, and what it means here: the news from the other nodes' supervisors.

The chief's link reports nodes joining, their ranks' ends, their own failures and their loss
(link.chief.ChiefEvents); a worker's link reports its welcome, the chief's verdict, a lost chief and a
link that never came up (link.worker.WorkerEvents). Each becomes what the rest of the node acts on:
a verdict event, an observer's event, the start of the stage, the attempt driver's move. (Questions
and the chief's restarts do not come this way: the link hands them to their owners itself.)

This part reaches the supervisor only through `LinkEventsHost`. It also builds this node's side of
the link from the plan (`connect`): the link takes only its settings (link.settings.LinkSettings).
"""

from __future__ import annotations

import dataclasses
import signal
import time
from typing import Any, Protocol

from detlaunch.link import places
from detlaunch.link.chief import ChiefLink
from detlaunch.link.control import ControlRequests
from detlaunch.link.fdlimit import chief_needs, ensure_open_files
from detlaunch.link.settings import LinkSettings
from detlaunch.link.worker import WorkerLink
from detlaunch.node.attempt_driver import AttemptDriver
from detlaunch.node.hangs import HangPolicy
from detlaunch.node.phase import Phase
from detlaunch.node.shutdown import Shutdown
from detlaunch.node.startup import Startup
from detlaunch.node.succession import Succession
from detlaunch.node.verdict import ChiefLost, ChiefVerdict, NodeLost, RankEnded, RemoteFailure, Verdict, VerdictEvent
from detlaunch.observe.emitter import EventEmitter
from detlaunch.observe.events import EventKind
from detlaunch.outcome import Failure, RankStatus
from detlaunch.planning.plan import LaunchPlan
from detlaunch.restarts.attempts import Attempts
from detlaunch.system.eventloop import EventLoop


class LinkEventsHost(Protocol):
    """What the link's news needs of the node's supervisor."""

    loop: EventLoop
    plan: LaunchPlan
    node: int
    verdict: Verdict
    events: EventEmitter
    hangs: HangPolicy
    control: ControlRequests
    driver: AttemptDriver
    startup: Startup
    shutdown: Shutdown
    succession: Succession
    attempts: Attempts

    @property
    def phase(self) -> Phase: ...

    @property
    def link(self) -> ChiefLink | WorkerLink | None: ...

    def say(self, message: str) -> None: ...
    def trace(self, message: str) -> None: ...
    def enter(self, phase: Phase) -> None: ...
    def fail(self, event: VerdictEvent) -> None: ...
    def fail_to_start(self, what: str) -> None: ...
    def follow_membership(self) -> bool: ...


def link_settings(plan: LaunchPlan) -> LinkSettings:
    """What the job link needs of the plan."""
    c = plan.cluster
    return LinkSettings(job_id=c.job_id, node=c.node_rank, num_nodes=c.num_nodes, chief_addr=c.chief_addr,
                        port=plan.link_port, heartbeat=plan.heartbeat, shared_dir=plan.shared_dir,
                        environ=plan.environ, node_addrs=tuple(a or "" for a in c.node_addrs), node_addr=c.node_addr,
                        bind_any=c.bind_any, spares=plan.spares)


class LinkEvents:
    def __init__(self, host: LinkEventsHost, promoted_from: int | None = None) -> None:
        self.host = host
        self.promoted_from = promoted_from  # a spare sent to this node's place: its number (link/places.py)
        self.spare_number: int | None = None  # the chief made this node a spare (made_spare)
        self.swapping: set[int] = set()  # chief: nodes the preflight sends away, a spare each (replace_before_start)

    def connect(self) -> ChiefLink | WorkerLink:
        """This node's side of the job link: the chief's listens (one open file per node), a worker's dials."""
        h = self.host
        settings = dataclasses.replace(link_settings(h.plan), promoted_from=self.promoted_from)
        if h.succession.carried is not None:  # a successor serves the link with the job's secret
            settings = dataclasses.replace(settings, secret=h.succession.carried.secret)
        if h.plan.cluster.is_chief:
            ensure_open_files(chief_needs(h.plan.cluster))
            return ChiefLink(h.loop, settings, self, h.control)
        return WorkerLink(h.loop, settings, self, h.control, h.driver)

    def trace(self, message: str) -> None:
        self.host.trace(message)

    def joined(self) -> None:
        """Chief: every node has joined the job; worker: this node joined the chief."""
        h = self.host
        h.startup.link_up = True
        if h.phase.over:  # this node's part has ended: a late welcome only carries its goodbye
            return
        if h.phase is Phase.BACKOFF and isinstance(h.link, ChiefLink):
            h.driver.rejoined()
        elif h.startup.awaiting_join and isinstance(h.link, WorkerLink):
            h.startup.joined(h.link)
        elif h.phase is Phase.STARTING and isinstance(h.link, ChiefLink) and h.link.spares.promoted \
                and h.follow_membership():  # a spare took a place before the launchers started: they list it
            h.startup.reprobe()
        else:
            h.startup.start_when_ready()

    # -- the chief's link (ChiefEvents) -------------------------------------------------------------
    def node_joined(self, node: int, addr: str) -> None:
        self.host.events.emit(EventKind.NODE_JOINED, node=node, host=addr)
        self.host.succession.changed()

    def remote_rank_exit(self, status: RankStatus) -> None:
        self.host.fail(RankEnded(status))

    def remote_failure(self, failure: Failure) -> None:
        """A worker node failed for another reason (its sshd died, it was interrupted...)."""
        self.host.fail(RemoteFailure(failure))

    def spare_joined(self, node: int, addr: str) -> None:
        h = self.host
        h.trace(f"spare node {node} ({addr}) joined")
        h.events.emit(EventKind.SPARE_JOINED, node=node, host=addr)
        h.succession.changed()
        if h.phase is Phase.STARTING:  # a node on an excluded host never comes: the spare takes its place now
            h.driver.fill_from_spares(only_excluded=True)
        else:  # lost nodes waited for (below --nnodes MIN, or a place whose spare was lost): this one may go
            h.driver.refill()

    def spare_facts(self) -> dict[str, Any]:
        """The chief's part of `detlaunch status`: its spares, waiting or sent to a place, and the job's size
        when it may shrink."""
        link = self.host.link
        if not isinstance(link, ChiefLink):
            return {}
        facts: dict[str, Any] = size_facts(self.host.plan.settings.get("min_nodes"), link)
        if not link.spares.ids:
            return facts
        pool = link.spares
        waiting = [f"node {n} ({pool.addrs.get(n)}) waiting" for n in sorted(pool.waiting)]
        taken = [f"node {n} ({pool.addrs.get(n)}) took node {place}'s place"
                 for n, place in sorted(pool.promoted.items())]
        absent = [f"node {n} not joined" for n in sorted(pool.missing)]
        return {**facts, "spares": waiting + taken + absent}

    def replace_straggler(self, node: int, why: str = "a straggler (--straggler-action replace)") -> bool:
        """--straggler-action replace (node/straggler_watch.py): the chief sends the straggler's node away and a
        waiting spare takes its place at the next attempt, as after a lost node. False: no spare waits."""
        h = self.host
        link = h.link
        if not isinstance(link, ChiefLink) or not replaceable(link, node):
            return False

        def dismiss() -> None:  # after the straggler's line
            h.driver.exclude(node, link.addr_of(node), why, at_once=True)  # out at once, not after two losses
            places.dismiss(link, node, why)

        h.loop.call_later(0, dismiss)
        return True

    def replace_before_start(self, node: int, why: str) -> bool:
        """The preflight named `node` (node/preflight.py), and no rank of the attempt has started: nothing failed,
        so no attempt is spent. The node is sent away, its host excluded at once, and a waiting spare is sent to
        its place now; once it has joined there, the chief plans again for it (`joined`) and the preflight runs
        again, the spare checked too. False: no spare waits."""
        h = self.host
        link = h.link
        if not isinstance(link, ChiefLink) or not replaceable(link, node, taken=len(self.swapping)):
            return False
        self.swapping.add(node)

        def swap() -> None:  # after the preflight's line
            self.swapping.discard(node)
            h.driver.exclude(node, link.addr_of(node), why, at_once=True)
            if places.dismiss(link, node, why, lost=False):
                h.startup.link_up = False  # nothing starts before the spare is there
                h.succession.changed()
                h.driver.fill_from_spares()

        h.loop.call_later(0, swap)
        return True

    def spare_lost(self, node: int, addr: str, why: str) -> None:
        self.host.say(f"lost spare node {node} ({addr}): {why}")
        self.host.events.emit(EventKind.NODE_LOST, node=node, host=addr, reason=why)
        self.host.succession.changed()
        self.host.driver.refill()  # it may have been sent to a place: another spare goes, or the job shrinks

    def node_lost(self, node: int, addr: str, why: str) -> None:
        """A worker node's supervisor vanished: between attempts the next one waits for it; else the job fails."""
        h = self.host
        h.events.emit(EventKind.NODE_LOST, node=node, host=addr, reason=why)
        h.succession.changed()
        if h.succession.outvoted(node, addr, why):  # the nodes may follow a successor: no second chief
            return
        h.driver.exclude(node, addr, why)
        if h.phase is Phase.BACKOFF and h.plan.restarts.enabled:
            h.driver.lost_between_attempts(node, addr, why)
        elif h.phase.active and isinstance(h.link, ChiefLink):
            with h.link.together():  # the stop and the membership naming its replacement: one write to each node
                h.fail(NodeLost(node, addr, why, time.time()))
                if h.driver.replace_now(node):
                    h.succession.share_now()

    # -- a worker's link (WorkerEvents) --------------------------------------------------------------
    def chief_verdict(self, failure: Failure | None) -> None:
        """The chief decided the job is over; its verdict is this node's too."""
        h = self.host
        was_active = h.phase.active
        h.hangs.stopped()
        h.verdict.add(ChiefVerdict(failure))
        if was_active and failure is not None:
            h.say(f"the chief stopped the job: {failure.what}")
        h.hangs.stop_after_own_dumps(lambda: h.shutdown.stop(signal.SIGTERM))  # the chief asked for them first

    def chief_lost(self, why: str) -> None:
        """The chief's supervisor vanished before the job ended."""
        h = self.host
        if h.phase is not Phase.DONE:  # a successor may take over (node/succession.py)
            h.succession.chief_lost(why)
        if h.phase.active or h.phase is Phase.BACKOFF:
            h.fail(ChiefLost(h.plan.cluster.chief_addr, why, h.node, time.time()))

    def link_failed_to_start(self, what: str) -> None:
        self.host.fail_to_start(what)

    def made_spare(self, number: int) -> None:
        """This node was lost, and its place is another's now: its part ends here, and its detlaunch joins again
        as spare `number` (cli/main.py)."""
        h = self.host
        h.say(f"node {h.node}'s place is taken (this node was lost): it joins the job again as spare node {number}")
        self.spare_number = number
        h.enter(Phase.DONE)

    def promoted(self, place: int) -> None:
        """Only a spare is promoted (node/spare.py): a node's supervisor never is."""
        self.host.trace(f"ignored a promotion to node {place}: this node is no spare")


def replaceable(link: ChiefLink, node: int, taken: int = 0) -> bool:
    """A spare may take `node`'s place: a live worker node (never the chief), and a spare waits that is not
    `taken` already (by other nodes about to be sent away)."""
    return node != 0 and len(link.spares.waiting) > taken and node in link.live_nodes()


def size_facts(min_nodes: int | None, link: ChiefLink) -> dict[str, Any]:
    """--nnodes MIN:MAX: the nodes the job runs on now, for `detlaunch status` ("size")."""
    if not min_nodes:
        return {}
    ids = places.members(link)
    dropped = sorted(places.dropped(link))
    return {"size": f"{len(ids)} of {len(link.places) + 1} (--nnodes {min_nodes}:{len(link.places) + 1})"
                    + (f"; the places of node(s) {', '.join(map(str, dropped))} are empty" if dropped else "")}
