"""Watching a running job for real: the event log, `detlaunch status`'s table, and a folded console."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support import paths
from support.helpers import free_port
from support.jobs import SCRIPTS, Launcher
from test_events import SCHEMA_FILE, check

RANKS = str(SCRIPTS / "ranks.py")
SCHEMA = json.loads(SCHEMA_FILE.read_text())


def status(launcher: Launcher, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "detlaunch", "status", *args], env=launcher.env,
                          capture_output=True, text=True, timeout=30)


def read_events(path: Path) -> list[dict[str, object]]:
    events = [json.loads(line) for line in path.read_text().splitlines()]
    for event in events:
        assert check(event, SCHEMA) == [], event
    return events


def kinds(events: list[dict[str, object]], rank: int | None = None) -> list[object]:
    return [e["kind"] for e in events if rank is None or e["rank"] == rank]


def index(events: list[dict[str, object]], kind: str, rank: int | None = None) -> int:
    return next(i for i, e in enumerate(events) if e["kind"] == kind and (rank is None or e["rank"] == rank))


@pytest.mark.timeout(240)
def test_a_failing_two_node_job_logs_its_events_in_order_and_status_shows_the_cause(
        launcher: Launcher, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    job_id = f"test-{uuid.uuid4().hex[:8]}"  # other jobs of this user may run on this machine
    common = ["--layer", "torchrun", "--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(free_port()), "--log-dir", str(logs), "--grace-period", "30", "--job-id", job_id]
    fifo = tmp_path / "trigger"
    subprocess.run(["mkfifo", str(fifo)], check=True)
    env = {"SLEEP": "300", "FAIL_RANK": "3", "FAIL_CODE": "7", "TRIGGER": str(fifo), "TRAP_TERM": "1"}
    jobs = [launcher.start(*common, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}", RANKS, env=env)
            for n in (0, 1)]
    for rank in range(3):
        jobs[rank // 2].wait_for_output(f"[rank={rank}] rank {rank} sleeping", timeout=150)
    jobs[1].wait_for_output("[rank=3] rank 3 waiting", timeout=60)

    deadline = time.monotonic() + 30
    while True:  # the first CPU sample of every rank's tree comes a sampling interval or two after it started
        running = status(launcher, job_id, "--format", "json")
        assert running.returncode == 0, running.stderr
        data = json.loads(running.stdout)
        rows = [r for n in data["nodes"] for r in n["ranks"]]
        if all(r["cpu_percent"] is not None for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert all(r["rss"] > 1 << 20 for r in rows), rows
    assert [(r["rank"], r["node"], r["host"], r["state"]) for r in rows] == [
        (0, 0, "127.0.0.1", "running"), (1, 0, "127.0.0.1", "running"),
        (2, 1, "127.0.0.2", "running"), (3, 1, "127.0.0.2", "running")]
    assert all(r["started_at"] and r["last_output"] and r["restarts"] == 0 for r in rows), rows

    fifo.write_text("x")  # rank 3 fails; the others catch SIGTERM and carry on: the job stops for its grace period
    jobs[1].wait_for_output("[rank=3] rank 3 failing", timeout=60)
    jobs[0].wait_for_output("stopping the job", timeout=60)
    after = status(launcher, job_id)
    assert after.returncode == 0, after.stderr
    table = after.stdout.splitlines()
    assert table[0].endswith("stopping, 4 rank(s) on 2 node(s)"), after.stdout
    assert table[1] == "root cause: rank 3 on node 1 (127.0.0.2) exited with code 7", after.stdout
    assert table[2].split() == ["NODE", "HOST", "RANK", "PID", "STATE", "RUN", "TIME", "LAST", "OUTPUT",
                                "HEARTBEAT", "CPU", "%", "RSS", "MB", "RESTARTS"]
    row3 = table[6].split()
    assert row3[:3] == ["1", "127.0.0.2", "3"] and row3[4:6] == ["exit", "7"], after.stdout
    for row in table[3:6]:  # still running, with a CPU % and an RSS sampled from its process tree
        cells = row.split()
        assert cells[4] == "running" and float(cells[-2]) > 1 and cells[-1] == "0", after.stdout

    watched = tmp_path / "watch.out"
    with open(watched, "w") as f:
        watch = subprocess.Popen([sys.executable, "-m", "detlaunch", "status", job_id, "--watch", "0.2"],
                                 env=launcher.env, stdout=f, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while watched.read_text().count("RESTARTS") < 2 and time.monotonic() < deadline:  # two frames drawn
        time.sleep(0.05)
    for j in jobs:
        j.send_signal(2)  # not waiting 30 s for the grace period
    assert [j.wait(90).returncode for j in jobs] == [7, 7]
    _, err = watch.communicate(timeout=30)  # --watch ends with the job
    out = watched.read_text()
    assert watch.returncode == 0 and err == f"detlaunch: job {job_id} is not running any more\n", err
    frames = out.split("\n\n")  # not a terminal: frames one after another, a blank line apart, no escape codes
    assert "\x1b" not in out and frames[-1] == "", out
    assert len(frames) >= 2, out
    assert all(f.startswith(f"job {job_id}: stopping, ") for f in frames[:-1]), out  # a node that left: fewer
    gone = status(launcher, job_id)
    assert gone.returncode == 1 and "is not running" in gone.stderr

    chief, worker = read_events(logs / "events.jsonl"), read_events(logs / "events-node-1.jsonl")
    assert {e["node"] for e in worker} == {1} and {e["job"] for e in chief + worker} == {data["job"]}
    for events in (chief, worker):
        assert kinds(events)[0] == "job_planned" and kinds(events)[-1] == "job_finished"
        assert kinds(events)[-2] == "root_cause" and events[-1]["details"]["exit_code"] == 7
        assert events[-2]["details"]["what"] == "rank 3 on node 1 (127.0.0.2) exited with code 7"
        assert [e["time"] for e in events] == sorted(e["time"] for e in events)
        assert index(events, "launcher_started") < index(events, "stop_requested")
    assert chief[index(chief, "node_joined")]["node"] == 1
    for events, ranks in ((chief, (0, 1)), (worker, (2, 3))):
        for rank in ranks:
            assert kinds(events, rank)[:3] == ["rank_registered", "rank_started", "rank_exited"], events
    failed = worker[index(worker, "rank_exited", 3)]
    assert failed["details"]["code"] == 7 and failed["details"]["stopped"] is False
    assert index(worker, "rank_exited", 3) < index(worker, "failure", 3) < index(worker, "stop_requested")
    # The worker's own rank failed, but it stops when the chief says (after the survivors' stacks are taken)
    assert worker[index(worker, "stop_requested")]["details"]["reason"] == "chief"
    assert chief[index(chief, "stop_requested")]["details"]["reason"] == "failure"  # the worker's, passed on
    assert worker[index(worker, "rank_exited", 2)]["details"]["stopped"] is True


@pytest.mark.timeout(240)
def test_sixteen_ranks_printing_the_same_warning_make_one_console_line_and_complete_logs(
        launcher: Launcher, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    job = launcher.start("--layer", "torchrun", "--nproc-per-node", "16", "--master-port", str(free_port()),
                         "--dedupe", "--dedupe-window", "60", "--log-dir", str(logs), RANKS, env={"SAME": "3"})
    done = job.wait(200)
    assert done.returncode == 0, done.output
    out = done.stdout
    for i in range(3):
        line = f"warning: the same on every rank, {i}"
        assert out.count(line) == 1, out
        assert f"[ranks=0-15] {line}\n" in out, out
    assert out.count(" started pid=") == 16  # different on every rank: never folded
    for rank in range(16):
        log = (logs / f"rank-{rank}.log").read_text().splitlines()
        assert log[:3] == [f"[rank={rank}] warning: the same on every rank, {i}" for i in range(3)]
        assert log[-1] == f"[rank={rank}] rank {rank} done"


@pytest.mark.timeout(120)
def test_one_node_status_and_a_prefix_with_the_node_and_host(launcher: Launcher) -> None:
    job_id = f"test-{uuid.uuid4().hex[:8]}"
    job = launcher.start("--layer", "torchrun", "--nproc-per-node", "2", "--master-port", str(free_port()),
                         "--job-id", job_id, "--prefix", "{rank}@{host}/{node}: ", "--ranks", "1", RANKS,
                         env={"SLEEP": "300"})
    job.wait_for_output("1@127.0.0.1/0: rank 1 sleeping", timeout=90)
    asked = status(launcher, job_id, "--format", "json")
    assert asked.returncode == 0, asked.stderr
    (node,) = json.loads(asked.stdout)["nodes"]
    assert node["phase"] == "running" and node["root_cause"] is None and node["answered_here"]
    assert [(r["rank"], r["host"]) for r in node["ranks"]] == [(0, "127.0.0.1"), (1, "127.0.0.1")]
    for r in node["ranks"]:  # rank 0 is kept off the console, not out of the status
        assert b"ranks.py" in Path(f"/proc/{r['pid']}/cmdline").read_bytes()
    job.send_signal(2)
    done = job.wait(60)
    assert done.returncode == 130, done.output
    assert "1@127.0.0.1/0: rank 1 interrupted\n" in done.stdout and "rank 0" not in done.stdout, done.output
    gone = status(launcher, job_id)
    assert gone.returncode == 1, gone.stderr  # other jobs of this user may run here: they are named after it
    assert gone.stderr.startswith(f"detlaunch: job {job_id} is not running on this node"), gone.stderr


def test_the_wrapper_alone_fills_in_the_prefix(real_processes: None) -> None:
    import socket

    wrapper = paths.CORE / "detlaunch" / "rank" / "wrapper.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DETLAUNCH_")}
    out = subprocess.run([sys.executable, "-S", str(wrapper), "--rank", "5", "--prefix", "<{rank} {host}> ", "--",
                          "printf", "a\\nb\\r"], env=env, capture_output=True, timeout=30)
    host = socket.gethostname().encode()
    assert out.returncode == 0 and out.stdout == b"<5 %s> a\n<5 %s> b\r" % (host, host), out
