"""A job that may shrink (--nnodes MIN:MAX), and a lost host that comes back as a spare.

One real job of 3 nodes on 127.0.0.1-3, `--nnodes 2:3`, no spare at the start (gloo collectives,
resume from checkpoint, `--layer direct`): node 2's detlaunch is SIGKILLed mid-run, no spare fills its
place, so the next attempt runs on 2 nodes (WORLD_SIZE 3 -> 2, GROUP_WORLD_SIZE 3 -> 2). Node 2's
detlaunch is started again on its host: its place is empty, so it joins as a spare. Then node 1's
detlaunch is SIGKILLed: the spare takes node 1's place, at its own address (127.0.0.3, node 1's from
then on), and the job ends 0, every attempt resumed from the checkpoint, nothing left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import free_port, rank_lines
from support.jobs import Launcher
from test_restarts import DDP, train_args

pytestmark = pytest.mark.timeout(300)


def world(rank: int, attempt: int, size: int, nodes: int, node: int) -> str:
    return (f"rank {rank} attempt {attempt} world WORLD_SIZE={size} GROUP_WORLD_SIZE={nodes} GROUP_RANK={node} "
            f"TORCHELASTIC_RESTART_COUNT={attempt - 1}")


def test_two_lost_nodes_the_job_shrinks_and_a_lost_host_comes_back_as_a_spare(launcher: Launcher,
                                                                             tmp_path: Path) -> None:
    job = f"shrink-{tmp_path.name[-12:].strip('_')}-{os.getpid()}"
    common = ["--layer", "direct", "--nnodes", "2:3", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--master-port", str(free_port()), "--max-node-restarts", "2", "--restart-backoff", "0",
              "--job-id", job, "--log-dir", str(tmp_path / "logs")]
    # Attempt 1: rank 2 (node 2) hangs in step 3; attempt 2: rank 1 (node 1). Every rank saved step 2.
    script = train_args(tmp_path, DDP, "--crash-step", "3", "--crash-at", "0:2,1:1", "--crash-how", "hang",
                        "--show-world")

    def node(n: int) -> list[str]:
        return [*common, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}", *script]

    chief, node1, node2 = (launcher.start(*node(n)) for n in range(3))
    node2.wait_for_output("rank 2 attempt 1 fails at step 3 (hang)", timeout=150)
    node2.send_signal(signal.SIGKILL)
    node1.wait_for_output("rank 1 attempt 2 fails at step 3 (hang)", timeout=150)
    shown = subprocess.run([sys.executable, "-m", "detlaunch", "status", job], env=launcher.env,
                           capture_output=True, text=True, timeout=30)
    assert "nodes: 2 of 3 (--nnodes 2:3); the places of node(s) 2 are empty" in shown.stdout.splitlines(), \
        shown.stdout + shown.stderr

    back = launcher.start(*node(2))  # node 2's host comes back: its place is empty, it waits as a spare
    back.wait_for_output("detlaunch: spare node 3: joined the job", timeout=60)
    node1.send_signal(signal.SIGKILL)
    rc, rb = chief.wait(180), back.wait(60)
    node1.wait(30)
    node2.wait(30)
    assert (rc.returncode, rb.returncode) == (0, 0), rc.output + rb.output
    assert "detlaunch: no spare for the place of node(s) 2 (127.0.0.3): attempt 2 runs on 2 node(s) of 3, " \
           "2 rank(s) (--nnodes 2:3; node and global ranks renumbered)" in rc.stderr, rc.stderr
    assert "detlaunch: node 2's place is taken (this node was lost): it joins the job again as spare node 3" \
        in rb.stderr, rb.stderr
    assert "detlaunch: spare node 3 (127.0.0.3) takes the place of node 1 (127.0.0.2)" in rc.stderr, rc.stderr
    # The world each attempt's ranks saw, as torchrun's elastic agent shows it; each resumed at step 2.
    chief_lines, back_lines = rank_lines(rc.stdout, 0), rank_lines(rb.stdout, 1)
    assert world(0, 1, 3, 3, 0) in chief_lines and world(0, 2, 2, 2, 0) in chief_lines, rc.output
    assert world(0, 3, 2, 2, 0) in chief_lines and world(1, 3, 2, 2, 1) in back_lines, rc.output + rb.output
    for lines, rank, out in ((chief_lines, 0, rc.output), (back_lines, 1, rb.output)):
        assert f"rank {rank} attempt 3 starts at step 2" in lines and lines[-1].startswith(f"rank {rank} done: 4 "), out
    assert "rank 0 attempt 2 starts at step 2" in chief_lines, rc.output
    events = [json.loads(line) for line in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    resized = [e["details"] for e in events if e["kind"] == "job_resized"]
    assert resized == [{"nodes": 2, "ranks": 2, "places": [0, 1]}], resized
    promoted = [(e["node"], e["details"]) for e in events if e["kind"] == "spare_promoted"]
    assert promoted == [(1, {"spare": 3, "host": "127.0.0.3", "replaces": "127.0.0.2"})], promoted
