"""`detlaunch status` from another shell: every rank of every node, only for the job's user, and a
clear line once the job is not running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from detlaunch.link.control import ControlRequests, running_jobs
from detlaunch.system.eventloop import EventLoop
from support.helpers import free_port
from support.jobs import SCRIPTS, Launcher

RANKS = str(SCRIPTS / "ranks.py")


def status(launcher: Launcher, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "detlaunch", "status", *args], env=launcher.env,
                          capture_output=True, text=True, timeout=30)


@pytest.mark.timeout(200)
def test_status_on_two_nodes_from_either_node(launcher: Launcher) -> None:
    job_id = f"test-{uuid.uuid4().hex[:8]}"  # other jobs of this user may run here: always name ours
    common = ["--layer", "torchrun", "--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(free_port()), "--job-id", job_id]
    env = {"SLEEP": "300"}
    jobs = [launcher.start(*common, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}", RANKS, env=env)
            for n in (0, 1)]
    for rank in range(4):
        jobs[rank // 2].wait_for_output(f"[rank={rank}] rank {rank} sleeping", timeout=150)
    runs = [status(launcher, job_id, "--format", "json") for _ in range(3)]  # whichever node's socket is found
    for run in runs:
        assert run.returncode == 0, run.stderr
        data = json.loads(run.stdout)
        assert [n["node"] for n in data["nodes"]] == [0, 1] and data["missing"] == []
        ranks = [r for n in data["nodes"] for r in n["ranks"]]
        assert [(r["rank"], r["state"]) for r in ranks] == [(i, "running") for i in range(4)]
        here = next(n for n in data["nodes"] if n["answered_here"])
        for r in here["ranks"]:  # this shell's pids: the rank's own process
            cmdline = Path(f"/proc/{r['pid']}/cmdline").read_bytes()
            assert b"ranks.py" in cmdline and b"run_wrapper.py" not in cmdline
    text = status(launcher, job_id)
    assert text.returncode == 0 and text.stdout.startswith(f"job {data['job']}: running, 4 rank(s) on 2 node(s)\n")
    rows = [line.split() for line in text.stdout.splitlines()[2:]]
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == [(str(i // 2), f"127.0.0.{i // 2 + 1}", str(i), "running")
                                                        for i in range(4)], text.stdout
    job = json.loads(runs[0].stdout)["job"]
    assert job == job_id
    for j in jobs:
        j.send_signal(2)
    for j in jobs:
        j.wait(60)
    gone = status(launcher, job)
    assert gone.returncode == 1 and gone.stderr.startswith(f"detlaunch: job {job} is not running on this node"), gone
    assert job_id not in status(launcher).stderr  # neither named nor listed among the running ones


@pytest.mark.timeout(120)
def test_another_user_cannot_ask(launcher: Launcher) -> None:
    job_id = f"test-{uuid.uuid4().hex[:8]}"
    job = launcher.start("--layer", "torchrun", "--nproc-per-node", "1", "--master-port", str(free_port()),
                         "--job-id", job_id, RANKS, env={"SLEEP": "300"})
    job.wait_for_output("[rank=0] rank 0 sleeping", timeout=60)
    sock = running_jobs((str(launcher.tmpdir), "/tmp"))[job_id]
    user = f"dl{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "-M", "-s", "/bin/sh", user], check=True)
    try:
        code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
                "except OSError as e:\n    print(e.errno)\nelse:\n    print('connected')")
        out = subprocess.run(["runuser", "-u", user, "--", "/usr/bin/python3", "-c", code, str(sock)],
                             capture_output=True, text=True, timeout=30, cwd="/")
        assert out.stdout.strip() == "13", out  # EACCES: the run dir is the job user's only
    finally:
        subprocess.run(["userdel", user], check=True)
    job.send_signal(15)
    job.wait(60)


def test_the_chief_answers_with_whatever_came_within_the_budget() -> None:
    now = [0.0]
    loop = EventLoop(clock=lambda: now[0])
    control = ControlRequests(loop, "job-1", node=0, budget=3.0)
    control.handle("status", lambda args, done: done({"phase": "running"}))
    asked: list[int] = []
    answers: list[dict[str, object]] = []
    control.gather("status", {}, {1, 2}, ask=lambda node, key: asked.append(node), answer=answers.append)
    assert asked == [1, 2] and answers == []
    control.part(1, 2, {"phase": "stopping"})
    now[0] = 3.5
    loop.run_once(timeout=0)
    assert answers == [{"job": "job-1", "what": "status", "missing": [1],
                        "nodes": [{"node": 0, "phase": "running"}, {"node": 2, "phase": "stopping"}]}]
    control.part(1, 1, {"phase": "late"})  # too late: already answered
    assert len(answers) == 1
    loop.close()


def test_a_lost_node_is_not_waited_for_and_unknown_questions_say_so() -> None:
    loop = EventLoop()
    control = ControlRequests(loop, "job-1", node=0)
    answers: list[dict[str, object]] = []
    control.gather("nosuch", {}, {1}, ask=lambda node, key: None, answer=answers.append)
    control.node_gone(1)
    (answer,) = answers
    assert answer["missing"] == [1]
    assert "unknown question 'nosuch'" in str(answer["nodes"])
    loop.close()
    assert os.getuid() == 0  # the suite runs as root (useradd, sshd): say so if that ever changes


# -- routing (control.ControlRequests), in milliseconds: the link's two ends stand in as recorders --

class ChiefEnd:
    """The chief's end of the link as routing sees it: who is connected, and what was sent."""

    def __init__(self, nodes: set[int]) -> None:
        self.nodes = nodes
        self.requests: list[tuple[int, int, str]] = []
        self.answers: list[tuple[int, int, dict[str, object]]] = []

    def live_nodes(self) -> set[int]:
        return set(self.nodes)

    def request(self, node: int, key: int, what: str, args: dict[str, object]) -> None:
        self.requests.append((node, key, what))

    def answer(self, node: int, key: int, data: dict[str, object]) -> None:
        self.answers.append((node, key, data))


