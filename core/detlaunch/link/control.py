"""Questions from another shell to a running job (``detlaunch status``, ``detlaunch stacks``), on any node.

A client connects to its node's supervisor socket (the job's user only: the socket is 0600 in a
0700 directory, and the supervisor checks SO_PEERCRED) and sends one request:

    client -> supervisor   {"t": "request", "what": "status", "args": {...}}
    supervisor -> client   {"t": "reply", "data": {"job": ID, "nodes": [{"node": 0, ...}, ...], "missing": [..]}}

The chief answers for the whole job: it asks its own node and every worker node over the job
link, and answers when all have replied or the budget is spent (nodes that did not answer are
listed as missing). A worker's supervisor passes its client's request to the chief and relays
the answer; without a chief to ask (a single node, or the link is down) a node answers for itself.

    worker -> chief   {"t": "ask", "id": K, "what": ..., "args": ...}        (a client asked the worker)
    chief -> worker   {"t": "request", "id": K, "what": ..., "args": ...}    (the chief gathers)
    worker -> chief   {"t": "reply", "id": K, "data": ...}
    chief -> worker   {"t": "answer", "id": K, "data": ...}                  (for the worker's client)

(messages.py holds every message of the job link.) The link hands these to ControlRequests itself:
remote_ask, part and node_gone on the chief; chief_request, answered and chief_gone on a worker.

Each kind of question has a local handler on every node, which may answer later (stacks take
time): ``handler(args, done)`` calls ``done(data)`` once.
"""

from __future__ import annotations

import itertools
import os
import socket
import stat
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the client's side (another shell) runs no loop: it does not import one
    from detlaunch.system.eventloop import EventLoop, Timer

Handler = Callable[[Mapping[str, Any], Callable[[Any], None]], None]
JOB_FILE = "job"  # in a node's run dir: which job this supervisor runs (the client's index)
RUN_DIR_PREFIX = "detlaunch-"


class ChiefSide(Protocol):
    """What routing needs of the chief's end of the job link (chief.ChiefLink)."""

    def live_nodes(self) -> set[int]: ...
    def request(self, node: int, key: int, what: str, args: dict[str, Any]) -> None: ...
    def answer(self, node: int, key: int, data: dict[str, Any]) -> None: ...


class WorkerSide(Protocol):
    """What routing needs of a worker's end of the job link (worker.WorkerLink)."""

    def ask(self, key: int, what: str, args: dict[str, Any]) -> bool: ...
    def reply(self, key: int, data: Any) -> None: ...


class NotRunning(Exception):
    """No running job (or not the one asked for) on this node: the message says which."""


class Gathering:
    """One question the chief is answering for the whole job."""

    def __init__(self, what: str, nodes: set[int], answer: Callable[[dict[str, Any]], None]) -> None:
        self.what, self.asked, self.waiting, self.answer = what, set(nodes), set(nodes), answer
        self.parts: dict[int, Any] = {}
        self.timer: Timer | None = None


