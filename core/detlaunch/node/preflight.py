"""``--preflight`` on a node: before any rank starts, every node checks itself and its pair, and the chief judges.

The chief runs it once every node has joined (Startup.start_when_ready asks `holds`); each node waits
for its "preflight_go" before its launchers start. The chief asks the job over the existing control
path (link/control.py, the same as ``detlaunch status``):

    "preflight"     {round, node_checks, doctor, groups, backend, budget}: each node runs one check child
                    (node/preflight_child.py) and answers its figures;
    "preflight_go"  {attempt}: the preflight passed; each node starts its launchers.

Round 1 pairs neighbours; a round 2 (re-paired, planning/preflight.py) runs only when round 1 found a
slow or failed group. The judge names every node that failed or stays under --preflight-threshold of
the median. Then: a spare waits -> the node is sent away, its host excluded, and the spare takes its
place at once, before any rank starts (no attempt is spent: LinkEvents.replace_before_start); once it
has joined, the chief plans again for it and the preflight runs again, the spare checked too; else
--preflight-action stop (one line, exit code PREFLIGHT) or warn (the job goes on).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import detlaunch.exit_codes as exit_codes
from detlaunch.link.chief import ChiefLink
from detlaunch.link.control import ControlRequests
from detlaunch.link.worker import WorkerLink
from detlaunch.node.phase import Phase
from detlaunch.observe.emitter import EventEmitter
from detlaunch.observe.events import EventKind
from detlaunch.planning import preflight as judge
from detlaunch.planning.plan import LaunchPlan
from detlaunch.planning.preflight import ALWAYS, STOP, WARN, Figure, Finding, Result
from detlaunch.system.eventloop import EventLoop, Priority, Timer, cancel_timer

BUDGET = 60.0  # seconds a round may take on a node (the torch import, the group forming, the checks)
GROUP_TIMEOUT = 30.0  # seconds a pair's group may take to form
PORT_OFFSET = 2  # the groups' stores listen from the master port + 2 (+ 1 is the job link's)


class PreflightHost(Protocol):
    loop: EventLoop
    plan: LaunchPlan
    node: int
    env: dict[str, str]
    control: ControlRequests
    events: EventEmitter

    @property
    def attempt(self) -> int: ...

    @property
    def phase(self) -> Phase: ...

    @property
    def link(self) -> ChiefLink | WorkerLink | None: ...

    def say(self, message: str) -> None: ...
    def trace(self, message: str) -> None: ...
    def fail_to_start(self, what: str, exit_code: int = exit_codes.FAILED) -> None: ...


class Preflight:
    def __init__(self, host: PreflightHost, start: Callable[[], None], replace: Callable[[int, str], bool],
                 end: Callable[[], None]) -> None:
        """start: the launchers start if ready (Startup.start_when_ready); replace: a spare takes the node's
        place, its host excluded (LinkEvents.replace_before_start), False when no spare waits; end: this node's
        part ends, nothing started (``detlaunch doctor --job``, which runs the preflight only)."""
        self.host, self.start, self.replace, self.end = host, start, replace, end
        plan = host.plan
        settings = plan.settings  # a plan made by hand (tests) may lack them
        self.mode: str | None = settings.get("preflight") or None
        self.threshold = float(settings.get("preflight_threshold") or judge.DEFAULT_THRESHOLD)
        self.action = str(settings.get("preflight_action") or STOP)
        self.only = bool(settings.get("job"))  # detlaunch doctor --job: the preflight, its table, and the end
        self.passed: set[int] = set()  # the attempts whose preflight passed (a worker: the chief said go)
        self.running = False  # chief: rounds under way
        self.children: set[CheckChild] = set()
        self.started = 0.0
        self.results: list[Result] = []
        self.hosts: dict[int, str] = {}  # chief: the nodes checked, and their addresses
        host.control.handle("preflight", self.answer)
        host.control.handle("preflight_go", self.go_answer)

    # -- the gate (Startup.start_when_ready) ---------------------------------------------------------
    def due(self) -> bool:
        """--preflight once: before each attempt until one passed (a spare's replacement is checked too);
        always: before every attempt."""
        if not self.mode or self.host.attempt in self.passed:
            return False
        return self.mode == ALWAYS or not self.passed

    def holds(self, link_up: bool) -> bool:
        """Whether the launchers wait for the preflight; the chief starts it once every node is there."""
        if not self.due():
            return False
        if self.host.plan.cluster.is_chief and not self.running and (self.host.link is None or link_up):
            self.begin()
        return True

    # -- the chief: rounds and the verdict ------------------------------------------------------------
    def begin(self) -> None:
        h = self.host
        self.running, self.started, self.results = True, time.monotonic(), []
        link = h.link
        nodes = sorted({0, *(link.live_nodes() if isinstance(link, ChiefLink) else ())})
        self.hosts = {n: (link.addr_of(n) if isinstance(link, ChiefLink) else "") or h.plan.cluster.node_addrs[n]
                      or "?" for n in nodes}
        h.trace(f"preflight: round 1 on node(s) {nodes}")
        self._round(1, judge.first_round(nodes), doctor=True)

    def _round(self, number: int, groups: list[judge.Group], doctor: bool) -> None:
        base = int(self.host.plan.context.config.options.get("master_port") or 29500) + PORT_OFFSET
        base += (number - 1) * (len(self.hosts) // 2 + 1)
        args = {"round": number, "node_checks": True, "doctor": doctor, "budget": BUDGET,
                "backend": self.host.plan.context.config.options.get("backend") or "gloo",
                **judge.round_args(groups, self.hosts, base)}
        self.host.control.ask_job("preflight", args, lambda answer: self._round_done(number, groups, answer))

    def _round_done(self, number: int, groups: list[judge.Group], answer: dict[str, Any]) -> None:
        if not self.running or self.host.phase is not Phase.STARTING:
            return  # the job stopped meanwhile (a signal, a lost node): no verdict to give
        results = parse_answer(answer)
        for node in answer.get("missing") or []:
            results.append(Result(int(node), "preflight", Figure(False, None, "its node did not answer in time")))
        self.results += results
        speed = {g: v for g, v in judge.group_speeds(results).items() if g in groups}
        if number == 1 and judge.needs_second_round(groups, speed, self.threshold):
            second = judge.second_round(groups, speed)
            self.host.trace(f"preflight: round 2, re-paired {second}")
            self._round(2, second, doctor=False)
            return
        self._verdict()

    def _verdict(self) -> None:
        h = self.host
        self.running = False
        findings = judge.judge(self.results, self.threshold, self.hosts)
        seconds = time.monotonic() - self.started
        for line in judge.table(self.results, findings, self.hosts):
            (h.say if self.only else h.trace)(f"preflight: {line}")
        action = "none"
        if findings:
            action = self._act(findings)
        else:
            h.say(f"preflight: {len(self.hosts)} node(s) ok in {seconds:.1f} s ({summary(self.results)})")
        h.events.emit(EventKind.PREFLIGHT, ok=not findings, seconds=round(seconds, 3), action=action,
                      nodes=len(self.hosts), findings=[finding_json(f) for f in findings])
        if action in ("none", WARN):
            self._go()

    def _act(self, findings: list[Finding]) -> str:
        """Replace what a spare can replace; else stop (one line) or warn. The action taken."""
        h = self.host
        rest = [f for f in findings if self.only or not self.replace(f.node, "slow or broken in the preflight")]
        for f in findings:
            if f not in rest:
                h.say(f"preflight: {f.describe()}; a spare takes its place, its host is excluded")
        if not rest:
            return "replace"
        named = "; ".join(f.describe() for f in rest)
        if self.action == WARN and not self.only:
            h.say(f"preflight: {named}; the job goes on (--preflight-action warn)")
            return WARN
        h.fail_to_start(f"preflight: {named}", exit_codes.PREFLIGHT)
        return STOP

    def _go(self) -> None:
        attempt = self.host.attempt
        self.passed.add(attempt)
        self.host.control.ask_job("preflight_go", {"attempt": attempt}, lambda answer: None)

    # -- every node: its part ---------------------------------------------------------------------------
    def answer(self, args: Any, done: Callable[[Any], None]) -> None:
        """The "preflight" question: this node's figures for the round (its check child's)."""
        h = self.host
        group = next((g for g in args.get("groups") or [] if h.node in g.get("nodes", ())), None)
        config = h.plan.context.config
        spec = {"node": h.node, "layer": config.layer, "options": config.options, "doctor": args.get("doctor"),
                "node_checks": args.get("node_checks"), "group": group, "backend": args.get("backend"),
                "timeout": GROUP_TIMEOUT}

        def finished(child: CheckChild) -> None:
            self.children.discard(child)
            done({"results": child.results()})

        try:
            child = CheckChild(h.loop, spec, h.env, float(args.get("budget") or BUDGET), finished)
        except OSError as e:  # no process could start here: that is this node's figure
            done({"results": [Result(h.node, "preflight", Figure(False, None, f"no check child: {e}")).to_json()]})
            return
        self.children.add(child)

    def go_answer(self, args: Any, done: Callable[[Any], None]) -> None:
        """The "preflight_go" question: the preflight passed; this node's launchers start (if ready)."""
        self.passed.add(int(args.get("attempt") or self.host.attempt))
        done({})
        self.host.loop.call_later(0, self.end if self.only else self.start)

    def close(self) -> None:
        self.running = False
        for child in list(self.children):
            child.stop()
        self.children.clear()


