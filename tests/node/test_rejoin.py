"""A lost node is retryable: its detlaunch SIGKILLed mid-run, the chief stops the job, counts the
attempt, and starts the next one once the node's new detlaunch (started again with the same
command, as a scheduler would) has joined; a node that never comes back ends the job after
--start-timeout with one line. Real 2-node torchrun jobs (gloo collectives, resume from checkpoint).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from support.helpers import free_port, rank_lines, report_line
from support.jobs import Job, Launcher
from test_restarts import DDP, WEIGHTS, attempt_lines, only_detlaunch_between_attempts, torchrun_nodes, train_args

pytestmark = pytest.mark.timeout(300)

# Rank 1 hangs after the barrier of step 3 on the first attempt: both ranks saved step 2, and the job
# is mid-run when the test SIGKILLs the worker node's detlaunch.
HANG = ("--crash-step", "3", "--crash-rank", "1", "--crash-how", "hang")


def kill_the_worker_mid_run(launcher: Launcher, tmp_path: Path, *extra: str,
                            layer: str = "torchrun") -> tuple[Job, list[str], list[str]]:
    """Start a 2-node job, SIGKILL the worker node's detlaunch mid-run; the chief then waits for it."""
    chief_args, worker_args = torchrun_nodes("--max-restarts", "1", "--restart-backoff", "0", *extra, layer=layer)
    script = train_args(tmp_path, DDP, *HANG)
    chief = launcher.start(*chief_args, *script)
    worker = launcher.start(*worker_args, *script)
    worker.wait_for_output("rank 1 attempt 1 fails at step 3 (hang)", timeout=150)
    worker.send_signal(signal.SIGKILL)
    assert worker.wait(30).returncode == -signal.SIGKILL
    chief.wait_for_output("detlaunch: waiting for node(s) 1 (127.0.0.2) to join again", timeout=60)
    only_detlaunch_between_attempts(launcher, [chief])  # the lost node's processes died with its detlaunch
    return chief, worker_args, script


def test_a_sigkilled_worker_node_started_again_rejoins_and_the_job_resumes(
        launcher: Launcher, tmp_path: Path) -> None:
    chief, worker_args, script = kill_the_worker_mid_run(launcher, tmp_path)
    worker = launcher.start(*worker_args, *script)  # the scheduler starts the node's detlaunch again
    rc, rw = chief.wait(180), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    lines = attempt_lines(rc.stderr)
    assert len(lines) == 3, lines
    assert lines[0].startswith("detlaunch:   attempt 1: node-lost after "), lines
    assert lines[0].endswith(": lost node 1 (127.0.0.2): its detlaunch closed the connection without saying "
                             "goodbye"), lines
    assert lines[1].startswith("detlaunch:     -> attempt 2 started"), lines
    assert lines[2].startswith("detlaunch:   attempt 2: finished after "), lines
    assert "detlaunch: attempt 1 failed (lost node 1 (127.0.0.2): its detlaunch closed the connection without " \
           "saying goodbye): restart 1 of 1 (a lost node: not counted against --max-restarts) in 0.0 s" in rc.stderr
    assert "detlaunch: every node is back: attempt 2 starts" in rc.stderr
    assert "detlaunch: joined the job at attempt 2: waiting for the other nodes" in rw.stderr
    # Both nodes' ranks see the restart count (the rejoined node's from the chief) and resume at step 2.
    assert "rank 0 attempt 2 starts at step 2" in rank_lines(rc.stdout, 0)
    assert rank_lines(rw.stdout, 1)[0] == "rank 1 attempt 2 starts at step 2"
    assert rank_lines(rc.stdout, 0)[-1] == f"rank 0 done: 4 steps, weights {WEIGHTS}"
    assert rank_lines(rw.stdout, 1)[-1] == f"rank 1 done: 4 steps, weights {WEIGHTS}"
    assert "detlaunch: job finished: 2 rank(s) exited 0" in rc.stderr


def test_a_lost_worker_node_that_never_comes_back_ends_the_job_after_the_start_timeout(
        launcher: Launcher, tmp_path: Path) -> None:
    # The timeout bounds the first start too (torch's imports on a loaded machine): 20 s, not less.
    chief, _, _ = kill_the_worker_mid_run(launcher, tmp_path, "--start-timeout", "20", layer="direct")
    rc = chief.wait(120)
    assert rc.returncode == 1, rc.output
    assert report_line(rc.stderr) == "detlaunch: job failed: lost node 1 (127.0.0.2): it did not join again " \
                                     "within 20 s (--start-timeout)"
    assert "attempt 2 starts" not in rc.stdout


