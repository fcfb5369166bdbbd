"""The chief at scale: one real chief, 256 or 1024 simulated worker nodes.

    python -m bench.scale_sim                 # 256 and 1024 nodes, heartbeat 1 s
    python -m bench.scale_sim --nodes 64 --idle 5

The chief is a real `detlaunch --layer direct` (node 0 of a --hosts list of N+1 loopback
addresses, one sleeping rank). The workers are simulated: each simulating process runs up to
--per-process nodes, each a real `link.worker.WorkerLink` (the real client code: dial, HMAC
handshake, heartbeats, reports, bye) on one real `EventLoop`, from its own loopback address.
So what is measured is the real chief:

- join: from the workers' start to the last node's welcome;
- idle CPU: the chief's processes (detlaunch and its supervisor) over --idle seconds, every
  node joined, heartbeats every second both ways;
- fan-out: from one worker's failure report (the last node's) to every worker told to stop
  (the `stop` message each worker's link hands to its events), wall clock of one machine;
- RSS: the chief's supervisor with every node joined, less before any joined, per node;
- plan: `--dry-run` of a 1024-host --hosts list, hostfile and SLURM hostlist (a step's variables), start to exit;
- `--spares-case`: 1024 nodes and 32 spares (--spares), one worker's detlaunch dies: from its loss to every node and
  waiting spare told the new membership (a spare's address in the lost node's place: when the kernel received it
  at that node's socket, and when its simulating process had handled it), and to every node of the next attempt
  told to start it (the chief's restart, or its "go" after a hold) (measure_spares);
- `--chief-case [--stopped-peer]`: 1024 nodes and 32 spares, nodes 0 and 1 real, the chief's detlaunch killed:
  from its loss found to every node served by node 1, its successor, and told the next attempt's go; with a
  stopped peer (node 2, SIGSTOPped first), that no other node waits for (measure_chief).

Results are printed as a table and written as JSON (--out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from detlaunch.link.messages import Members, MembersChange
from detlaunch.link.worker import NoQuestionsNoOrders, WorkerLink
from detlaunch.testing import free_port

ROOT = Path(__file__).resolve().parent.parent


def host(i: int) -> str:
    """Node i's loopback address (node 0, the chief: 127.0.0.1)."""
    return "127.0.0.1" if i == 0 else f"127.20.{i // 250}.{i % 250 + 1}"


# -- a simulating process: many WorkerLinks on one EventLoop ----------------------------------------


SO_TIMESTAMPNS = 35  # Linux's option (the socket module has no name for it)


class StampedSocket(socket.socket):
    """A simulated node's link socket that keeps the kernel's receive time of the last bytes read (SO_TIMESTAMPNS):
    when the chief's message reached this node, not when its simulating process (256 nodes' turns, on cores
    shared with the chief and three other such processes) got round to it."""

    received_at = 0.0

    def recv(self, size: int, flags: int = 0) -> bytes:
        data, ancillary, _, _ = self.recvmsg(size, 64, flags)
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                seconds, nanoseconds = struct.unpack("qq", raw[:16])
                self.received_at = seconds + nanoseconds / 1e9
        return data


class TimedSelector:
    """The simulating process's selector, keeping when its last poll returned: what a node read in that batch was
    there by then, however long the nodes before it in the batch took (with StampedSocket's receive time, the
    earlier of the two bounds is the node's)."""

    def __init__(self, selector: Any) -> None:
        self.selector, self.polled_at = selector, 0.0
        for name in ("register", "unregister", "modify", "get_key", "get_map", "close"):  # (no lookup a call)
            setattr(self, name, getattr(selector, name))

    def select(self, timeout: float | None = None) -> Any:
        ready = self.selector.select(timeout)
        self.polled_at = time.time()
        return ready


class SimLink(WorkerLink):
    """The real worker link, telling its simulated node when the chief's membership came (a node's supervisor
    reads it only when the chief is lost: it needs no news of it)."""

    def on_message(self, conn: Any, m: Any) -> None:
        super().on_message(conn, m)
        if isinstance(m, Members | MembersChange):
            self.events.has_membership(m)

    def _welcomed(self, conn: Any, m: Any) -> None:
        """Its socket, from now on, a StampedSocket (the real connection reads it as any socket)."""
        from detlaunch.system.eventloop import Priority

        self.loop.remove(conn.sock)
        old = conn.sock
        conn.sock = StampedSocket(old.family, old.type, old.proto, fileno=old.detach())
        conn.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.loop.add_reader(conn.sock, Priority.PROBE, conn.on_readable)
        super()._welcomed(conn, m)


