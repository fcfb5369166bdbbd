"""A spare node's wait: joined to the chief, running nothing, until it takes a lost node's place.

The spare dials the chief as its own number (past the job's nodes) through the same authenticated
link as any node, keeps the heartbeat, and waits on one event loop (nothing polls). Three ends:

- the chief sends "promote" with a place: `wait` returns that node rank, and the spare's detlaunch
  plans that node's part and joins again as that node (cli/main.py), the way a lost node's new
  detlaunch does;
- the job ends (the chief's last word): the job's exit code, the spare never needed;
- the chief is lost: the spare dials its successor (the lowest live node rank of the chief's last
  membership, node/succession.py; the next one when that one does not welcome it within the grace, as
  the nodes do) and waits there, as a spare still, for at most --start-timeout;
  without a membership, or when no successor welcomes it in time: detlaunch's code for a lost job;
- the link never comes up, or a signal: detlaunch's code for each.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable

import detlaunch.exit_codes as exit_codes
from detlaunch.link.dial import RETRY_MAX
from detlaunch.link.membership import Membership, has_majority
from detlaunch.link.settings import LinkSettings
from detlaunch.link.wire import HEARTBEAT_MISSES
from detlaunch.link.worker import LinkState, NoQuestionsNoOrders, WorkerLink
from detlaunch.outcome import Failure
from detlaunch.system.eventloop import EventLoop, Timer, cancel_timer

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SpareWait(NoQuestionsNoOrders):  # the chief sends a spare no question and no order
    def __init__(self, settings: LinkSettings, say: Callable[[str], None], debug: bool = False,
                 start_timeout: float = 300.0) -> None:
        self.settings, self.say, self.debug = settings, say, debug
        self.start_timeout = start_timeout  # for a successor's welcome
        self.loop = EventLoop()
        self.place: int | None = None
        self.exit_code: int | None = None
        self.failure: Failure | None = None
        self.link: WorkerLink | None = None
        self.membership: Membership | None = None  # as the chief it waits on numbers the nodes
        self.deadline: Timer | None = None
        self.fallback: Timer | None = None  # the successor's welcome, within the grace
        self.reached = False  # the successor's host answered (a connection that failed the handshake)

    def wait(self) -> int | None:
        """The place this spare takes (a node rank), or None when it ends first (see `exit_code`)."""
        self.loop.catch_signals(STOP_SIGNALS, self._on_signal)
        self.link = WorkerLink(self.loop, self.settings, self, self, self)
        try:
            self.loop.run(done=lambda: self.place is not None or self.exit_code is not None
                          or self.link is None or self.link.state is LinkState.ENDED)
        finally:
            cancel_timer(self.deadline)
            cancel_timer(self.fallback)
            if self.link is not None:
                self.link.close()
            self.loop.close()
        if self.place is None and self.exit_code is None:  # the chief's end, without a failure
            self.say(f"spare node {self.settings.node}: the job ended without needing this node")
            self.exit_code = exit_codes.OK
        return self.place

    def _on_signal(self, signum: int) -> None:
        self.say(f"spare node {self.settings.node}: {signal.Signals(signum).name} received: leaving the job")
        self.exit_code = exit_codes.SIGNAL_BASE + signum

    # -- what the link says (WorkerEvents) --------------------------------------------------------------
    def trace(self, message: str) -> None:
        if self.debug:
            self.say(f"[spare {self.settings.node}] {message}")

    def joined(self) -> None:
        if self.deadline is not None:  # a successor welcomed this spare
            cancel_timer(self.deadline)
            cancel_timer(self.fallback)
            self.deadline = self.fallback = None
            self.say(f"spare node {self.settings.node}: joined the new chief at {self.settings.chief_addr}")
            return
        self.say(f"spare node {self.settings.node}: joined the job; it runs no rank until it takes a lost "
                 "node's place")

    def link_failed_to_start(self, what: str) -> None:
        if self.deadline is not None:  # the successor does not serve yet: a process of its node's last attempt may
            self.reached = True
            self.trace(f"{what}: dialing the successor again")  # hold the job's port on its address for a while
            if self.link is not None:
                self.link.close()
            self.loop.call_later(RETRY_MAX, self._dial)
            return
        self.say(f"spare node {self.settings.node}: {what}")
        self.exit_code = exit_codes.FAILED

    def chief_verdict(self, failure: Failure | None) -> None:
        if failure is not None:  # the job's end: its exit code is this node's too
            self.say(f"spare node {self.settings.node}: the job ended without needing this node: {failure.what}")
            self.exit_code = failure.exit_code

    def chief_lost(self, why: str) -> None:
        lost = self.link
        m = lost.membership if lost is not None and lost.membership is not None else None
        if m is None:
            self.say(f"spare node {self.settings.node}: lost the chief ({why}): leaving")
            self.exit_code = exit_codes.FAILED
            return
        assert lost is not None
        lost.close()
        self.settings = dataclasses.replace(self.settings, secret=lost.secret or "")  # its job dir may be gone
        self.deadline = self.loop.call_later(self.start_timeout, self._no_successor)
        self._follow(m, frozenset({0}), f"lost the chief ({why})")

    def _follow(self, m: Membership, gone: frozenset[int], what: str) -> None:
        """Wait at the lowest live node rank not `gone` of the lost chief's membership `m`; at the next one if it
        does not welcome this spare within the grace (cut off with the chief: node/succession.py)."""
        successor = m.successor(gone)
        if successor is None or not m.nodes[successor] or \
                not has_majority(len([n for n in m.live if n not in gone]), len(m.nodes)):
            self.say(f"spare node {self.settings.node}: {what}: leaving")
            self.exit_code = exit_codes.FAILED
            return
        self.membership = m.succeeded_by(successor)  # until the successor shares its own
        self.settings = dataclasses.replace(self.settings, chief_addr=m.nodes[successor])
        self.reached = False
        self.say(f"spare node {self.settings.node}: {what}: waits for node {successor} ({m.nodes[successor]}), "
                 "its successor")
        grace = 2 * HEARTBEAT_MISSES * self.settings.heartbeat
        cancel_timer(self.fallback)
        self.fallback = self.loop.call_later(grace, lambda: self._unreachable(m, gone, successor, grace))
        self.loop.call_later(0, self._dial)  # after this batch of events (the closed link's)

    def _unreachable(self, m: Membership, gone: frozenset[int], node: int, grace: float) -> None:
        """Passed over only if its host never answered (a refusal says it is there, not serving yet)."""
        self.fallback = None
        if self.exit_code is not None or self.place is not None or self.reached or \
                self.link is not None and (self.link.joined or self.link.dialer.reached):
            return
        if self.link is not None:  # closed, not None: the wait ends when it has no link (cli/main.py)
            self.link.close()
        self._follow(m, gone | {node}, f"could not reach node {node} ({m.nodes[node]}) within {grace:g} s")

    def _dial(self) -> None:
        if self.exit_code is None and self.place is None and (self.link is None or self.link.state is LinkState.CLOSED):
            self.link = WorkerLink(self.loop, self.settings, self, self, self)

    def _no_successor(self) -> None:
        self.deadline = None
        self.say(f"spare node {self.settings.node}: no successor chief welcomed this spare at "
                 f"{self.settings.chief_addr} within {self.start_timeout:g} s: leaving")
        self.exit_code = exit_codes.FAILED

    def promoted(self, place: int) -> None:
        self.say(f"spare node {self.settings.node}: takes node {place}'s place")
        if self.link is not None and self.link.membership is not None:
            self.membership = self.link.membership
        self.place = place

    def made_spare(self, number: int) -> None:
        self.trace(f"the chief holds this node as spare {number} already")
