"""Issue 27, item 1: --preflight names a really slow or broken node before any rank starts; it stops the job,
or, with a spare, the spare takes the node's place before the first attempt.

Two economical jobs (--layer direct, loopback "nodes"; a node's detlaunch, and so everything it starts, its
check child, torch and the matmul, in a cgroup with a fifth of a CPU: a really slow machine). The thresholds
are under the default 0.7: the loopback nodes share this machine's 2 cores with whatever else runs, and two
unthrottled ones once measured 33 and 65 GFLOP/s; the throttled one measures a fifth of a core.

- 3 nodes: node 2 throttled, node 1 broken (its torch cannot start a gloo group: GLOO_SOCKET_IFNAME names no
  interface there): both named in one line with their figures, at once (node 1 by its own failure, not by its
  partners' group timeout), node 0 not; every node exits 69.
- 2 nodes x 2 ranks + 1 spare: node 1 throttled: named, sent away, its host excluded, the spare takes its place
  before attempt 1 (the chief plans again for it: --hosts lists it), the preflight checks the spare, and the
  job runs on it in its first attempt and ends 0.

The preflight's pairing and judging cases are unit tests (tests/planning/test_preflight.py); the link's side of
the replacement is tests/link/test_membership_link.py.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import detlaunch.exit_codes as exit_codes
import pytest
from detlaunch.node.preflight import GROUP_TIMEOUT
from support.helpers import free_port, rank_lines
from support.jobs import SCRIPTS, Launcher
from support.throttle import cpu_quota

SCRIPT = str(SCRIPTS / "straggler.py")


def into(group: Path) -> list[str]:
    """A command prefix that moves the command into the cgroup `group` before it runs."""
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs")]


def events_of(logs: Path) -> list[dict]:
    return [json.loads(line) for line in (logs / "events.jsonl").read_text().splitlines()]


@pytest.mark.timeout(180)
def test_a_throttled_node_and_a_broken_one_are_named_with_their_figures_and_the_job_stops_before_any_rank(
        launcher: Launcher, tmp_path: Path) -> None:
    job, port, logs = f"preflight-{uuid.uuid4().hex[:8]}", free_port(), tmp_path / "logs"
    args = ["--layer", "direct", "--nproc-per-node", "1", "--nnodes", "3", "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--job-id", job, "--log-dir", str(logs), "--preflight", "once",
            "--preflight-threshold", "0.4"]
    broken = {"GLOO_SOCKET_IFNAME": "nosuch0"}  # node 1's torch cannot start a gloo group
    with cpu_quota(tmp_path, 0.2) as group:
        runs = [launcher.start(*args, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}", SCRIPT,
                               env=broken if n == 1 else None, prefix=into(group) if n == 2 else ())
                for n in (2, 1, 0)]
        slow, worker, chief = (run.wait(150) for run in runs)
    codes = [r.returncode for r in (chief, worker, slow)]
    assert codes == [exit_codes.PREFLIGHT] * 3, chief.output + worker.output + slow.output
    lines = [line for line in chief.stderr.splitlines() if line.startswith("detlaunch: preflight: node")]
    assert len(lines) == 1, chief.stderr  # one line, naming nodes 1 and 2, with their figures
    assert "detlaunch: job failed: preflight: node 1" in chief.stderr, chief.stderr  # and the end report
    assert re.search(r"detlaunch: preflight: node 1 \(127\.0\.0\.2\) network failed: cannot start a gloo group on "
                     r"this node: RuntimeError: .*Unable to find address for: nosuch0; node 2 \(127\.0\.0\.3\) "
                     r"compute [\d.]+ GFLOP/s \(median of the nodes [\d.]+ GFLOP/s, under 0\.4x\)$", lines[0]), lines[0]
    assert "node 0" not in lines[0] and "node 2 (127.0.0.3) network" not in lines[0], lines[0]
    assert "the chief stopped the job: preflight: node 1" in slow.stderr, slow.output
    events = events_of(logs)
    kinds = {e["kind"] for e in events}
    assert "rank_started" not in kinds and "launcher_started" not in kinds, kinds  # no rank ever started
    (event,) = [e for e in events if e["kind"] == "preflight"]
    details = event["details"]
    assert (details["ok"], details["action"], details["nodes"]) == (False, "stop", 3), details
    assert [f["node"] for f in details["findings"]] == [1, 2] and details["findings"][1]["figures"]["compute"] > 0
    assert details["findings"][0]["figures"] == {"network": None}, details
    assert details["seconds"] < 120, details
    print(f"preflight of 3 nodes, one throttled, one broken: {details['seconds']:.1f} s "
          f"(the pair's group timeout: {GROUP_TIMEOUT:g} s)")


@pytest.mark.timeout(240)
def test_with_a_spare_the_throttled_node_is_replaced_before_attempt_1_and_the_job_runs_on_the_spare(
        launcher: Launcher, tmp_path: Path) -> None:
    job, logs, excluded = f"preflight-{uuid.uuid4().hex[:8]}", tmp_path / "logs", tmp_path / "excluded-hosts"
    excluded.write_text("# hosts kept out\n")
    args = ["--layer", "direct", "--hosts", "127.0.0.1:2,127.0.0.2:2,127.0.0.3:2", "--spares", "1",
            "--master-port", str(free_port()), "--max-node-restarts", "1", "--exclude-hosts", str(excluded),
            "--job-id", job, "--log-dir", str(logs), "--preflight", "once", "--preflight-threshold", "0.5"]
    steps = {"MAX_STEPS": "5", "WORK_S": "0.01"}  # a real all_reduce a step, 4 ranks
    # A tenth of a CPU: of two nodes the median is their mean, so the throttled one is named only when the other
    # is over 3x faster (threshold 0.5). With a fifth, under the whole suite's load the chief's best chunk came out
    # under that (CI of a fresh clone: both nodes "ok"); a tenth leaves room for the chief at a third of a core.
    with cpu_quota(tmp_path, 0.1) as group:
        runs = [launcher.start(*args, "--node-rank", str(n), SCRIPT, env=steps, prefix=into(group) if n == 1 else ())
                for n in (2, 1, 0)]
        spare, slow, chief = (run.wait(200) for run in runs)
    assert (chief.returncode, spare.returncode) == (0, 0), chief.output + spare.output + slow.output
    assert slow.returncode == exit_codes.FAILED, chief.stderr + slow.output  # sent away: its part ended, it ran no rank
    assert "node 1 (127.0.0.2) was replaced: slow or broken in the preflight" in slow.stderr, slow.stderr
    assert not rank_lines(slow.stdout, 2) and not rank_lines(slow.stdout, 3), slow.output
    assert re.search(r"^detlaunch: preflight: node 1 \(127\.0\.0\.2\) compute [\d.]+ GFLOP/s \(median of the nodes "
                     r"[\d.]+ GFLOP/s, under 0\.5x\); a spare takes its place, its host is excluded$",
                     chief.stderr, re.M), chief.stderr
    assert "detlaunch: spare node 2 (127.0.0.3) takes the place of node 1 (127.0.0.2)" in chief.stderr, chief.stderr
    assert re.search(r"^detlaunch: preflight: 2 node\(s\) ok in ", chief.stderr, re.M), chief.stderr  # the spare too
    assert "attempt 1: finished" in chief.stderr and "attempt 2" not in chief.stderr, chief.stderr  # none spent
    for done, ranks in ((chief, (0, 1)), (spare, (2, 3))):  # the spare ran node 1's ranks, in the first attempt
        for rank in ranks:
            assert rank_lines(done.stdout, rank)[-1].startswith(f"rank {rank} step 4 at "), done.output
    kept_out = excluded.read_text().splitlines()
    assert len(kept_out) == 2 and kept_out[1].startswith("127.0.0.2 "), kept_out
    events = events_of(logs)
    preflights = [e["details"] for e in events if e["kind"] == "preflight"]
    assert [(p["ok"], p["action"]) for p in preflights] == [(False, "replace"), (True, "none")], preflights
    assert [f["node"] for f in preflights[0]["findings"]] == [1], preflights
    order = [e["kind"] for e in events if e["kind"] in ("preflight", "spare_promoted", "node_excluded",
                                                          "rank_started")]
    assert order[:4] == ["preflight", "node_excluded", "spare_promoted", "preflight"], order  # then the ranks
    assert "failure" not in {e["kind"] for e in events}, events
    print(f"preflight before the spare: {preflights[0]['seconds']:.1f} s; with the spare: "
          f"{preflights[1]['seconds']:.1f} s")