class CheckChild:
    """One check child (node/preflight_child.py): its spec on stdin, its figures on stdout, killed at `budget`.

    Its own session, killed as a group at the budget or the end: nothing of it outlives the round. Its
    exit is reaped by the process table (as an orphan): the end of its output is what counts here."""

    def __init__(self, loop: EventLoop, spec: dict[str, Any], env: dict[str, str], budget: float,
                 finished: Callable[[CheckChild], None]) -> None:
        self.loop, self.node, self.finished = loop, int(spec["node"]), finished
        self.output = b""
        self.done = False
        import subprocess  # only with --preflight: the supervisor's start stays light (test_startup_imports)

        self.proc = subprocess.Popen([sys.executable, "-m", "detlaunch.node.preflight_child"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(spec, default=str).encode())
        self.proc.stdin.close()
        os.set_blocking(self.proc.stdout.fileno(), False)
        loop.add_reader(self.proc.stdout, Priority.CHILD_OUTPUT, self._read)
        self.timer: Timer | None = loop.call_later(budget, lambda: self._end(f"no figures within {budget:g} s"))
        self.why = ""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            data = os.read(self.proc.stdout.fileno(), 65536)
        except BlockingIOError:
            return
        if data:
            self.output = (self.output + data)[-65536:]
            return
        self._end("")

    def _end(self, why: str) -> None:
        if self.done:
            return
        self.done, self.why = True, why
        self.stop()
        self.finished(self)

    def stop(self) -> None:
        cancel_timer(self.timer)
        self.timer = None
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.loop.remove(self.proc.stdout)
            self.proc.stdout.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever it left (a torch thread pool, a store)
        except (ProcessLookupError, PermissionError):
            pass

    def results(self) -> list[dict[str, Any]]:
        """Its figures; none printed (it crashed, or ran out of time) is one failed figure saying why."""
        lines = self.output.decode(errors="replace").splitlines()
        for line in reversed(lines):
            if line.startswith('{"results"'):
                try:
                    return list(json.loads(line)["results"])
                except (ValueError, KeyError, TypeError):
                    break
        tail = " | ".join(lines[-3:])[-300:]
        why = self.why or "the check child ended without figures"
        return [Result(self.node, "preflight", Figure(False, None, f"{why}: {tail}" if tail else why)).to_json()]


def parse_answer(answer: dict[str, Any]) -> list[Result]:
    results = []
    for node in answer.get("nodes") or []:
        for item in node.get("results") or [] if isinstance(node, dict) else []:
            try:
                results.append(Result.from_json(item))
            except (KeyError, TypeError, ValueError):
                continue
    return results


def summary(results: list[Result]) -> str:
    """The medians of the compared checks: "compute 41 GFLOP/s, network 950 MB/s"."""
    import statistics

    parts = []
    for check in dict.fromkeys(r.check for r in results if r.compare):
        values = [r.figure.value for r in results if r.check == check and r.figure.ok and r.figure.value is not None]
        if values:
            unit = next(r.unit for r in results if r.check == check)
            parts.append(f"{check} {statistics.median(values):.3g} {unit}".rstrip())
    return "median " + ", ".join(parts) if parts else "no figures"


def finding_json(f: Finding) -> dict[str, Any]:
    return {"node": f.node, "host": f.host, "reasons": list(f.reasons), "figures": dict(f.figures)}
