"""Scale, for real on this machine: 32 nodes (127.0.0.1-127.0.0.32, one `detlaunch --layer direct` each,
one rank each), and 2 nodes x 64 ranks. Ranks do not import torch. Each test: every rank starts, a
rank on the last node fails, every node exits with its code and names it, and nothing is left (the
fixture). Latencies are printed for the record (bench/ measures them); bounds here are generous.
And a 1024-node chief whose hard open-files limit is too low: refused in one line.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.helpers import free_port
from support.jobs import SCRIPTS, Job, Launcher

pytestmark = pytest.mark.timeout(300)
RANKS = str(SCRIPTS / "ranks.py")


def start_job(launcher: Launcher, tmp_path: Path, nodes: int, slots: int) -> tuple[list[Job], Path]:
    """Start `nodes` detlaunch processes (workers first), the last rank waiting for a FIFO before it fails."""
    trigger = tmp_path / "trigger"
    os.mkfifo(trigger)
    last = nodes * slots - 1
    hosts = ",".join(f"127.0.0.{n + 1}:{slots}" for n in range(nodes))
    common = ["--layer", "direct", "--hosts", hosts, "--master-port", str(free_port()),
              "--link-port", str(free_port()), "--start-timeout", "120"]
    env = {"SLEEP": "300", "FAIL_RANK": str(last), "FAIL_CODE": "3", "TRIGGER": str(trigger)}
    jobs = {n: launcher.start(*common, "--node-rank", str(n), RANKS, env=env) for n in reversed(range(nodes))}
    return [jobs[n] for n in range(nodes)], trigger


def run_and_fail_the_last_rank(launcher: Launcher, tmp_path: Path, nodes: int, slots: int) -> None:
    started = time.monotonic()
    jobs, trigger = start_job(launcher, tmp_path, nodes, slots)
    last = nodes * slots - 1
    for rank in range(nodes * slots):
        words = "waiting" if rank == last else "sleeping"
        try:
            jobs[rank // slots].wait_for_output(f"[rank={rank}] rank {rank} {words}", timeout=180)
        except AssertionError as e:  # a node that failed to start says why in its own output
            others = "\n".join(f"--- node {n}:\n{job.read()[-3000:]}" for n, job in enumerate(jobs))
            raise AssertionError(f"{e}\n{others}") from None
    up = time.monotonic() - started
    fired = time.monotonic()
    trigger.write_bytes(b"x")
    results = [job.wait(120) for job in jobs]
    gone = time.monotonic() - fired
    print(f"\n{nodes} node(s) x {slots} rank(s): all ranks up in {up:.1f} s; "
          f"from the trigger to every node exited: {gone:.2f} s")
    cause = f"detlaunch: job failed: rank {last} on node {nodes - 1} (127.0.0.{nodes}) exited with code 3"
    for n, r in enumerate(results):
        assert r.returncode == 3, f"node {n}:\n{r.output}"
        assert cause in r.stderr.splitlines(), f"node {n}:\n{r.stderr}"
    assert gone < 60
    assert launcher.leftovers(settle=15) == []


def test_32_nodes_one_rank_each(launcher: Launcher, tmp_path: Path) -> None:
    run_and_fail_the_last_rank(launcher, tmp_path, nodes=32, slots=1)


def test_2_nodes_64_ranks_each(launcher: Launcher, tmp_path: Path) -> None:
    run_and_fail_the_last_rank(launcher, tmp_path, nodes=2, slots=64)


def test_a_stopped_node_does_not_hold_back_the_verdict_for_the_others(launcher: Launcher, tmp_path: Path) -> None:
    """3 nodes; node 1's supervisor is SIGSTOPped, then rank 2 (node 2) fails: the chief stops the job at
    once, tells node 2, loses node 1 after 5 heartbeats, and exits with rank 2's code; so does node 2."""
    jobs, trigger = start_job(launcher, tmp_path, nodes=3, slots=1)
    for rank in range(3):
        jobs[rank].wait_for_output(f"[rank={rank}] rank {rank} {'waiting' if rank == 2 else 'sleeping'}", timeout=120)
    supervisor = psutil.Process(jobs[1].proc.pid).children()[0]  # pid 1 of node 1's PID namespace
    supervisor.suspend()
    try:
        fired = time.monotonic()
        trigger.write_bytes(b"x")
        jobs[0].wait_for_output("rank 2 on node 2 (127.0.0.3) exited with code 3: stopping the job", timeout=30)
        stopping = time.monotonic() - fired
        chief, third = jobs[0].wait(60), jobs[2].wait(60)
    finally:
        supervisor.resume()
    cause = "detlaunch: job failed: rank 2 on node 2 (127.0.0.3) exited with code 3"
    assert (chief.returncode, third.returncode) == (3, 3), chief.output + third.output
    assert cause in chief.stderr.splitlines() and cause in third.stderr.splitlines(), chief.stderr + third.stderr
    assert "rank 0 (node 0): killed by SIGTERM (stopped by detlaunch)" in chief.stderr, chief.stderr
    print(f"\nthe chief stopped the job {stopping:.2f} s after the failure, node 1 stopped all along")
    assert stopping < 10
    assert jobs[1].wait(60).returncode != 0


def test_a_chief_whose_hard_open_files_limit_is_too_low_is_refused_in_one_line(launcher: Launcher) -> None:
    """1024 nodes need a socket each on the chief: under `ulimit -n 256` (hard), detlaunch says so and exits."""
    hosts = ",".join(["127.0.0.1:1", *(f"127.21.{i // 250}.{i % 250 + 1}:1" for i in range(1023))])
    low_limit = [sys.executable, "-c", "import os, resource, sys; "
                 "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)); os.execvp(sys.argv[1], sys.argv[1:])"]
    r = launcher.start("--layer", "direct", "--hosts", hosts, "--node-rank", "0", "--master-port",
                       str(free_port()), RANKS, prefix=low_limit).wait(60)
    assert r.returncode == 1, r.output
    assert r.stderr.splitlines() == [
        "detlaunch: error: this job needs 1091 open files on the chief (one per node, and its own), but the limit is "
        "256 (ulimit -Hn): raise it, or run fewer nodes per chief"], r.output
    assert r.stdout == ""
