"""The chief lost for real, twice, on machines with network stacks of their own (support/netns.py).

One job of 5 nodes and 3 spares (--layer direct, gloo, resume from checkpoint), each in a network namespace
on one switch, every node with an exclusion file of its own (the first chief's keeps a host out, an
operator's line). Global rank 2 hangs in step 3 of attempts 1 and 2, so the job is mid-run when:

1. a partition cuts the chief and node 1, its successor, off from the rest (2 against 3): on the majority
   side nobody reaches node 1, so node 2 takes over; node 1, absent, is a lost node; two spares fill
   places 1 and 2, attempt 2 runs; the minority side ends: the chief leaves (it lost a majority of its
   nodes: no second chief) and node 1 with it, each with one line naming what could not be reached, exit 1;
2. the new chief (node 2's machine) is stopped (SIGSTOP): the spare in place 1 takes over, the last spare
   fills its place, attempt 3 resumes at step 2 and ends 0 on every surviving node; the stopped chief,
   woken after that succession, learns it was replaced and leaves (one line, exit 1), its master port
   being its own machine's;
3. what the chiefs knew carries over exactly: the report's three attempts, each successor's restart
   count (--max-node-restarts 2: the second succession uses the last), the exclusion lines (the
   operator's host, both lost chiefs and node 1, once each), one event log. Nothing is left on any machine.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import psutil
import pytest
from detlaunch.testing.runner import Completed
from support.helpers import free_port, rank_lines
from support.jobs import Job, Launcher
from support.netns import Lan, lan
from test_restarts import DDP, train_args

pytestmark = pytest.mark.timeout(420)
OPERATOR = "10.213.90.99"


def said(job: Job | Completed | str, start: str) -> list[str]:
    """detlaunch's lines that start with `start`."""
    text = job if isinstance(job, str) else job.output if isinstance(job, Completed) else job.read()
    return [line for line in text.splitlines() if line.startswith(f"detlaunch: {start}")]


def chief_now(attempt: int, was: int) -> str:
    """The successor's line: attempt 2 is the first of the two restarts after a lost node, attempt 3 the second."""
    return (f"detlaunch: this node is the chief now (node rank 0, was node {was}): attempt {attempt} is restart "
            f"{attempt - 1} of 2 (a lost node: not counted against --max-restarts) in 0.0 s; waiting for more than "
            "half of the last attempt's 5 nodes to join within 60 s")


def test_a_partition_then_a_stopped_chief(launcher: Launcher, tmp_path: Path) -> None:
    with lan(8) as net:
        a = net.addrs
        excluded = [tmp_path / f"excluded-{i}" for i in range(8)]
        excluded[0].write_text(f"{OPERATOR}  # kept out by the operator\n")
        common = ["--layer", "direct", "--nnodes", "5", "--spares", "3", "--nproc-per-node", "1",
                  "--master-addr", a[0], "--master-port", str(free_port()), "--max-restarts", "1",
                  "--max-node-restarts", "2", "--restart-backoff", "0", "--heartbeat", "0.3",
                  "--start-timeout", "60", "--job-id", f"partition-{os.getpid()}", "--log-dir", str(tmp_path / "logs")]
        script = train_args(tmp_path, DDP, "--crash-step", "3", "--crash-at", "0:2,1:2", "--crash-how", "hang")
        nodes = [launcher.start(*common, "--node-rank", str(i), "--node-addr", a[i], "--exclude-hosts",
                                str(excluded[i]), *script, prefix=net.prefix(i)) for i in range(8)]
        try:
            run(net, nodes, excluded)
        except AssertionError as e:  # every machine's output, to see where the job stopped
            raise AssertionError(f"{e}" + "".join(f"\n--- machine {i}:\n{job.read()}" for i, job in enumerate(nodes))) \
                from None