class SimNode(NoQuestionsNoOrders):  # the chief asks a simulated node nothing, restarts nothing
    """One simulated worker node: what its supervisor would be told (link.worker.WorkerEvents), and what its
    questions' and attempts' owners would (link.worker.WorkerQuestions, AttemptOrders: never, here)."""

    def __init__(self, sim: Simulation, node: int, spare: bool = False):
        self.sim, self.node = sim, node
        self.joined_at: float | None = None
        self.stopped_at: float | None = None
        self.link: Any = None
        self.spare, self.lost = spare, False  # the spares case: a spare waits; a node is lost
        self.place: int | None = None  # the place a spare was sent to
        self.go_at: float | None = None  # when the chief said start the next attempt (its restart or "go")
        self.told_at: float | None = None  # when a membership with a spare's address in a place reached it
        self.handled_at: float | None = None  # and when its simulating process got round to it
        self.members: tuple[int, ...] | None = None
        self.chief_lost_at: float | None = None  # the chief case: when this node found the chief lost
        self.rejoined_at: float | None = None  # and when its successor welcomed it
        self.made_spare_as: int | None = None  # its place went to a spare meanwhile: it joins again as this spare

    @property
    def in_job(self) -> bool:
        """It runs the next attempt: a worker not lost, or a spare sent to a place."""
        return not self.lost and (not self.spare or self.place is not None)

    def trace(self, message: str) -> None:
        pass

    def joined(self) -> None:
        if self.joined_at is None:
            self.joined_at = time.time()
            self.sim.on_joined()
        elif self.chief_lost_at is not None and self.rejoined_at is None:
            self.rejoined_at = time.time()
            self.sim.on_rejoined()

    def has_membership(self, told: Members | MembersChange) -> None:
        """The chief shared its membership: say when every node of this process has one naming every node and spare,
        and when every node and waiting spare has one with a spare's address in a lost node's place (read from
        the change when it is one: a few entries, not 1025 places)."""
        if isinstance(told, MembersChange):
            sent = {host(s) for s in told.c.used_spares}
            news = any(addr in sent for _, addr in told.c.moved)
        else:
            news = bool(told.m.used_spares) and all(host(s) in told.m.nodes for s in told.m.used_spares)
        if self.told_at is None and self.sim.said_members and news and not self.lost and self.place is None:
            self.handled_at = time.time()
            self.told_at = min(self.link.connection.sock.received_at or self.handled_at, self.sim.selector.polled_at)
            self.sim.told += 1
        self.sim.on_membership()

    def made_spare(self, number: int) -> None:
        """Its place went to a spare while it was away (as cli/main.py's detlaunch does: it waits as that spare)."""
        self.made_spare_as, self.spare, self.place = number, True, None
        self.rejoined_at = time.time()
        self.sim.on_rejoined()
        self.link = self.sim.new_link(self, number, chief=self.sim.successor_addr)

    def link_failed_to_start(self, what: str) -> None:
        self.sim.say({"error": f"node {self.node}: {what}"})

    def chief_verdict(self, failure: Any) -> None:
        if self.stopped_at is None:
            self.stopped_at = time.time()
            self.sim.on_stopped()
            # As a supervisor would once its ranks are gone; later, so that the fan-out measured is
            # the chief's, not this process taking 256 nodes' turns (the spares case: at once, a restart follows).
            self.sim.loop.call_later(0.0 if self.sim.restarts else 0.5, lambda: self.link.finish(failure, []))

    def chief_restart(self, attempt: int, delay: float | None) -> None:
        if delay is not None and self.go_at is None:  # no node is waited for: this is the start (else: its go)
            self.chief_go(attempt)

    def chief_go(self, attempt: int) -> None:
        if self.go_at is None:
            self.go_at, self.members = time.time(), self.link.members
            self.sim.went += 1
        self.sim.on_go()

    def promoted(self, place: int) -> None:
        """A spare sent to a lost node's place: it joins again as that node (as node/spare.py's detlaunch does)."""
        self.place = place
        self.sim.to_tell -= self.told_at is None  # it is the news
        self.sim.to_go += 1
        number = self.made_spare_as if self.made_spare_as is not None else self.node
        self.link = self.sim.new_link(self, place, promoted_from=number, chief=self.sim.successor_addr)

    def chief_lost(self, why: str) -> None:
        """The chief case: follow its successor (the lowest live node rank of its last membership), as a node's
        next supervisor (node/succession.py) or a waiting spare (node/spare.py) does: dial it, as the same node."""
        m = self.link.membership
        successor = m.successor() if self.sim.follow and m is not None else None
        if successor is None or self.chief_lost_at is not None:
            self.sim.say({"error": f"node {self.node}: lost the chief: {why}"})
            return
        self.chief_lost_at = time.time()
        self.sim.successor_addr = m.nodes[successor]
        self.link.close()
        as_node = self.place if self.place is not None else self.node
        self.link = self.sim.new_link(self, as_node, chief=m.nodes[successor])



