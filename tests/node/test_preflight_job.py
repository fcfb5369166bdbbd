"""Issue 27, item 1: --preflight names a really slow node before any rank starts, and stops the job.

One economical job: 3 nodes (127.0.0.1-3, --layer direct), node 2's detlaunch (and so everything it
starts: its check child, torch, the matmul) in a cgroup with a fifth of a CPU. The preflight's pairing
and judging cases are unit tests (tests/planning/test_preflight.py).
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import detlaunch.exit_codes as exit_codes
import pytest
from support.helpers import free_port
from support.jobs import SCRIPTS, Launcher
from support.throttle import cpu_quota

SCRIPT = str(SCRIPTS / "straggler.py")


@pytest.mark.timeout(180)
def test_a_throttled_node_is_named_with_its_figures_and_the_job_stops_before_any_rank(launcher: Launcher,
                                                                                      tmp_path: Path) -> None:
    job, port, logs = f"preflight-{uuid.uuid4().hex[:8]}", free_port(), tmp_path / "logs"
    args = ["--layer", "direct", "--nproc-per-node", "1", "--nnodes", "3", "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--job-id", job, "--log-dir", str(logs), "--preflight", "once"]
    with cpu_quota(tmp_path, 0.2) as group:
        into_group = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs")]
        runs = [launcher.start(*args, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}", SCRIPT,
                               prefix=into_group if n == 2 else ()) for n in (2, 1, 0)]
        slow, worker, chief = (run.wait(150) for run in runs)
    codes = [r.returncode for r in (chief, worker, slow)]
    assert codes == [exit_codes.PREFLIGHT] * 3, chief.output + worker.output + slow.output
    lines = [line for line in chief.stderr.splitlines() if line.startswith("detlaunch: preflight: node")]
    assert len(lines) == 1, chief.stderr  # one line, naming node 2 alone, with its figures and the median
    assert "detlaunch: job failed: preflight: node 2" in chief.stderr, chief.stderr  # and the end report
    assert re.search(r"detlaunch: preflight: node 2 \(127\.0\.0\.3\) compute [\d.]+ GFLOP/s \(median of the nodes "
                     r"[\d.]+ GFLOP/s, under 0\.7x\)", lines[0]), lines[0]
    assert "node 0" not in lines[0] and "node 1 " not in lines[0], lines[0]
    assert "the chief stopped the job: preflight: node 2" in slow.stderr, slow.output
    events = [json.loads(line) for line in (logs / "events.jsonl").read_text().splitlines()]
    kinds = {e["kind"] for e in events}
    assert "rank_started" not in kinds and "launcher_started" not in kinds, kinds  # no rank ever started
    (event,) = [e for e in events if e["kind"] == "preflight"]
    details = event["details"]
    assert (details["ok"], details["action"], details["nodes"]) == (False, "stop", 3), details
    assert [f["node"] for f in details["findings"]] == [2] and details["findings"][0]["figures"]["compute"] > 0
    assert details["seconds"] < 120, details
    print(f"preflight of 3 nodes, one throttled: {details['seconds']:.1f} s")