class ControlRequests:
    """The supervisor's side: local handlers, and (on the chief) gathering every node's answer.

    Routing (see the module docstring) needs the node's end of the job link, which changes with
    each attempt: `chief` and `worker` give the current one (None: not this node's role, or no link).
    """

    def __init__(self, loop: EventLoop, job_id: str, node: int, *, budget: float = 3.0,
                 chief: Callable[[], ChiefSide | None] = lambda: None,
                 worker: Callable[[], WorkerSide | None] = lambda: None) -> None:
        self.loop, self.job_id, self.node, self.budget = loop, job_id, node, budget
        self.chief, self.worker = chief, worker
        self.handlers: dict[str, Handler] = {}
        self.gatherings: dict[int, Gathering] = {}
        self.forwarded: dict[int, Callable[[dict[str, Any]], None]] = {}  # worker: ids asked of the chief
        self._ids = itertools.count(1)

    def handle(self, what: str, handler: Handler) -> None:
        self.handlers[what] = handler

    # -- routing: who answers a question --------------------------------------------------------
    def client_request(self, message: Mapping[str, Any], reply: Callable[[dict[str, Any]], None]) -> None:
        """A client on this node asked (a "request" on the supervisor socket); `reply` sends it the answer."""
        what, args = str(message.get("what")), dict(message.get("args") or {})

        def answer(data: dict[str, Any]) -> None:
            for node in data.get("nodes") or []:  # the client translates this node's pids into its own
                node["answered_here"] = node.get("node") == self.node
            reply(data)

        self.ask_job(what, args, answer)

    def ask_job(self, what: str, args: dict[str, Any], answer: Callable[[dict[str, Any]], None]) -> None:
        """The job's answer: the chief gathers every node's; a worker asks the chief (or answers alone)."""
        worker = self.worker()
        if worker is not None and worker.ask(self.forward(answer), what, args):
            return
        chief = self.chief()
        if chief is None:
            self.gather(what, args, set(), ask=lambda node, key: None, answer=answer)
            return
        self.gather(what, args, chief.live_nodes(), ask=lambda node, key: chief.request(node, key, what, args),
                    answer=answer)

    def remote_ask(self, node: int, key: int, what: str, args: dict[str, Any]) -> None:
        """Chief: a worker's client asked; the answer goes back to that worker."""
        chief = self.chief()
        if chief is not None:
            self.ask_job(what, args, lambda data: chief.answer(node, key, data))

    def chief_request(self, key: int, what: str, args: dict[str, Any]) -> None:
        """Worker: the chief gathers; this node's own answer goes back to it."""
        worker = self.worker()
        if worker is not None:
            self.local(what, args, lambda data: worker.reply(key, data))

    # -- answering -----------------------------------------------------------------------------

    def local(self, what: str, args: Mapping[str, Any], done: Callable[[Any], None]) -> None:
        """This node's own answer."""
        handler = self.handlers.get(what)
        if handler is None:
            done({"error": f"unknown question {what!r} (known: {', '.join(sorted(self.handlers))})"})
            return
        handler(args, done)

    def gather(self, what: str, args: Mapping[str, Any], nodes: set[int],
               ask: Callable[[int, int], None], answer: Callable[[dict[str, Any]], None]) -> None:
        """Chief (or a node alone): this node's answer and those of `nodes` (ask(node, id) sends them the question)."""
        key = next(self._ids)
        g = self.gatherings[key] = Gathering(what, {self.node, *nodes}, answer)
        budget = self.budget
        if isinstance(args.get("budget"), (int, float)):  # the nodes' own work (stacks) takes this long
            budget = max(budget, float(args["budget"]) + 2.0)  # + room for a loaded machine
        g.timer = self.loop.call_later(budget, lambda: self._finish(key))
        for node in sorted(nodes):
            ask(node, key)
        self.local(what, args, lambda data: self.part(key, self.node, data))

    def part(self, key: int, node: int, data: Any) -> None:
        """A node's answer to gathering `key` came in."""
        g = self.gatherings.get(key)
        if g is None or node not in g.waiting:
            return  # late, or not asked
        g.waiting.discard(node)
        g.parts[node] = data
        if not g.waiting:
            self._finish(key)

    def node_gone(self, node: int) -> None:
        """A node that will not answer any more (lost): stop waiting for it."""
        for key, g in list(self.gatherings.items()):
            if node in g.waiting:
                g.waiting.discard(node)
                if not g.waiting:
                    self._finish(key)

    def _finish(self, key: int) -> None:
        g = self.gatherings.pop(key, None)
        if g is None:
            return
        if g.timer is not None:
            g.timer.cancel()
        nodes = [{"node": n, **(d if isinstance(d, dict) else {"data": d})} for n, d in sorted(g.parts.items())]
        g.answer({"job": self.job_id, "what": g.what, "nodes": nodes, "missing": sorted(g.asked - set(g.parts))})

    def forward(self, answer: Callable[[dict[str, Any]], None]) -> int:
        """Worker: an id for a client's question passed to the chief; `answer` gets the chief's answer."""
        key = next(self._ids)
        self.forwarded[key] = answer
        return key

    def answered(self, key: int, data: dict[str, Any]) -> None:
        answer = self.forwarded.pop(key, None)
        if answer is not None:
            answer(data)

    def chief_gone(self) -> None:
        """Worker: the chief is gone (lost): the questions passed to it will get no answer from it."""
        self._unanswered("the chief was lost before it answered")

    def close(self) -> None:
        for key in list(self.gatherings):
            self._finish(key)
        self._unanswered("the job ended before the chief answered")

    def _unanswered(self, why: str) -> None:
        for key in list(self.forwarded):
            self.answered(key, {"job": self.job_id, "nodes": [], "missing": [], "error": why})


# -- the client (another shell) -------------------------------------------------------------------