def run(net: Lan, nodes: list[Job], excluded: list[Path]) -> None:
    a = net.addrs
    for spare in (5, 6, 7):
        nodes[spare].wait_for_output(f"detlaunch: spare node {spare}: joined the job", timeout=120)
    nodes[2].wait_for_output("rank 2 attempt 1 fails at step 3 (hang)", timeout=150)

    net.split([0, 1])  # 1. the chief and node 1 (its successor) against nodes 2-4 and the spares
    old, n1 = nodes[0].wait(90), nodes[1].wait(90)
    assert (old.returncode, n1.returncode) == (1, 1), old.output + n1.output
    lost = ", ".join(f"{i} ({a[i]})" for i in (2, 3, 4))
    assert said(old, "lost node(s)") == [f"detlaunch: lost node(s) {lost}, more than half of the job's 5 nodes: they "
                                         "may follow a successor (the lowest of them), so this chief leaves the job"]
    stopped_by = said(n1, "the chief stopped the job: ")
    assert len(stopped_by) == 1 and stopped_by[0].startswith(
        f"detlaunch: the chief stopped the job: this chief was replaced: it lost node(s) {lost} ("), n1.stderr
    nodes[6].wait_for_output("rank 2 attempt 2 fails at step 3 (hang)", timeout=120)  # a spare in place 2
    first = nodes[2].read()  # node 1 is cut off with the chief: node 2 takes over
    unreachable = f"could not reach node 1 ({a[1]}), the successor, within 3 s: "
    assert said(first, unreachable) == [f"detlaunch: {unreachable}this node takes over as the chief (node rank 0)"]
    for i in (3, 4):
        assert said(nodes[i].read(), unreachable) == [
            f"detlaunch: {unreachable}node 2 ({a[2]}) takes over as the chief (node rank 0)"], nodes[i].read()
    assert said(first, "this node is the chief now") == [chief_now(2, was=2)], first
    assert "detlaunch: 3 of the last attempt's 5 nodes are here (a majority): the job goes on" in first
    assert said(first, "lost node 1 ") == [f"detlaunch: lost node 1 ({a[1]}): it did not join the new chief within 3 s"]

    stopped = psutil.Process(nodes[2].supervisor_pid())  # 2. the new chief stops answering
    stopped.suspend()
    try:
        nodes[5].wait_for_output("of the last attempt's 5 nodes are here (a majority): the job goes on", timeout=120)
    finally:
        stopped.resume()  # back after the succession
    replaced = nodes[2].wait(90)
    assert replaced.returncode == 1, replaced.output
    assert len(said(replaced, "lost node(s) ")) == 1 and \
        said(replaced, "lost node(s) ")[0].endswith("so this chief leaves the job"), replaced.stderr
    done = {i: nodes[i].wait(150) for i in (3, 4, 5, 6, 7)}
    assert {i: d.returncode for i, d in done.items()} == dict.fromkeys(done, 0), \
        "\n".join(d.output for d in done.values())

    chief = done[5].stderr  # 3. what carried over
    assert said(chief, "this node is the chief now") == [chief_now(3, was=1)], chief  # the last node restart
    for i in (3, 4, 6):  # node 2 is a spare that took its place
        assert len(said(done[i], f"lost the chief, node 0 ({a[2]}): ")) == 1, done[i].stderr
    assert said(done[7], "spare node 7: lost the chief")[-1].endswith(f": waits for node 1 ({a[5]}), its successor")
    assert "detlaunch: 3 attempt(s):" in chief and \
        f"detlaunch:   attempt 1: node-lost: lost the chief, node 0 ({a[0]})" in chief and \
        f"detlaunch:   attempt 2: node-lost: lost the chief, node 0 ({a[2]})" in chief and \
        "detlaunch:   attempt 3: finished" in chief, chief
    # Attempt 3: node 0 on machine 5, node 1 (the last spare) on machine 7, node 2 (a spare) on machine 6.
    for i, rank in ((5, 0), (7, 1), (6, 2), (3, 3), (4, 4)):
        lines = rank_lines(done[i].stdout, rank)
        assert f"rank {rank} attempt 3 starts at step 2" in lines and \
            lines[-1].startswith(f"rank {rank} done: 4 steps, weights "), done[i].output
    kept = [re.sub(r"\s+#\s+(\w+).*", r" \1", line) for line in excluded[5].read_text().splitlines()]
    assert sorted(kept) == sorted([f"{OPERATOR} excluded", f"{a[0]} lost", f"{a[1]} lost", f"{a[2]} lost"]), kept
    events = [json.loads(line) for line in (excluded[0].parent / "logs" / "events.jsonl").read_text().splitlines()]
    changed = [(e["details"]["replaces"], e["details"]["host"]) for e in events if e["kind"] == "chief_changed"]
    assert changed == [(a[0], a[2]), (a[2], a[5])], changed
    finished = [e for e in events if e["kind"] == "job_finished"]
    assert len(finished) == 1 and finished[0]["details"]["exit_code"] == 0, finished
