"""Issue 24, item 6: torch's Flight Recorder names the rank that never entered the collective, in real jobs.

Two gloo ranks do three all_reduces; then rank 1 sleeps while rank 0 enters all_reduce #4. The hang
report (and `detlaunch stacks` while it hangs) says so beside the stacks, the suspect is the Flight
Recorder's, and the job exits 124. Under `--layer direct` the GPU picture: rank 0's all_reduce #4
returned at once (async, as NCCL's does) and rank 0 blocks at its next sync point, so no stack is in
a collective and the stack rule names nobody: the Flight Recorder still names rank 1.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import detlaunch.exit_codes as exit_codes
import pytest
from support.helpers import free_port, report_line, wait_until
from support.jobs import SCRIPTS, Job, Launcher

HANG = str(SCRIPTS / "hang.py")
VERDICT = "flight recorder: rank 1 never entered all_reduce #4 (rank 0 waits in it)"
SUSPECT = "suspect: rank 1 (node 0): never entered all_reduce #4 (flight recorder)"


def start(launcher: Launcher, layer: str, job: str, events: Path, mode: str) -> Job:
    return launcher.start("--layer", layer, "--nproc-per-node", "2", "--master-port", str(free_port()),
                          "--job-id", job, "--hang-timeout", "12", "--events", str(events), HANG,
                          env={"HANG": mode, "STEPS": "3"})


def ask_stacks(launcher: Launcher, job: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "detlaunch", "stacks", job, "--format", "json"],
                          env=launcher.env, capture_output=True, text=True, timeout=30)


@pytest.mark.timeout(200)
def test_torchrun_the_rank_that_never_entered_the_all_reduce_is_named_and_the_job_exits_124(
        launcher: Launcher, tmp_path: Path) -> None:
    job = f"flight-{uuid.uuid4().hex[:8]}"
    run = start(launcher, "torchrun", job, tmp_path / "events.jsonl", "sleep")
    run.wait_for_output("[rank=1] rank 1 steady", timeout=150)

    def told() -> dict[str, object] | None:  # rank 0 prints "steady", then enters #4: ask until it has
        answer = ask_stacks(launcher, job)
        data = json.loads(answer.stdout) if answer.returncode == 0 else {}
        return data if data.get("flight_recorder") == [VERDICT] else None

    data = wait_until(told, 6, "detlaunch stacks with the flight recorder's verdict")
    assert [(s["rank"], s["why"]) for s in data["suspects"]] == [(1, "never entered all_reduce #4 (flight recorder)")]
    r = run.wait(120)
    assert r.returncode == exit_codes.HANG == 124, r.output
    assert SUSPECT in report_line(r.stderr), r.stderr
    lines = r.stderr.splitlines()
    at = lines.index("detlaunch: every rank's stack when the job hung:")
    assert lines[at + 1] == f"detlaunch:   {VERDICT}", r.stderr  # beside the stacks, first
    assert re.match(r"detlaunch:   rank 0 \(node 0\): work\.wait <- all_reduce <- <module> \(hang\.py:\d+\)$",
                    lines[at + 2]), r.stderr
    assert re.match(r"detlaunch:   rank 1 \(node 0\): time\.sleep <- <module> \(hang\.py:\d+\)  "
                    r"\[suspect: never entered all_reduce #4 \(flight recorder\)\]$", lines[at + 3]), r.stderr


@pytest.mark.timeout(200)
def test_direct_when_no_stack_is_in_a_collective_the_flight_recorder_still_names_the_rank(
        launcher: Launcher, tmp_path: Path) -> None:
    r = start(launcher, "direct", f"flight-{uuid.uuid4().hex[:8]}", tmp_path / "events.jsonl", "sync").wait(150)
    assert r.returncode == 124, r.output
    assert r.rank_lines(0)[-1] == "rank 0 at the sync point" and r.rank_lines(1)[-1] == "rank 1 at the sync point"
    assert SUSPECT in report_line(r.stderr), r.stderr  # the stacks alone: "none stands out"
    assert f"detlaunch:   {VERDICT}" in r.stderr.splitlines(), r.stderr
    assert re.search(r"^detlaunch:   rank 0 \(node 0\): time\.sleep <- sync_point \(hang\.py:\d+\)$", r.stderr, re.M)
    assert re.search(r"^detlaunch:   rank 1 \(node 0\): time\.sleep <- load_batch \(hang\.py:\d+\)  \[suspect: "
                     r"never entered all_reduce #4 \(flight recorder\)\]$", r.stderr, re.M), r.stderr
