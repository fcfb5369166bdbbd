"""Spare nodes: a lost node's place goes to a spare at once, the job resumes there, its host is kept out.

Real jobs of 3 nodes and 1 spare on 127.0.0.1-4 (gloo collectives, resume from checkpoint): the
worker node 2's detlaunch is SIGKILLed (its link closes) or SIGSTOPped (its link goes silent) while its
rank is mid-run; the chief gives node 2's place to spare node 3 with no wait for the dead machine,
every global rank keeps its number, the lost host goes into the exclusion file, and nothing is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from support.helpers import free_port, rank_lines
from support.jobs import EXAMPLES, Job, Launcher
from test_restarts import DDP, HVD, train_args

pytestmark = pytest.mark.timeout(300)


def spare_job(launcher: Launcher, tmp_path: Path, layer: str, *extra: str) -> tuple[list[str], list[str], Path]:
    excluded = tmp_path / "excluded-hosts"
    excluded.write_text("# hosts kept out\n10.9.9.9\n")
    if layer in ("horovod", "deepspeed"):  # the host list's last host is the spare; the chief's launcher
        # reaches the other nodes over their per-job sshd
        shape = ["--hosts", ",".join(f"127.0.0.{n}:1" for n in range(1, 5)), "--ssh-port", str(free_port("127.0.0.2"))]
    else:
        shape = ["--nnodes", "3", "--nproc-per-node", "1", "--master-addr", "127.0.0.1"]
    common = ["--layer", layer, *shape, "--spares", "1", "--master-port", str(free_port()), "--max-restarts", "1",
              "--job-id", f"spares-{tmp_path.name[-12:].strip('_')}-{os.getpid()}",
              "--restart-backoff", "0", "--exclude-hosts", str(excluded), "--log-dir", str(tmp_path / "logs"), *extra]
    # Node 2's rank hangs in step 3 of the first attempt: every rank saved step 2, and the job is mid-run.
    script = train_args(tmp_path, HVD if layer == "horovod" else DDP, "--crash-step", "3", "--crash-rank", "2",
                        "--crash-how", "hang")
    return common, script, excluded


def node(launcher: Launcher, common: list[str], script: list[str], n: int) -> Job:
    where = [] if "--hosts" in common else ["--node-addr", f"127.0.0.{n + 1}"]
    env = {"DS_ACCELERATOR": "cpu"} if "deepspeed" in common else None
    return launcher.start(*common, "--node-rank", str(n), *where, *script, env=env)


@pytest.mark.parametrize(("layer", "how"), [("torchrun", signal.SIGKILL), ("direct", signal.SIGSTOP),
                                             ("horovod", signal.SIGKILL), ("deepspeed", signal.SIGKILL)])
def test_a_lost_node_is_replaced_by_the_spare_and_the_job_resumes_there(
        launcher: Launcher, tmp_path: Path, layer: str, how: signal.Signals) -> None:
    extra = ("--heartbeat", "0.2") if how == signal.SIGSTOP else ()
    common, script, excluded = spare_job(launcher, tmp_path, layer, *extra)
    chief, survivor, lost, spare = (node(launcher, common, script, n) for n in range(4))
    spare.wait_for_output("detlaunch: spare node 3: joined the job; it runs no rank", timeout=60)
    lost.wait_for_output("rank 2 attempt 1 fails at step 3 (hang)", timeout=150)
    if layer == "direct":  # `detlaunch status` shows the spare waiting (the chief's part of the answer)
        job = common[common.index("--job-id") + 1]
        shown = subprocess.run([sys.executable, "-m", "detlaunch", "status", job], env=launcher.env,
                               capture_output=True, text=True, timeout=30)
        assert "spares: node 3 (127.0.0.4) waiting" in shown.stdout.splitlines(), shown.stdout + shown.stderr
    if how == signal.SIGSTOP:  # the node's supervisor (pid 1 of its PID namespace) stops answering
        psutil.Process(lost.proc.pid).children()[0].suspend()
    else:
        lost.send_signal(how)
    try:
        rc, rs, rp = chief.wait(180), survivor.wait(60), spare.wait(60)
    finally:
        if how == signal.SIGSTOP:  # the silent node: stopped until the test ends it (its namespace with it)
            lost.send_signal(signal.SIGKILL)
    assert (rc.returncode, rs.returncode, rp.returncode) == (0, 0, 0), rc.output + rs.output + rp.output
    why = "its detlaunch closed the connection without saying goodbye" if how == signal.SIGKILL else \
        "no heartbeat for 1 s"
    assert f"detlaunch: lost node 2 (127.0.0.3): {why}: stopping the job" in rc.stderr, rc.stderr
    assert "detlaunch: spare node 3 (127.0.0.4) takes the place of node 2 (127.0.0.3)" in rc.stderr, rc.stderr
    assert "detlaunch: spare node 3: takes node 2's place" in rp.stderr, rp.stderr
    # Every global rank keeps its number: the spare runs rank 2, resumed from the checkpoint of step 2.
    for done, rank in ((rc, 0), (rs, 1), (rp, 2)):
        lines = rank_lines(done.stdout, rank)
        assert f"rank {rank} attempt 2 starts at step 2" in lines, done.output
        assert lines[-1].startswith(f"rank {rank} done: 4 steps, weights "), done.output
    assert rank_lines(rp.stdout, 2)[0] == "rank 2 attempt 2 starts at step 2", rp.output  # none before it
    kept_out = excluded.read_text().splitlines()
    assert kept_out[:2] == ["# hosts kept out", "10.9.9.9"] and len(kept_out) == 3, kept_out
    assert kept_out[2].startswith("127.0.0.3  # lost ") and kept_out[2].endswith(why), kept_out
    events = [json.loads(line) for line in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    kinds = [(e["kind"], e["node"], e["details"].get("host")) for e in events]
    assert ("spare_joined", 3, "127.0.0.4") in kinds
    assert ("spare_promoted", 2, "127.0.0.4") in kinds, kinds
    assert "node_excluded" not in {k for k, _, _ in kinds}, kinds  # lost once: it may serve again (twice: out)


def test_a_node_on_an_excluded_host_takes_no_part_and_spares_need_restarts(launcher: Launcher,
                                                                           tmp_path: Path) -> None:
    excluded, script = tmp_path / "excluded", tmp_path / "train.py"
    script.write_text("print('never run')\n")
    excluded.write_text("127.0.0.2  # its NIC flaps (the operator)\n")
    args = ["--layer", "direct", "--nnodes", "2", "--spares", "1", "--master-addr", "127.0.0.1",
            "--exclude-hosts", str(excluded), "--max-node-restarts", "1"]
    r = launcher.run(*args, "--node-rank", "1", "--node-addr", "127.0.0.2", "--dry-run", str(script), timeout=60)
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"detlaunch: error: this node's host 127.0.0.2 is in --exclude-hosts {excluded}: it takes no part in the "
        "job (with --spares, a spare takes its place)"], r.output
    r = launcher.run(*args[:-2], "--node-rank", "2", "--node-addr", "127.0.0.3", "--dry-run", str(script), timeout=60)
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "detlaunch: error: --spares 1: a spare takes a lost node's place at the next attempt, and this job has "
        "none: add --max-node-restarts N (or --max-restarts N)"], r.output
    r = launcher.run(*args, "--node-rank", "2", "--node-addr", "127.0.0.3", "--dry-run", str(script), timeout=60)
    assert r.returncode == 0, r.output
    assert r.stdout.splitlines()[0] == "spare node 2 (127.0.0.3): runs no rank until it takes a lost node's " \
                                       "place; as node 1 it would run:", r.stdout
    r = launcher.run(*args, "--node-rank", "0", "--node-addr", "127.0.0.1", "--dry-run", str(script), timeout=60)
    assert "├── admits 1 spare node(s) (node rank 2), each to take a lost node's place" in r.stdout, r.output


def test_a_node_on_a_host_excluded_at_the_start_is_replaced_before_the_first_attempt(
        launcher: Launcher, tmp_path: Path) -> None:
    excluded = tmp_path / "excluded"
    excluded.write_text("127.0.0.2\n")
    common = ["--layer", "direct", "--hosts", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1", "--spares", "1",
              "--master-port", str(free_port()), "--max-node-restarts", "1", "--exclude-hosts", str(excluded),
              str(EXAMPLES / "allreduce.py")]
    chief = launcher.start(*common[:-1], "--node-rank", "0", common[-1])
    refused = launcher.run(*common[:-1], "--node-rank", "1", common[-1], timeout=60)
    spare = launcher.start(*common[:-1], "--node-rank", "2", common[-1])
    rc, rs = chief.wait(120), spare.wait(60)
    assert refused.returncode == 2 and "is in --exclude-hosts" in refused.stderr, refused.output
    assert (rc.returncode, rs.returncode) == (0, 0), rc.output + rs.output
    assert "detlaunch: spare node 2 (127.0.0.3) takes the place of node 1 (127.0.0.2)" in rc.stderr, rc.stderr
    assert rank_lines(rs.stdout, 1), rs.output  # the spare ran rank 1, in the first attempt
    assert "detlaunch: 1 attempt(s):" in rc.stderr and "attempt 1: finished" in rc.stderr, rc.stderr


SLOW_STOP = """\
import os, signal, sys, time
rank, attempt = int(os.environ["RANK"]), int(os.environ["DETLAUNCH_RESTART_COUNT"]) + 1
if attempt == 2:
    print(f"rank {rank} attempt 2 runs", flush=True)
    sys.exit(0)