class Simulation:
    def __init__(self, first: int, count: int, job_id: str, port: int, heartbeat: float, secret: str,
                 places: int = 0, spares: int = 0, follow: bool = False):
        """places: the spares case (the job's places, chief included; nodes numbered from there are spares,
        and a restart follows a loss); 0: no spares, no restart. spares: how many (every node's membership
        names them all before anything is lost). follow: the chief case (a lost chief's successor is followed)."""
        from detlaunch.system.eventloop import EventLoop, Priority

        self.loop = EventLoop()
        self.selector = self.loop._selector = TimedSelector(self.loop._selector)  # type: ignore[assignment]
        self.job_id, self.port, self.heartbeat, self.env = job_id, port, heartbeat, {"DETLAUNCH_JOB_SECRET": secret}
        self.restarts = places > 0
        self.places, self.spares, self.follow = places, spares, follow
        self.successor_addr = "127.0.0.1"
        self.said_members = self.said_rejoined = self.said_told = False
        self.told, self.to_tell = 0, count  # nodes told a spare's place; of every node and spare not lost or sent
        self.nodes = [SimNode(self, n, spare=self.restarts and n >= places) for n in range(first, first + count)]
        self.went = 0  # nodes told to start the next attempt (the counts: O(1) a node, not a look at all 256)
        self.to_go = sum(1 for n in self.nodes if not n.spare)  # of those in it (on_go checks)
        self.joined = self.stopped = 0
        self.said_go = False
        for sim_node in self.nodes:
            sim_node.link = self.new_link(sim_node, sim_node.node)
        self.loop.add_reader(sys.stdin, Priority.RANK_REPORT, self.on_command)
        self.done = False

    def new_link(self, sim_node: SimNode, node: int, promoted_from: int | None = None, chief: str = "127.0.0.1") -> Any:
        """A real worker link for `sim_node`, joining the chief at `chief` as node `node`, from the simulated
        node's own address (`promoted_from`: a spare sent to that place says so, as node/spare.py's detlaunch does)."""
        from detlaunch.link.settings import LinkSettings

        settings = LinkSettings(job_id=self.job_id, node=node, num_nodes=0,  # read by the chief only
                                chief_addr=chief, port=self.port, heartbeat=self.heartbeat,
                                shared_dir=tempfile.gettempdir(), environ=self.env, node_addr=host(sim_node.node),
                                promoted_from=promoted_from)
        return SimLink(self.loop, settings, sim_node, sim_node, sim_node)

    def on_membership(self) -> None:
        def complete(n: SimNode) -> bool:
            m = n.link.membership if n.link is not None else None
            return m is not None and len(m.live) == len(m.nodes) == self.places and len(m.spares) == self.spares
        if not self.said_members and all(complete(n) for n in self.nodes):
            self.said_members = True
            self.say({"membership": time.time()})
        if self.said_members and not self.said_told and self.told == self.to_tell > 0:  # (counts: O(1) a node)
            self.said_told = True
            told = [n for n in self.nodes if n.told_at]
            self.say({"membership_told": max(n.told_at or 0 for n in told),
                      "membership_handled": max(n.handled_at or 0 for n in told)})

    def on_rejoined(self) -> None:
        """The chief case: every node of this process welcomed by the successor (or made a spare on the way)."""
        if not self.said_rejoined and all(n.rejoined_at for n in self.nodes):
            self.said_rejoined = True
            self.say({"rejoined": max(n.rejoined_at or 0 for n in self.nodes), "nodes": len(self.nodes),
                      "lost_at": min(n.chief_lost_at or 0 for n in self.nodes),
                      "made_spares": sum(1 for n in self.nodes if n.made_spare_as is not None)})

    def on_go(self) -> None:
        """Every node of this process in the next attempt has the chief's go: say when the last one came."""
        if not self.said_go and self.went >= self.to_go and all(n.go_at for n in self.nodes if n.in_job):
            self.said_go = True
            told = [n for n in self.nodes if n.in_job]
            self.say({"go": max(n.go_at or 0 for n in told), "told": len(told),
                      "members": len(told[0].members or ()) if told else 0})

    def say(self, message: dict[str, Any]) -> None:
        print(json.dumps(message), flush=True)

    def on_joined(self) -> None:
        self.joined += 1
        if self.joined == len(self.nodes):
            self.say({"joined": max(n.joined_at or 0 for n in self.nodes)})

    def on_stopped(self) -> None:
        self.stopped += 1
        if self.stopped == len(self.nodes):
            self.say({"stopped": max(n.stopped_at or 0 for n in self.nodes)})

    def on_command(self) -> None:
        line = sys.stdin.readline()
        if not line or line.startswith("quit"):
            self.done = True
        elif line.startswith("lose"):  # a worker node's detlaunch dies: its connection closes, unannounced
            node = next(n for n in reversed(self.nodes) if not n.spare)
            node.lost = True
            self.to_tell -= 1
            self.to_go -= 1
            self.say({"lost_at": time.time(), "node": node.node})
            node.link.connection.sock.close()
            node.link.close()
        elif line.startswith("fail"):
            from detlaunch.outcome import Failure

            node = self.nodes[-1]
            at = time.time()
            self.say({"failed_at": at, "node": node.node})
            node.link.failed(Failure(f"rank {node.node} on node {node.node} exited with code 3", 3, at=at))

    def run(self) -> None:
        self.loop.run(done=lambda: self.done or (not self.restarts and all(n.link.closed and n.stopped_at
                                                                             for n in self.nodes)))
        self.say({"bye": True})


