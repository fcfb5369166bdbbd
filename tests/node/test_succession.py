"""The chief is no single point of failure: its detlaunch is SIGKILLed mid-training and the job goes on.

One real job of 4 nodes and 1 spare on 127.0.0.1-5 (--layer direct, gloo collectives, resume from
checkpoint), started with torchrun-style flags (each node knows only the chief's address: the others'
come from the chief's membership). Node 2's rank hangs in step 3, so every rank has saved step 2 and the
job is mid-run; then node 0's detlaunch is SIGKILLed. Node 1, the lowest surviving node rank, becomes
the chief (node rank 0, global rank 0, MASTER_ADDR); nodes 2 and 3 and the spare dial it with the job's
secret; a majority (3 of 4) is there, so the job goes on; the spare takes the place node 1 left; attempt
2 resumes at step 2 and every surviving node ends 0, with the restart state carried over (the attempt
number, the lost host in the exclusion file) and the event log going on. Nothing is left on any node.
The same with a silent chief (SIGSTOP) is written but not run (see the parametrization).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil
import pytest
from support.helpers import free_port, rank_lines
from support.jobs import Launcher
from test_restarts import DDP, train_args

pytestmark = pytest.mark.timeout(300)


# SIGSTOP (a silent chief that comes back) is not run here: on one machine, the stopped chief's rank 0 keeps its
# store on the master port's wildcard address, so the successor's rank 0 (127.0.0.2) cannot have it (docs/RESTARTS.md).
@pytest.mark.parametrize("how", [signal.SIGKILL], ids=["closed"])
def test_the_chief_is_lost_mid_training_and_the_lowest_surviving_node_takes_over(
        launcher: Launcher, tmp_path: Path, how: signal.Signals) -> None:
    excluded = tmp_path / "excluded-hosts"
    common = ["--layer", "direct", "--nnodes", "4", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--spares", "1", "--master-port", str(free_port()), "--max-restarts", "1", "--restart-backoff", "0",
              "--heartbeat", "0.2" if how == signal.SIGSTOP else "1", "--job-id", f"succession-{os.getpid()}",
              "--exclude-hosts", str(excluded),
              "--log-dir", str(tmp_path / "logs")]
    script = train_args(tmp_path, DDP, "--crash-step", "3", "--crash-rank", "2", "--crash-how", "hang")
    nodes = [launcher.start(*common, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}", *script)
             for n in range(5)]
    chief, spare = nodes[0], nodes[4]
    spare.wait_for_output("detlaunch: spare node 4: joined the job; it runs no rank", timeout=60)
    nodes[2].wait_for_output("rank 2 attempt 1 fails at step 3 (hang)", timeout=150)
    if how == signal.SIGSTOP:  # the chief's supervisor (pid 1 of its PID namespace) stops answering
        stopped = psutil.Process(chief.proc.pid).children()[0]
        stopped.suspend()
    else:
        chief.send_signal(how)
    try:
        done = [job.wait(180) for job in nodes[1:]]
    except AssertionError as e:  # every node's output, to see where the succession stopped
        raise AssertionError(f"{e}" + "".join(f"\n--- node {n}:\n{job.read()}" for n, job in enumerate(nodes))) \
            from None
    finally:
        if how == signal.SIGSTOP:  # back after the succession: it learns it was replaced, and leaves
            stopped.resume()
    old = chief.wait(60)
    assert [d.returncode for d in done] == [0, 0, 0, 0], "\n".join(d.output for d in done)
    if how == signal.SIGSTOP:
        assert old.returncode == 1 and "so this chief leaves the job" in old.stderr, old.output
    rs, r2, r3, rp = done
    lost = "detlaunch: lost the chief, node 0 (127.0.0.1): "
    for d, who in ((rs, "this node"), (r2, "node 1 (127.0.0.2)"), (r3, "node 1 (127.0.0.2)")):
        said = [line for line in d.stderr.splitlines() if line.startswith(lost)]  # as it happens, on every survivor
        assert len(said) == 1 and said[0].endswith(f": {who} takes over as the chief (node rank 0); attempt 2 "
                                                   "follows"), d.stderr
    assert "detlaunch: 3 of the last attempt's 4 nodes are here (a majority): the job goes on" in rs.stderr
    assert "detlaunch: spare node 4 (127.0.0.5) takes the place of node 1 (127.0.0.1)" in rs.stderr, rs.stderr
    assert "waits for node 1 (127.0.0.2), its successor" in rp.stderr and \
           "detlaunch: spare node 4: takes node 1's place" in rp.stderr, rp.stderr
    # The successor runs global rank 0 (MASTER_ADDR moved with it), the spare rank 1: resumed from step 2.
    for d, rank in ((rs, 0), (rp, 1), (r2, 2), (r3, 3)):
        lines = rank_lines(d.stdout, rank)
        assert f"rank {rank} attempt 2 starts at step 2" in lines, d.output
        assert lines[-1].startswith(f"rank {rank} done: 4 steps, weights "), d.output
    assert "detlaunch: 2 attempt(s):" in rs.stderr and "detlaunch:   attempt 1: node-lost: lost the chief, node 0 " \
        "(127.0.0.1)" in rs.stderr and "detlaunch:   attempt 2: finished" in rs.stderr, rs.stderr  # carried over
    kept_out = excluded.read_text().splitlines()
    assert len(kept_out) == 1 and kept_out[0].startswith("127.0.0.1  # lost "), kept_out
    events = [json.loads(line) for line in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    changed = [e for e in events if e["kind"] == "chief_changed"]
    assert len(changed) == 1 and changed[0]["details"]["host"] == "127.0.0.2" and \
        changed[0]["details"]["replaces"] == "127.0.0.1" and changed[0]["details"]["successor"] == 1, changed
    finished = [e for e in events if e["kind"] == "job_finished"]  # the successor's: the job's one end
    assert [e["kind"] for e in events].count("job_planned") == 1 and len(finished) == 1, events
    assert finished[0]["details"]["exit_code"] == 0 and finished[0]["node"] == 0