def checkpoint_then_exit(signum, frame):
    time.sleep(6)  # a checkpoint written on the way out
    sys.exit(143)
signal.signal(signal.SIGTERM, checkpoint_then_exit)
print(f"rank {rank} ready", flush=True)
time.sleep(300)
"""


def test_the_spare_is_sent_at_the_loss_and_joins_while_the_attempt_stops(launcher: Launcher, tmp_path: Path) -> None:
    """Not once the attempt has stopped: the chief's rank takes 6 s to stop here (a checkpoint on SIGTERM), and
    the spare, sent as node 1 is lost, has joined in its place before that: the next attempt waits for no one."""
    script = tmp_path / "slow_stop.py"
    script.write_text(SLOW_STOP)
    common = ["--layer", "direct", "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--spares", "1", "--master-port", str(free_port()), "--max-node-restarts", "1", "--restart-backoff", "0",
              "--job-id", f"early-{tmp_path.name[-12:].strip('_')}-{os.getpid()}"]
    chief, lost, spare = (launcher.start(*common, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}",
                                         str(script)) for n in range(3))
    spare.wait_for_output("detlaunch: spare node 2: joined the job; it runs no rank", timeout=60)
    chief.wait_for_output("rank 0 ready", timeout=60)
    lost.wait_for_output("rank 1 ready", timeout=60)
    lost.send_signal(signal.SIGKILL)
    rc, rp = chief.wait(120), spare.wait(60)
    assert (rc.returncode, rp.returncode) == (0, 0), rc.output + rp.output
    said = [line.removeprefix("detlaunch: ") for line in rc.stderr.splitlines()]
    sent = said.index("spare node 2 (127.0.0.3) takes the place of node 1 (127.0.0.2)")
    failed = next(i for i, line in enumerate(said) if line.startswith("attempt 1 failed (lost node 1 (127.0.0.2)"))
    assert sent < failed, rc.stderr  # sent at the loss, before the attempt had stopped
    assert not [line for line in said if line.startswith("waiting for")], rc.stderr  # nothing to wait for
    assert "detlaunch: joined the job at attempt 2: waiting for the other nodes" in rp.stderr, rp.stderr
    assert rank_lines(rp.stdout, 1) == ["rank 1 attempt 2 runs"], rp.output
    assert "rank 0 attempt 2 runs" in rank_lines(rc.stdout, 0), rc.output