# -- the orchestrator ---------------------------------------------------------------------------------


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def chief_processes(chief: subprocess.Popen[bytes]) -> tuple[list[psutil.Process], psutil.Process]:
    """detlaunch, the child that makes the job's PID namespace, and the supervisor (that namespace's pid 1,
    the deepest of them): forks of `python -m detlaunch`, not the rank, its wrapper or the warm ranks'
    template (the supervisor's children too: the deepest of all, a warm rank was taken for the supervisor).
    (Only the outer process's children, as this read before, took the idle middle process for the
    supervisor: 0 % CPU and 0 KB a node.)"""
    ours = [psutil.Process(chief.pid)]
    while True:
        below = [c for c in ours[-1].children() if "detlaunch" in c.cmdline()]  # forked: `python -m detlaunch`
        if not below:
            return ours, ours[-1]
        ours.append(below[0])


_UNREAD: dict[int, bytes] = {}  # what a simulating process said past the last line read, by its pipe's fd
_UNWANTED: dict[int, list[dict[str, Any]]] = {}  # messages read while another was wanted, by its pipe's fd


def read_json(pipe: Any, want: str, timeout: float) -> dict[str, Any]:
    """The next message of a simulating process that has `want` (one read while another was wanted first),
    read from its pipe's fd itself: a buffered readline() after select() would leave a second line in its
    buffer, unseen by select() (two lines said together: "stopped", then "go")."""
    fd = pipe.fileno()
    kept = _UNWANTED.setdefault(fd, [])
    for message in kept:
        if want in message:
            kept.remove(message)
            return message
    deadline = time.monotonic() + timeout
    while True:
        while b"\n" in _UNREAD.get(fd, b""):
            line, _, _UNREAD[fd] = _UNREAD[fd].partition(b"\n")
            message = json.loads(line)
            if "error" in message:
                print("  sim:", message["error"], file=sys.stderr)
            elif want in message:
                return dict(message)
            else:
                kept.append(message)
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise RuntimeError(f"timed out waiting for {want!r}")
        data = os.read(fd, 65536)
        if not data:
            raise RuntimeError(f"a simulating process ended before it said {want!r}")
        _UNREAD[fd] = _UNREAD.get(fd, b"") + data