def write_job_file(run_dir: str, job_id: str, node: int) -> None:
    """Let a client find this node's supervisor by job id (the run dir is private to the user)."""
    import json

    fd = os.open(os.path.join(run_dir, JOB_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"job": job_id, "node": node}, f)


def temp_dirs() -> tuple[str, ...]:
    """Where run dirs may be: every place `tempfile.gettempdir()` may pick (the planning shell's
    choice), without importing tempfile (~10 ms of a `detlaunch status` that should answer at once)."""
    return tuple(dict.fromkeys([*(os.environ[v] for v in ("TMPDIR", "TEMP", "TMP") if os.environ.get(v)),
                                "/tmp", "/var/tmp", "/usr/tmp"]))


def running_jobs(bases: tuple[str, ...] | None = None, only: str | None = None) -> dict[str, str]:
    """{job id: socket path} of this user's running jobs on this node (a stale run dir is skipped).

    only: look for that job alone (no other job's socket is tried)."""
    import json

    found: dict[str, str] = {}
    uid = os.getuid()
    for base in bases or temp_dirs():
        try:
            names = [n for n in os.listdir(base) if n.startswith(RUN_DIR_PREFIX)]
        except OSError:
            continue
        for name in names:
            run_dir = os.path.join(base, name)
            try:
                st = os.lstat(run_dir)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
                    continue
                with open(os.path.join(run_dir, JOB_FILE)) as f:
                    job = str(json.load(f)["job"])
            except (OSError, ValueError, KeyError):
                continue
            if job in found or (only is not None and job != only):
                continue
            path = os.path.join(run_dir, "supervisor.sock")
            if _answers(path):
                found[job] = path
    return found


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def find_job(job: str | None) -> tuple[str, str]:
    """(job id, socket path) of `job`, or of this user's only running job here; NotRunning otherwise."""
    jobs = running_jobs(only=job)
    if job is not None:
        if job not in jobs:
            jobs = running_jobs()  # to say which do run
            raise NotRunning(f"job {job} is not running on this node" +
                             (f" (running here: {', '.join(sorted(jobs))})" if jobs else ""))
        return job, jobs[job]
    if not jobs:
        raise NotRunning("no detlaunch job of yours is running on this node")
    if len(jobs) > 1:
        raise NotRunning(f"{len(jobs)} jobs of yours run on this node: name one ({', '.join(sorted(jobs))})")
    return next(iter(jobs.items()))


def ask(path: str, what: str, args: Mapping[str, Any] | None = None, timeout: float = 30.0) -> dict[str, Any]:
    """Send one question to a node's supervisor and wait for its answer.

    The supervisor runs in a PID namespace of its own (isolation.py): the pids it reports for its
    node are rewritten here into this shell's pids ("pid" stays the namespace's when unknown).
    """
    import json
    import struct

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        supervisor_pid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))[0]
        s.sendall(json.dumps({"t": "request", "what": what, "args": dict(args or {})}).encode() + b"\n")
        buffer = b""
        while b"\n" not in buffer:
            chunk = s.recv(1 << 16)
            if not chunk:
                raise NotRunning("the job ended before it answered")
            buffer += chunk
    reply = json.loads(buffer.split(b"\n", 1)[0])
    if reply.get("t") != "reply" or not isinstance(reply.get("data"), dict):
        raise NotRunning(f"unexpected answer: {reply.get('why') or reply!r}")
    data: dict[str, Any] = reply["data"]
    pids = host_pids(supervisor_pid)
    for node in data.get("nodes") or []:
        if node.get("answered_here"):
            for rank in node.get("ranks") or []:
                for key in ("pid", "wrapper_pid"):
                    if rank.get(key) in pids:
                        rank[key] = pids[rank[key]]
    return data


def host_pids(supervisor_pid: int) -> dict[int, int]:
    """{pid inside the supervisor's PID namespace: pid here}, for the processes of that namespace."""
    try:
        ns = os.readlink(f"/proc/{supervisor_pid}/ns/pid")
    except OSError:
        return {}
    if ns == os.readlink("/proc/self/ns/pid"):
        return {}  # not isolated: the pids are ours already
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != ns:
                continue
            with open(f"/proc/{entry}/status") as f:
                nspid = next(line for line in f if line.startswith("NSpid:")).split()
        except (OSError, StopIteration):
            continue
        found[int(nspid[-1])] = int(entry)
    return found
