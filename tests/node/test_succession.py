"""The chief is no single point of failure: its detlaunch is SIGKILLed mid-training and the job goes on.

One real job of N nodes and 1 spare on 127.0.0.1-N+1 (gloo collectives, resume from checkpoint): 4 nodes
under --layer direct and 3 under --layer torchrun, started with torchrun-style flags (each node knows only
the chief's address: the others' come from the chief's membership), torchrun's ranks finding rank 0 at
MASTER_ADDR (it must follow rank 0 to its new host); and 3 under --layer horovod, from a host list (the last
host is the spare), whose horovodrun runs on the chief and starts every rank over the nodes' per-job sshd:
the successor must start it with -H naming itself (rank 0), the spare in its old place (rank 1) and node 2
(rank 2), and the spare's running rank 1 shows it did (only the chief's horovodrun starts ranks). Node 2's
rank hangs in step 3, so every rank has saved step 2 and the job is mid-run; then node 0's detlaunch is
SIGKILLed. Node 1, the lowest surviving node rank,
becomes the chief (node rank 0, global rank 0, MASTER_ADDR); the other nodes and the spare dial it with the
job's secret; a majority is there, so the job goes on; the spare takes the place node 1 left; attempt 2
resumes at step 2 and every surviving node ends 0, with the restart state carried over (the attempt
number, the lost host in the exclusion file) and the event log going on. Nothing is left on any node.
A silent chief, a partition and two chiefs lost one after the other: test_partition.py.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from support.helpers import free_port, rank_lines
from support.jobs import Launcher
from test_restarts import DDP, HVD, train_args

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(("layer", "n"), [("direct", 4), ("torchrun", 3), ("horovod", 3)])
def test_the_chief_is_lost_mid_training_and_the_lowest_surviving_node_takes_over(
        launcher: Launcher, tmp_path: Path, layer: str, n: int) -> None:
    excluded = tmp_path / "excluded-hosts"
    if layer == "horovod":  # the host list's last host is the spare; horovodrun runs on the chief, over sshd.
        # --network-interface: horovodrun's own search for one, over ssh on every node, costs CPU seconds a start
        shape = ["--hosts", ",".join(f"127.0.0.{i}:1" for i in range(1, n + 2)), "--ssh-port",
                 str(free_port("127.0.0.2")), "--network-interface", "lo"]
    else:
        shape = ["--nnodes", str(n), "--nproc-per-node", "1", "--master-addr", "127.0.0.1"]
    common = ["--layer", layer, *shape, "--spares", "1", "--master-port", str(free_port()), "--max-restarts", "1",
              "--restart-backoff", "0", "--heartbeat", "1", "--job-id", f"succession-{layer}-{os.getpid()}",
              "--exclude-hosts", str(excluded), "--log-dir", str(tmp_path / "logs")]
    script = train_args(tmp_path, HVD if layer == "horovod" else DDP, "--crash-step", "3", "--crash-rank", "2",
                        "--crash-how", "hang")
    nodes = [launcher.start(*common, "--node-rank", str(i),
                            *([] if layer == "horovod" else ["--node-addr", f"127.0.0.{i + 1}"]), *script)
             for i in range(n + 1)]
    chief, spare = nodes[0], nodes[n]
    spare.wait_for_output(f"detlaunch: spare node {n}: joined the job; it runs no rank", timeout=60)
    nodes[2].wait_for_output("rank 2 attempt 1 fails at step 3 (hang)", timeout=150)
    chief.send_signal(signal.SIGKILL)
    try:
        done = [job.wait(180) for job in nodes[1:]]
    except AssertionError as e:  # every node's output, to see where the succession stopped
        raise AssertionError(f"{e}" + "".join(f"\n--- node {i}:\n{job.read()}" for i, job in enumerate(nodes))) \
            from None
    chief.wait(60)
    assert [d.returncode for d in done] == [0] * n, "\n".join(d.output for d in done)
    rs, others, rp = done[0], done[1:-1], done[-1]
    lost = "detlaunch: lost the chief, node 0 (127.0.0.1): "
    for d, who in ((rs, "this node"), *((d, "node 1 (127.0.0.2)") for d in others)):
        said = [line for line in d.stderr.splitlines() if line.startswith(lost)]  # as it happens, on every survivor
        assert len(said) == 1 and said[0].endswith(f": {who} takes over as the chief (node rank 0); attempt 2 "
                                                   "follows"), d.stderr
    assert f"detlaunch: {n - 1} of the last attempt's {n} nodes are here (a majority): the job goes on" in rs.stderr
    assert f"detlaunch: spare node {n} (127.0.0.{n + 1}) takes the place of node 1 (127.0.0.1)" in rs.stderr, rs.stderr
    assert "waits for node 1 (127.0.0.2), its successor" in rp.stderr and \
           f"detlaunch: spare node {n}: takes node 1's place" in rp.stderr, rp.stderr
    # The successor runs global rank 0 (MASTER_ADDR moved with it), the spare rank 1: resumed from step 2.
    for d, rank in ((rs, 0), (rp, 1), *((d, i) for i, d in enumerate(others, start=2))):
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