def test_three_nodes_the_surviving_worker_waits_for_the_lost_one_then_all_resume(
        launcher: Launcher, tmp_path: Path) -> None:
    # The link's part, the same on every layer (the 2-node test above runs torchrun): --layer direct.
    common = ["--layer", "direct", "--nnodes", "3", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--master-port", str(free_port()), "--max-restarts", "1", "--restart-backoff", "0"]
    script = train_args(tmp_path, DDP, "--crash-step", "3", "--crash-rank", "2", "--crash-how", "hang")

    def node(n: int) -> Job:
        return launcher.start(*common, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}", *script)

    chief, survivor, lost = node(0), node(1), node(2)
    lost.wait_for_output("rank 2 attempt 1 fails at step 3 (hang)", timeout=150)
    lost.send_signal(signal.SIGKILL)
    lost.wait(30)
    survivor.wait_for_output("detlaunch: the chief restarts the job: attempt 2 once every lost node is back", 60)
    chief.wait_for_output("detlaunch: waiting for node(s) 2 (127.0.0.3) to join again", timeout=30)
    only_detlaunch_between_attempts(launcher, [chief, survivor])
    back = node(2)
    rc, rs, rb = chief.wait(180), survivor.wait(60), back.wait(60)
    assert (rc.returncode, rs.returncode, rb.returncode) == (0, 0, 0), rc.output + rs.output + rb.output
    assert len(attempt_lines(rc.stderr)) == 3 and "attempt 1: node-lost" in attempt_lines(rc.stderr)[0]
    finals = []
    for done, rank in ((rc, 0), (rs, 1), (rb, 2)):
        lines = rank_lines(done.stdout, rank)
        assert f"rank {rank} attempt 2 starts at step 2" in lines, lines
        assert lines[-1].startswith(f"rank {rank} done: 4 steps, weights "), lines
        finals.append(lines[-1].split("weights ")[1])
    assert len(set(finals)) == 1, finals  # DDP kept every rank's weights equal, through the restart


SLOW_TO_STOP = """
import os, signal, sys, time
rank, attempt = int(os.environ["RANK"]), int(os.environ["DETLAUNCH_RESTART_COUNT"])
def on_term(signum, frame):
    print(f"rank {rank} saving a checkpoint", flush=True)
    time.sleep(4)  # longer than the worker's 5 missed heartbeats of 0.5 s
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print(f"rank {rank} attempt {attempt + 1}", flush=True)
if attempt == 0 and rank == 1:
    time.sleep(0.5)
    sys.exit(3)
if attempt == 0:
    time.sleep(60)
print(f"rank {rank} done", flush=True)
"""


def test_a_worker_waits_for_the_verdict_while_the_chiefs_rank_takes_its_time_to_stop(
        launcher: Launcher, tmp_path: Path) -> None:
    """The worker said goodbye; the chief's rank saves a checkpoint on SIGTERM for longer than the
    worker's heartbeat window: the chief's heartbeats keep the worker waiting, and the restart happens."""
    script = tmp_path / "slow_to_stop.py"
    script.write_text(SLOW_TO_STOP)
    common = ["--layer", "direct", "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--master-port", str(free_port()), "--max-restarts", "1", "--restart-backoff", "0",
              "--heartbeat", "0.5", "--grace-period", "20"]
    events = tmp_path / "events.jsonl"
    chief = launcher.start(*common, "--node-rank", "0", "--events", str(events), str(script))
    worker = launcher.start(*common, "--node-rank", "1", "--node-addr", "127.0.0.2", str(script))
    rc, rw = chief.wait(120), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    assert rank_lines(rc.stdout, 0) == ["rank 0 attempt 1", "rank 0 saving a checkpoint", "rank 0 attempt 2",
                                        "rank 0 done"], rc.output
    assert rank_lines(rw.stdout, 1) == ["rank 1 attempt 1", "rank 1 attempt 2", "rank 1 done"], rw.output
    attempts = [(e["kind"], {k: v for k, v in e["details"].items() if k in ("attempt", "exit_code")})
                for e in map(json.loads, events.read_text().splitlines()) if e["kind"].startswith("attempt_")]
    assert attempts == [("attempt_started", {"attempt": 0}), ("attempt_ended", {"attempt": 0, "exit_code": 3}),
                        ("attempt_started", {"attempt": 1}), ("attempt_ended", {"attempt": 1, "exit_code": 0})]


def test_a_worker_node_lost_during_the_backoff_is_waited_for_and_the_job_resumes(
        launcher: Launcher, tmp_path: Path) -> None:
    """Nothing runs during the backoff; the worker's detlaunch is SIGKILLed then and started again:
    attempt 2 waits for it, as after a node lost mid-run, and the lost node costs no restart."""
    script = tmp_path / "slow_to_stop.py"
    script.write_text(SLOW_TO_STOP)  # rank 1 fails on attempt 1; rank 0 takes a while to stop
    common = ["--layer", "direct", "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--master-port", str(free_port()), "--max-restarts", "1", "--max-node-restarts", "0",
              "--restart-backoff", "12", "--restart-backoff-max", "12"]
    chief = launcher.start(*common, "--node-rank", "0", str(script))
    worker_args = [*common, "--node-rank", "1", "--node-addr", "127.0.0.2", str(script)]
    worker = launcher.start(*worker_args)
    worker.wait_for_output("detlaunch: the chief restarts the job: attempt 2 in", timeout=60)
    worker.send_signal(signal.SIGKILL)
    assert worker.wait(30).returncode == -signal.SIGKILL
    chief.wait_for_output("detlaunch: lost node 1 (127.0.0.2) while waiting to restart (its detlaunch closed the "
                          "connection without saying goodbye): attempt 2 waits for it to join again", timeout=30)
    only_detlaunch_between_attempts(launcher, [chief])
    back = launcher.start(*worker_args)  # the scheduler starts the node's detlaunch again
    rc, rb = chief.wait(120), back.wait(60)
    assert (rc.returncode, rb.returncode) == (0, 0), rc.output + rb.output
    lines = attempt_lines(rc.stderr)
    assert len(lines) == 3, lines
    assert lines[0].startswith("detlaunch:   attempt 1: rank-failed after ") and lines[0].endswith(
        "rank 1 on node 1 (127.0.0.2) exited with code 3"), lines
    assert lines[1].startswith("detlaunch:     -> attempt 2 started"), lines
    assert "detlaunch: joined the job at attempt 2: waiting for the other nodes" in rb.stderr
    assert rank_lines(rc.stdout, 0) == ["rank 0 attempt 1", "rank 0 saving a checkpoint", "rank 0 attempt 2",
                                        "rank 0 done"], rc.output
    assert rank_lines(rb.stdout, 1) == ["rank 1 attempt 2", "rank 1 done"], rb.output
    assert "detlaunch: job finished: 2 rank(s) exited 0" in rc.stderr