def wait_until_listening(port: int, chief: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until the chief accepts on its link port (a bench helper: it polls, 20 ms steps)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and chief.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("the chief never listened")


def measure(nodes: int, per_process: int, heartbeat: float, idle: float, tmp: Path) -> dict[str, Any]:
    secret, job = secrets.token_hex(16), f"sim-{nodes}-{secrets.token_hex(3)}"
    port = free_port()
    hosts = ",".join(f"{host(i)}:1" for i in range(nodes + 1))
    rank = tmp / "sleeper.py"
    rank.write_text("import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    env = {**os.environ, "DETLAUNCH_JOB_SECRET": secret, "TMPDIR": str(tmp), "XDG_CACHE_HOME": str(tmp)}
    chief = subprocess.Popen([sys.executable, "-m", "detlaunch", "--layer", "direct", "--hosts", hosts,
                              "--node-rank", "0", "--job-id", job, "--master-port", str(port),
                              "--heartbeat", f"{heartbeat:g}", "--start-timeout", "600", str(rank)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    sims: list[subprocess.Popen[str]] = []
    try:
        wait_until_listening(port + 1, chief)  # its rank starts only once every node joined
        ours, supervisor = chief_processes(chief)
        rss_before = supervisor.memory_info().rss
        started = time.time()
        for first in range(1, nodes + 1, per_process):
            count = min(per_process, nodes + 1 - first)
            sims.append(subprocess.Popen(
                [sys.executable, "-m", "bench.scale_sim", "--simulate", str(first), str(count), job, str(port + 1),
                 f"{heartbeat:g}"], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                start_new_session=True))
        joined = max(read_json(s.stdout, "joined", 300)["joined"] for s in sims)
        join_s = joined - started
        assert chief.stdout is not None
        line = chief.stdout.readline()
        assert b"ready" in line, line
        time.sleep(2 * heartbeat)  # the last joins' handshakes are over
        rss_after = supervisor.memory_info().rss
        c0, t0 = cpu_seconds(ours), time.monotonic()
        time.sleep(idle)
        cpu = (cpu_seconds(ours) - c0) / (time.monotonic() - t0)
        assert sims[-1].stdin is not None
        sims[-1].stdin.write("fail\n")
        sims[-1].stdin.flush()
        failed_at = read_json(sims[-1].stdout, "failed_at", 60)["failed_at"]
        stopped = max(read_json(s.stdout, "stopped", 120)["stopped"] for s in sims)
        chief.wait(120)
        stderr = chief.stderr.read().decode() if chief.stderr else ""
        report = next((ln for ln in stderr.splitlines() if ln.startswith("detlaunch: job failed")), stderr[-300:])
        return {"nodes": nodes, "join_s": round(join_s, 3), "idle_cpu_percent": round(100 * cpu, 2),
                "fanout_ms": round(1000 * (stopped - failed_at), 1),
                "rss_per_node_kb": round((rss_after - rss_before) / nodes / 1024, 1),
                "chief_rss_mb": round(rss_after / 2**20, 1), "chief_exit": chief.returncode, "report": report}
    finally:
        end_simulation(chief, sims, 10)


def end_simulation(chief: subprocess.Popen[bytes], sims: list[subprocess.Popen[str]], wait: float) -> None:
    """Tell every simulator to quit, then wait for it and the chief; SIGKILL the group of one still there."""
    for sim in sims:
        if sim.poll() is None and sim.stdin is not None:
            with contextlib.suppress(OSError):
                sim.stdin.write("quit\n")
                sim.stdin.flush()
    for proc in [chief, *sims]:
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def start_job(nodes: int, spares: int, per_process: int, heartbeat: float, tmp: Path, *, real: int = 1,
              follow: bool = False, alone: int | None = None) -> tuple[list[subprocess.Popen[bytes]],
                                                                    list[subprocess.Popen[str]], dict[str, Any]]:
    """A job of `nodes` worker nodes and `spares` spares (--spares; one restart for a lost node, no backoff): the
    first `real` nodes real `detlaunch --layer direct` (node 0, the chief; node 1, its successor in the chief
    case), the others simulated, `per_process` a simulating process (`alone`: this node in one of its own).
    Returns once every node and spare has joined, every real node's rank runs, and every simulated node holds
    the chief's membership naming every node live and every spare (nothing more is on its way: no sleep)."""
    secret, job = secrets.token_hex(16), f"sim-{nodes}-{secrets.token_hex(3)}"
    port = free_port()
    hosts = ",".join(f"{host(i)}:1" for i in range(nodes + 1 + spares))
    rank = tmp / "sleeper.py"
    rank.write_text("import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    env = {**os.environ, "DETLAUNCH_JOB_SECRET": secret, "TMPDIR": str(tmp), "XDG_CACHE_HOME": str(tmp)}
    reals = [subprocess.Popen([sys.executable, "-m", "detlaunch", "--layer", "direct", "--hosts", hosts,
                               "--spares", str(spares), "--max-node-restarts", "1", "--restart-backoff", "0",
                               "--node-rank", str(i), "--job-id", job, "--master-port", str(port),
                               "--heartbeat", f"{heartbeat:g}", "--start-timeout", "600", str(rank)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
             for i in range(real)]
    sims: list[subprocess.Popen[str]] = []
    wait_until_listening(port + 1, reals[0])
    first = real if alone is None else real + 1  # `alone`: the first simulated node
    ranges = [(alone, 1)] if alone is not None else []
    ranges += [(n, min(per_process, nodes + 1 + spares - n)) for n in range(first, nodes + 1 + spares, per_process)]
    for first, count in ranges:
        sims.append(subprocess.Popen(
            [sys.executable, "-m", "bench.scale_sim", "--simulate", str(first), str(count), job, str(port + 1),
             f"{heartbeat:g}", str(nodes + 1), str(spares), str(int(follow))], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True))
    for sim in sims:
        read_json(sim.stdout, "joined", 300)
    for proc in reals:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert b"ready" in line, line
    for sim in sims:
        read_json(sim.stdout, "membership", 120)
    return reals, sims, {"job": job, "ranges": ranges}


def last_words(proc: subprocess.Popen[bytes], who: str) -> None:
    """What a real node said, for a failure's diagnosis."""
    if proc.stderr is not None:
        lines = proc.stderr.read().decode(errors="replace").splitlines()[-int(os.environ.get("SIM_LINES", "30")):]
        print("\n".join(f"  {who}: {line}" for line in lines), file=sys.stderr)


def stop_reals(reals: list[subprocess.Popen[bytes]]) -> None:
    for proc in reals:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)


def measure_spares(nodes: int, spares: int, per_process: int, heartbeat: float, tmp: Path) -> dict[str, Any]:
    """The spares case: `nodes` worker nodes and `spares` spares, all joined; one worker's detlaunch dies (its
    connection closes). Timed from that to the last node and waiting spare told the new membership (the chief
    sees the loss, sends a spare to the place and tells every node, with the stop), and to the last node of
    the next attempt told to start it: the chief stops its rank, every node says goodbye, the spare joins
    again as that node meanwhile, the chief restarts (or, the spare not there yet, holds the nodes and says go
    once it has joined)."""
    reals: list[subprocess.Popen[bytes]] = []
    sims: list[subprocess.Popen[str]] = []
    failed = False
    try:
        reals, sims, _ = start_job(nodes, spares, per_process, heartbeat, tmp)
        chief = reals[0]
        assert sims[0].stdin is not None and chief.stdout is not None
        sims[0].stdin.write("lose\n")
        sims[0].stdin.flush()
        lost = read_json(sims[0].stdout, "lost_at", 60)
        said = [read_json(sim.stdout, "membership_told", 120) for sim in sims]
        told = [read_json(sim.stdout, "go", 120) for sim in sims]
        line = chief.stdout.readline()  # the next attempt's rank
        return {"nodes": nodes, "spares": spares, "lost_node": lost["node"],
                "lost_to_membership_told_ms": round(1000 * (max(m["membership_told"] for m in said)
                                                            - lost["lost_at"]), 1),
                "lost_to_membership_handled_ms": round(1000 * (max(m["membership_handled"] for m in said)
                                                               - lost["lost_at"]), 1),
                "lost_to_next_attempt_ordered_ms": round(1000 * (max(t["go"] for t in told) - lost["lost_at"]), 1),
                "nodes_told": sum(t["told"] for t in told), "places_named_in_go": max(t["members"] for t in told),
                "next_attempt_rank_started": b"ready" in line, "load": os.getloadavg()[0]}
    except Exception:
        failed = True
        raise
    finally:
        stop_reals(reals)
        if reals:
            end_simulation(reals[0], sims, 30)
        if (failed or os.environ.get('SIM_TRACE')) and reals:
            last_words(reals[0], "chief")


def measure_chief(nodes: int, spares: int, per_process: int, heartbeat: float, tmp: Path,
                  stopped: bool) -> dict[str, Any]:
    """The chief case (issue 26): the chief (node 0) and node 1 are real detlaunch, the other nodes and the
    spares simulated; every one joined, the chief's membership shared. The chief's detlaunch is SIGKILLed
    (its links close: every node finds it lost at once). Node 1 takes over as node 0; every simulated node
    dials it as its next supervisor would (node/succession.py), every spare as a waiting spare does
    (node/spare.py). Timed from the first node that found the chief lost (detection) to the last node
    welcomed by the successor (serving every node again), and to the last node told the next attempt's
    "go" (a spare in the lost chief's place). `stopped`: node 2, alone in its simulating process, is
    SIGSTOPped first (a stopped peer: it never comes back; no other node's welcome may wait for it)."""
    reals: list[subprocess.Popen[bytes]] = []
    sims: list[subprocess.Popen[str]] = []
    failed = False
    try:
        reals, sims, info = start_job(nodes, spares, per_process, heartbeat, tmp, real=2, follow=True,
                                      alone=2 if stopped else None)
        chief, successor = reals
        followers = sims[1:] if stopped else sims
        # The go is one message to every node: read from the processes that simulate nodes of the job (one of
        # spares only has nothing to say when the spare sent to the lost chief's place is another's).
        workers = [s for s, (first, _) in zip(sims, info["ranges"], strict=True) if first <= nodes and s in followers]
        print(f"  every node joined, membership shared ({time.strftime('%T')})", file=sys.stderr, flush=True)
        if stopped:
            os.killpg(sims[0].pid, signal.SIGSTOP)
        killed_at = time.time()
        os.killpg(chief.pid, signal.SIGKILL)
        rejoined = [read_json(sim.stdout, "rejoined", 120) for sim in followers]
        detected = min(r["lost_at"] for r in rejoined)
        result = {"nodes": nodes, "spares": spares, "stopped_peer": stopped,
                  "kill_to_detected_ms": round(1000 * (detected - killed_at), 1),
                  "detected_to_every_node_served_s": round(max(r["rejoined"] for r in rejoined) - detected, 3),
                  "nodes_and_spares_served": sum(r["nodes"] for r in rejoined),
                  "nodes_made_spares": sum(r["made_spares"] for r in rejoined)}
        told = [read_json(sim.stdout, "go", 120) for sim in workers]
        assert successor.stdout is not None
        line = successor.stdout.readline()  # the next attempt's rank 0, on the successor
        result.update({"detected_to_every_node_told_go_s": round(max(t["go"] for t in told) - detected, 3),
                       "next_attempt_rank_started": b"ready" in line, "load": os.getloadavg()[0]})
        return result
    except Exception:
        failed = True
        raise
    finally:
        if stopped and sims:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sims[0].pid, signal.SIGCONT)
        stop_reals(reals)
        if reals:
            end_simulation(reals[-1], sims, 30)
            end_simulation(reals[0], [], 10)
        if failed:
            for proc, who in zip(reals, ("chief", "successor"), strict=False):
                last_words(proc, who)


def slurm_step_env(names: list[str], node_id: int) -> dict[str, str]:
    """What `srun --ntasks-per-node=1` sets on node `node_id` of a job on `names` (as tests/planning/discovery has it),
    the node list compressed the way SLURM writes it; the machine's own scheduler variables left out."""
    from detlaunch.planning.providers.hostlist import compress_hostlist

    nodes, n = compress_hostlist(names), len(names)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    env.update({"SLURM_JOB_ID": "17", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": nodes, "SLURM_NODELIST": nodes,
                "SLURM_STEP_NODELIST": nodes, "SLURM_NODEID": str(node_id), "SLURMD_NODENAME": names[node_id],
                "SLURM_NNODES": str(n), "SLURM_NTASKS": str(n), "SLURM_NTASKS_PER_NODE": "1",
                "SLURM_TASKS_PER_NODE": f"1(x{n})", "SLURM_STEP_TASKS_PER_NODE": f"1(x{n})",
                "SLURM_PROCID": str(node_id), "SLURM_LOCALID": "0"})
    return env


def plan_time(hosts: int, tmp: Path, reps: int = 3) -> dict[str, float]:
    """Median seconds for `detlaunch --dry-run` of a `hosts`-node job: --hosts, a hostfile, a SLURM step's
    variables (its compressed SLURM_JOB_NODELIST expanded, every name resolved); on the chief and the last
    node; and a 1-host --hosts job, the floor (interpreter, plugins, plan). Interleaved, rotated each repetition."""
    names = [host(i) for i in range(hosts)]
    hostfile = tmp / "hostfile"
    hostfile.write_text("".join(f"{h} slots=8\n" for h in names))
    rank = tmp / "train.py"
    rank.write_text("pass\n")
    port = str(free_port())
    sources = {"hosts": ["--hosts", ",".join(f"{h}:8" for h in names)], "hostfile": ["--hostfile", str(hostfile)],
               "slurm": ["--nproc-per-node", "8"], "1 host": ["--hosts", "127.0.0.1:8"]}
    cases = [(label, node_rank) for label in sources for node_rank in (0, hosts - 1) if label != "1 host"]
    cases.append(("1 host", 0))
    samples: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    for rep in range(reps):
        for label, node_rank in cases[rep % len(cases):] + cases[:rep % len(cases)]:
            env, argv = None, [*sources[label], "--node-rank", str(node_rank)]
            if label == "slurm":
                env, argv = slurm_step_env(names, node_rank), sources[label]
            t0 = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "detlaunch", "--layer", "direct", *argv, "--master-port", port,
                                   "--dry-run", "--format", "json", str(rank)],
                                  capture_output=True, timeout=120, check=False, env=env)
            samples[(label, node_rank)].append(time.monotonic() - t0)
            assert done.returncode == 0, done.stderr
            cluster = json.loads(done.stdout)["cluster"]
            assert (len(cluster["node_addrs"]), cluster["node_rank"]) == (
                1 if label == "1 host" else hosts, node_rank), cluster["node_rank"]
            assert cluster["provider"] == ("slurm" if label == "slurm" else "static"), cluster["provider"]
    return {("1 host (the floor)" if label == "1 host" else f"{label} node {node_rank}"):
            round(statistics.median(samples[(label, node_rank)]), 3) for label, node_rank in cases}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale_sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--per-process", type=int, default=256, help="simulated nodes per simulating process")
    p.add_argument("--heartbeat", type=float, default=1.0)
    p.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measurement")
    p.add_argument("--plan-only", action="store_true", help="only the --dry-run plan times of 1024 hosts")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scale_sim.json")
    p.add_argument("--spares-case", action="store_true",
                   help="only the spares case: 1024 nodes and 32 spares, one node lost, to every node told the "
                   "next attempt's places (--nodes, --spares change it)")
    p.add_argument("--chief-case", action="store_true",
                   help="only the chief case: 1024 nodes and 32 spares, the chief's detlaunch killed, to every node "
                   "served by its successor and told the next attempt's go (--nodes, --spares change it)")
    p.add_argument("--stopped-peer", action="store_true",
                   help="the chief case with node 2 stopped (SIGSTOP) first: no other node may wait for it")
    p.add_argument("--spares", type=int, default=32)
    p.add_argument("--reps", type=int, default=3, help="repetitions of the spares or chief case")
    p.add_argument("--simulate", nargs="+", help=argparse.SUPPRESS)  # FIRST COUNT JOB PORT HB [PLACES SPARES FOLLOW]
    args = p.parse_args(argv)
    if args.simulate:
        first, count, job, port, heartbeat, *more = args.simulate
        places, spares, follow = [int(v) for v in more] + [0] * (3 - len(more))
        sim = Simulation(int(first), int(count), job, int(port), float(heartbeat), os.environ["DETLAUNCH_JOB_SECRET"],
                   places, spares, bool(follow))
        if os.environ.get("SIM_PROFILE"):
            import cProfile
            cProfile.runctx("sim.run()", globals(), {"sim": sim}, f"/tmp/simprof.{first}")
        else:
            sim.run()
        return 0
    if args.spares_case or args.chief_case:
        nodes = args.nodes[-1] if args.nodes != [256, 1024] else 1024
        runs = []
        for _ in range(args.reps):
            with tempfile.TemporaryDirectory() as tmp:
                if args.spares_case:
                    runs.append(measure_spares(nodes, args.spares, args.per_process, args.heartbeat, Path(tmp)))
                else:
                    runs.append(measure_chief(nodes, args.spares, args.per_process, args.heartbeat, Path(tmp),
                                              args.stopped_peer))
            print(json.dumps(runs[-1]), flush=True)
        keys = ["lost_to_membership_told_ms", "lost_to_membership_handled_ms",
                "lost_to_next_attempt_ordered_ms"] if args.spares_case else [
            "detected_to_every_node_served_s", "detected_to_every_node_told_go_s"]
        print(json.dumps({f"median_{k}": statistics.median(r[k] for r in runs) for k in keys}), flush=True)
        return 0
    results: dict[str, Any] = {"runs": [], "load": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        for n in [] if args.plan_only else args.nodes:
            run = measure(n, args.per_process, args.heartbeat, args.idle, Path(tmp))
            print(json.dumps(run), flush=True)
            results["runs"].append(run)
        results["plan_1024_hosts_s"] = plan_time(1024, Path(tmp))  # medians of 3
        print(json.dumps(results["plan_1024_hosts_s"]), flush=True)
    results["load_after"] = os.getloadavg()
    print(json.dumps({"load average (1, 5, 15 min) before": results["load"], "after": results["load_after"]}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
