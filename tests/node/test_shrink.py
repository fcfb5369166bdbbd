"""A job that may shrink (--nnodes MIN:MAX) and grows back, and lost hosts that come back as spares.

One real job of 3 nodes on 127.0.0.1-3, `--nnodes 2:3`, no spare at the start (gloo collectives,
resume from checkpoint, `--layer direct`), four attempts:

1. node 2's detlaunch is SIGKILLed mid-run; no spare fills its place, so
2. runs on 2 nodes (WORLD_SIZE 3 -> 2, GROUP_WORLD_SIZE 3 -> 2). Node 2's detlaunch is started again on
   its host: its place is empty, so it joins as a spare. Node 1's detlaunch is SIGKILLed: the spare takes
   node 1's place, at its own address (127.0.0.3, node 1's from then on);
3. runs on 2 nodes. Node 1's detlaunch is started again on its host: its place is taken, so it joins as a
   spare. The chief's rank is SIGKILLed (a failure, not a loss): the restart takes place 2 back for it;
4. runs on 3 nodes again (WORLD_SIZE 3), and the job ends 0, every attempt resumed from the checkpoint,
   nothing left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import descendants_where, free_port, rank_lines
from support.jobs import Launcher
from test_restarts import DDP, train_args

pytestmark = pytest.mark.timeout(300)


def world(rank: int, attempt: int, size: int, nodes: int, node: int) -> str:
    return (f"rank {rank} attempt {attempt} world WORLD_SIZE={size} GROUP_WORLD_SIZE={nodes} GROUP_RANK={node} "
            f"TORCHELASTIC_RESTART_COUNT={attempt - 1}")


def test_the_job_shrinks_lost_hosts_come_back_as_spares_and_it_grows_back_at_a_restart(launcher: Launcher,
                                                                             tmp_path: Path) -> None:
    job = f"shrink-{tmp_path.name[-12:].strip('_')}-{os.getpid()}"
    common = ["--layer", "direct", "--nnodes", "2:3", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--master-port", str(free_port()), "--max-node-restarts", "2", "--max-restarts", "1",
              "--restart-backoff", "0", "--job-id", job, "--log-dir", str(tmp_path / "logs")]
    # Rank 2 hangs in step 3 of attempt 1, rank 1 in attempt 2, rank 0 in attempt 3: every rank saved step 2.
    script = train_args(tmp_path, DDP, "--crash-step", "3", "--crash-at", "0:2,1:1,2:0", "--crash-how", "hang",
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

    back2 = launcher.start(*node(2))  # node 2's host comes back: its place is empty, it waits as a spare
    back2.wait_for_output("detlaunch: spare node 3: joined the job", timeout=60)
    node1.send_signal(signal.SIGKILL)
    chief.wait_for_output("rank 0 attempt 3 fails at step 3 (hang)", timeout=150)
    back1 = launcher.start(*node(1))  # node 1's host comes back: its place is taken, it waits as a spare
    back1.wait_for_output("detlaunch: spare node 4: joined the job", timeout=60)
    rank0 = descendants_where(chief.proc.pid, lambda p: "resume_ddp.py" in " ".join(p.cmdline()) and not {
        "detlaunch", "run_wrapper.py"} & {os.path.basename(a) for a in p.cmdline()[:3]})  # not detlaunch, nor wrapper
    assert len(rank0) == 1, [p.cmdline() for p in rank0]
    rank0[0].send_signal(signal.SIGKILL)
    rc, r2, r1 = chief.wait(180), back2.wait(60), back1.wait(60)
    node1.wait(30)
    node2.wait(30)
    assert (rc.returncode, r2.returncode, r1.returncode) == (0, 0, 0), rc.output + r2.output + r1.output
    assert "detlaunch: no spare for the place of node(s) 2 (127.0.0.3): attempt 2 runs on 2 node(s) of 3, " \
           "2 rank(s) (--nnodes 2:3; node and global ranks renumbered)" in rc.stderr, rc.stderr
    for back, n, spare in ((r2, 2, 3), (r1, 1, 4)):
        assert f"detlaunch: node {n}'s place is taken (this node was lost): it joins the job again as spare " \
               f"node {spare}" in back.stderr, back.stderr
    assert "detlaunch: spare node 3 (127.0.0.3) takes the place of node 1 (127.0.0.2)" in rc.stderr, rc.stderr
    assert "detlaunch: attempt 4 takes back the place of node(s) 2: it runs on 3 node(s) of 3, 3 rank(s), a spare " \
           "in each" in rc.stderr, rc.stderr
    assert "detlaunch: spare node 4 (127.0.0.2) takes the place of node 2 (127.0.0.3)" in rc.stderr, rc.stderr
    # The world each attempt's ranks saw, as torchrun's elastic agent shows it; each resumed at step 2.
    lines0, lines1, lines2 = rank_lines(rc.stdout, 0), rank_lines(r2.stdout, 1), rank_lines(r1.stdout, 2)
    assert [world(0, a, *shape) in lines0 for a, shape in ((1, (3, 3, 0)), (2, (2, 2, 0)), (3, (2, 2, 0)),
                                                           (4, (3, 3, 0)))] == [True] * 4, rc.output
    assert world(1, 3, 2, 2, 1) in lines1 and world(1, 4, 3, 3, 1) in lines1, r2.output
    assert world(2, 4, 3, 3, 2) in lines2, r1.output
    for lines, rank, attempts, out in ((lines0, 0, (2, 3, 4), rc.output), (lines1, 1, (3, 4), r2.output),
                                       (lines2, 2, (4,), r1.output)):
        assert all(f"rank {rank} attempt {a} starts at step 2" in lines for a in attempts), out
        assert lines[-1].startswith(f"rank {rank} done: 4 steps"), out
    events = [json.loads(line) for line in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    resized = [e["details"] for e in events if e["kind"] == "job_resized"]
    assert resized == [{"nodes": 2, "ranks": 2, "places": [0, 1]}, {"nodes": 3, "ranks": 3, "places": [0, 1, 2]}], \
        resized
    promoted = [(e["node"], e["details"]) for e in events if e["kind"] == "spare_promoted"]
    assert promoted == [(1, {"spare": 3, "host": "127.0.0.3", "replaces": "127.0.0.2"}),
                        (2, {"spare": 4, "host": "127.0.0.2", "replaces": "127.0.0.3"})], promoted