class WorkerEnd:
    def __init__(self, authed: bool) -> None:
        self.authed = authed
        self.asked: list[tuple[int, str]] = []
        self.replies: list[tuple[int, object]] = []

    def ask(self, key: int, what: str, args: dict[str, object]) -> bool:
        if self.authed:
            self.asked.append((key, what))
        return self.authed

    def reply(self, key: int, data: object) -> None:
        self.replies.append((key, data))


def test_the_chief_gathers_every_live_node_for_a_workers_client() -> None:
    loop = EventLoop()
    end = ChiefEnd({1, 2})
    control = ControlRequests(loop, "job-1", node=0, chief=lambda: end)
    control.handle("status", lambda args, done: done({"phase": "running"}))
    control.remote_ask(2, 7, "status", {})  # node 2's client asked node 2, which asked the chief
    assert [(n, what) for n, _, what in end.requests] == [(1, "status"), (2, "status")] and end.answers == []
    key = end.requests[0][1]
    control.part(key, 1, {"phase": "running"})
    control.part(key, 2, {"phase": "stopping"})
    assert end.answers == [(2, 7, {"job": "job-1", "what": "status", "missing": [], "nodes": [
        {"node": 0, "phase": "running"}, {"node": 1, "phase": "running"}, {"node": 2, "phase": "stopping"}]})]
    loop.close()


def test_a_worker_passes_its_clients_question_to_the_chief_and_relays_the_answer() -> None:
    loop = EventLoop()
    end = WorkerEnd(authed=True)
    control = ControlRequests(loop, "job-1", node=1, worker=lambda: end)
    replies: list[dict[str, object]] = []
    control.client_request({"t": "request", "what": "status"}, replies.append)
    ((key, what),) = end.asked
    assert what == "status" and replies == []
    control.answered(key, {"job": "job-1", "nodes": [{"node": 0}, {"node": 1}], "missing": []})
    assert replies == [{"job": "job-1", "missing": [], "nodes": [{"node": 0, "answered_here": False},
                                                                 {"node": 1, "answered_here": True}]}]
    control.handle("status", lambda args, done: done({"phase": "running"}))
    control.chief_request(5, "status", {})  # the chief gathers: this node's own part goes back to it
    assert end.replies == [(5, {"phase": "running"})]
    loop.close()


def test_a_node_without_a_chief_to_ask_answers_for_itself() -> None:
    loop = EventLoop()
    control = ControlRequests(loop, "job-1", node=1, worker=lambda: WorkerEnd(authed=False))
    control.handle("status", lambda args, done: done({"phase": "starting"}))
    replies: list[dict[str, object]] = []
    control.client_request({"what": "status"}, replies.append)
    assert replies == [{"job": "job-1", "what": "status", "missing": [],
                        "nodes": [{"node": 1, "phase": "starting", "answered_here": True}]}]
    control.remote_ask(3, 1, "status", {})  # not the chief: nothing to route, nothing sent
    loop.close()


@pytest.mark.timeout(120)
def test_an_idle_client_connection_does_not_keep_the_job_from_ending(launcher: Launcher) -> None:
    """A `detlaunch status` stopped with Ctrl-Z right after connecting, or a leftover socat: the job
    still ends when its ranks do (it waited for every connection of the socket to close)."""
    import socket

    job_id = f"test-{uuid.uuid4().hex[:8]}"
    job = launcher.start("--layer", "direct", "--nproc-per-node", "2", "--master-port", str(free_port()),
                         "--job-id", job_id, RANKS, env={"SLEEP": "3"})
    job.wait_for_output("[rank=1] rank 1 sleeping", timeout=60)
    found = subprocess.run([sys.executable, "-c", "import sys; from detlaunch.link.control import find_job; "
                            "print(find_job(sys.argv[1])[1])", job_id], env=launcher.env, capture_output=True,
                           text=True, timeout=30)
    assert found.returncode == 0, found.stderr
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        idle.connect(found.stdout.strip())  # and says nothing
        r = job.wait(60)
    finally:
        idle.close()
    assert r.returncode == 0, r.output
    assert "job finished: 2 rank(s) exited 0" in r.stderr
