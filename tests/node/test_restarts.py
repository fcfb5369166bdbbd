"""Job-wide restarts, for real: a failed attempt stops every node, the chief decides, every node runs again.

Each job trains tests/support/scripts/resumable.py's loop (checkpoint every step, resume), so a restarted
job must end with the weights of a job that never failed. Between attempts, only the detlaunch
processes themselves may be alive (each attempt starts its launchers and per-job sshd afresh).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
from detlaunch.testing.runner import processes_with_marker
from support.helpers import free_port, rank_lines, report_line
from support.jobs import SCRIPTS, Job, Launcher

pytestmark = pytest.mark.timeout(300)

DDP, HVD = SCRIPTS / "resume_ddp.py", SCRIPTS / "resume_hvd.py"
# The weights of 4 steps on 2 ranks that never failed (the data depends on the step and the rank only).
WEIGHTS = "0.981222,0.649037,0.482428,0.538023,-0.004031"


def train_args(tmp_path: Path, script: Path, *crash: str, steps: int = 4) -> list[str]:
    return [str(script), "--ckpt-dir", str(tmp_path / "ckpt"), "--steps", str(steps), *crash]


def torchrun_nodes(*extra: str, layer: str = "torchrun") -> tuple[list[str], list[str]]:
    """Two nodes on 127.0.0.1-2. A test of what is the same on every layer (the restart policy, the link)
    runs `layer="direct"`: no launcher to import torch, and warm ranks (the suite's time)."""
    common = ["--layer", layer, "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--master-port", str(free_port()), *extra]
    return ([*common, "--node-rank", "0", "--node-addr", "127.0.0.1"],
            [*common, "--node-rank", "1", "--node-addr", "127.0.0.2"])


def only_detlaunch_between_attempts(launcher: Launcher, jobs: list[Job]) -> None:
    """Every live process of the job is a detlaunch (the command a test started, or its PID-namespace child),
    the next attempt's launcher waiting, past its imports (standby.py; at most one a node), or the node's rank
    template (rank/template.py, warm ranks: it lives as long as the job, at most one a node)."""
    argvs = {job.argv for job in jobs}
    others, standbys = [], []
    for pid in processes_with_marker(launcher.marker):
        try:
            argv = tuple(psutil.Process(pid).cmdline())
        except psutil.NoSuchProcess:
            continue
        if argv[1:2] == ("-c",) and argv[-1].endswith(":main") and len(argv) == 5 \
                or any(a.endswith(os.path.join("rank", "template.py")) for a in argv[:4]):
            standbys.append((pid, argv))
        elif argv not in argvs:
            others.append((pid, argv))
    assert others == [] and len(standbys) <= 2 * len(jobs), (others, standbys)


def attempt_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.match(r"detlaunch:   (attempt|  ->)", line)]


def test_torchrun_two_nodes_a_sigkilled_rank_resumes_after_one_restart(launcher: Launcher, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    chief_args, worker_args = torchrun_nodes("--max-restarts", "1", "--restart-backoff", "2",
                                             "--restart-backoff-max", "2", "--log-dir", str(logs))
    script = train_args(tmp_path, DDP, "--crash-step", "3", "--crash-rank", "1", "--crash-how", "kill")
    chief = launcher.start(*chief_args, *script)
    worker = launcher.start(*worker_args, *script)
    worker.wait_for_output("the chief restarts the job: attempt 2 in", timeout=120)
    only_detlaunch_between_attempts(launcher, [chief, worker])
    rc, rw = chief.wait(180), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    assert "detlaunch: attempt 1 failed (killed by SIGKILL): restart 1 of 1 in" in rc.stderr
    lines = attempt_lines(rc.stderr)
    assert lines[0] == "detlaunch:   attempt 1: rank-failed after " + lines[0].split("after ", 1)[1]
    assert lines[0].endswith(": rank 1 on node 1 (127.0.0.2) killed by SIGKILL")
    assert re.fullmatch(r"detlaunch:     -> attempt 2 started \d+\.\d s later", lines[1]), lines
    assert re.fullmatch(r"detlaunch:   attempt 2: finished after \d+\.\d s \(exit 0\)", lines[2]), lines
    assert len(lines) == 3
    assert "detlaunch: job finished: 2 rank(s) exited 0" in rc.stderr
    assert rank_lines(rw.stdout, 1)[rank_lines(rw.stdout, 1).index("rank 1 attempt 1 fails at step 3 (kill)") + 1] \
        == "rank 1 attempt 2 starts at step 2"
    assert rank_lines(rc.stdout, 0)[-1] == rank_lines(rw.stdout, 1)[-1].replace("rank 1", "rank 0")
    assert rank_lines(rc.stdout, 0)[-1] == f"rank 0 done: 4 steps, weights {WEIGHTS}"
    assert sorted(str(p.relative_to(logs)) for p in logs.rglob("*.log")) == [
        "attempt-1/rank-0.log", "attempt-1/rank-1.log", "attempt-1/torchrun-node0.log", "attempt-1/torchrun-node1.log",
        "attempt-2/rank-0.log", "attempt-2/rank-1.log", "attempt-2/torchrun-node0.log", "attempt-2/torchrun-node1.log"]
    assert "attempt 1 fails at step 3" in (logs / "attempt-1" / "rank-1.log").read_text()
    assert "rank 1 attempt 2 starts at step 2" in (logs / "attempt-2" / "rank-1.log").read_text()


def two_nodes_over_sshd_resume_after_one_restart(launcher: Launcher, tmp_path: Path, layer: str, script: Path,
                                                 env: dict[str, str] | None = None) -> None:
    """A 2-node job whose workers are reached over the per-job sshd; rank 1 (node 1) SIGKILLs itself at step 3."""
    args = ["--layer", layer, "--hosts", "127.0.0.1:1,127.0.0.2:1", "--ssh-port", str(free_port("127.0.0.2")),
            "--master-port", str(free_port()), "--max-restarts", "1", "--restart-backoff", "2",
            "--restart-backoff-max", "2"]
    argv = train_args(tmp_path, script, "--crash-step", "3", "--crash-rank", "1", "--crash-how", "kill")
    worker = launcher.start(*args, "--node-rank", "1", *argv, env=env)
    chief = launcher.start(*args, "--node-rank", "0", *argv, env=env)
    worker.wait_for_output("the chief restarts the job: attempt 2 in", timeout=200)
    only_detlaunch_between_attempts(launcher, [chief, worker])  # the sshds too: they start again
    rc, rw = chief.wait(240), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    lines = attempt_lines(rc.stderr)
    assert lines[0].endswith(": rank 1 on node 1 (127.0.0.2) killed by SIGKILL"), lines
    assert len(lines) == 3 and lines[2].startswith("detlaunch:   attempt 2: finished"), lines
    assert "rank 1 attempt 2 starts at step 2" in rank_lines(rw.stdout, 1)
    assert "rank 0 attempt 2 starts at step 2" in rank_lines(rc.stdout, 0)
    assert rank_lines(rc.stdout, 0)[-1] == f"rank 0 done: 4 steps, weights {WEIGHTS}"
    assert rank_lines(rw.stdout, 1)[-1] == f"rank 1 done: 4 steps, weights {WEIGHTS}"


def test_horovod_two_nodes_over_sshd_a_sigkilled_rank_resumes_after_one_restart(
        launcher: Launcher, tmp_path: Path) -> None:
    two_nodes_over_sshd_resume_after_one_restart(launcher, tmp_path, "horovod", HVD)


def test_deepspeed_two_nodes_over_sshd_a_sigkilled_rank_resumes_after_one_restart(
        launcher: Launcher, tmp_path: Path) -> None:
    """deepspeed's runner reaches both nodes over pdsh; the chief's env file is written again per attempt."""
    two_nodes_over_sshd_resume_after_one_restart(launcher, tmp_path, "deepspeed", DDP, {"DS_ACCELERATOR": "cpu"})


def single_node(launcher: Launcher, tmp_path: Path, *args: str, timeout: float = 200,
                layer: str = "direct") -> tuple[int, str, str]:
    """One node, 2 ranks; the restart policy is the same on every layer: `--layer direct` unless the layer
    is what is tested (no launcher importing torch, warm ranks: the suite's time)."""
    r = launcher.run("--layer", layer, "--nproc-per-node", "2", "--master-port", str(free_port()),
                     "--restart-backoff", "0", *args, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def test_a_user_error_is_not_retried(launcher: Launcher, tmp_path: Path) -> None:
    rc, out, err = single_node(launcher, tmp_path, "--max-restarts", "3",
                               *train_args(tmp_path, DDP, "--crash-step", "1", "--crash-rank", "1",
                                           "--crash-how", "import", "--crash-attempts", "all"))
    assert rc == 1, out + err
    lines = attempt_lines(err)
    assert lines[0].endswith("rank 1 on node 0 (127.0.0.1) exited with code 1 (ModuleNotFoundError: No module "
                             "named 'a_module_this_job_forgot_to_install')"), lines
    assert lines[0].startswith("detlaunch:   attempt 1: user-error after ")
    assert lines[1:] == ["detlaunch:     -> ModuleNotFoundError is a user error: not restarting "
                         "(--restart-on ModuleNotFoundError retries it)"]
    assert "attempt 2" not in out


def test_the_crash_loop_breaker_stops_the_same_failure_twice(launcher: Launcher, tmp_path: Path) -> None:
    rc, out, err = single_node(launcher, tmp_path, "--max-restarts", "5",
                               *train_args(tmp_path, DDP, "--crash-step", "2", "--crash-rank", "0",
                                           "--crash-attempts", "all", "--crash-code", "3"))
    assert rc == 3, out + err
    lines = attempt_lines(err)
    assert len(lines) == 4, lines
    assert lines[-1] == "detlaunch:     -> attempt 2 failed the same way as attempt 1 (exit 3): not restarting " \
                        "(crash loop)"
    assert report_line(err) == "detlaunch: job failed: rank 0 on node 0 (127.0.0.1) exited with code 3"


def test_max_restarts_2_three_failures_on_the_worker_node_exactly_two_restarts(
        launcher: Launcher, tmp_path: Path) -> None:
    """The worker node's rank fails first every time; the count is the chief's, once per attempt."""
    chief_args, worker_args = torchrun_nodes("--max-restarts", "2", "--restart-backoff", "0", layer="direct")
    script = train_args(tmp_path, DDP, "--crash-step", "2", "--crash-rank", "1", "--crash-attempts", "all",
                        "--crash-code", "3,4,5")  # a different failure each time: no crash loop
    chief = launcher.start(*chief_args, *script)
    worker = launcher.start(*worker_args, *script)
    rc, rw = chief.wait(240), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (5, 5), rc.output + rw.output
    lines = attempt_lines(rc.stderr)
    assert [line.split(":", 2)[1].strip() for line in lines if "  attempt" in line] == \
        ["attempt 1", "attempt 2", "attempt 3"], lines
    assert lines[-1] == "detlaunch:     -> all 2 restarts used: not restarting"
    assert report_line(rc.stderr) == "detlaunch: job failed: rank 1 on node 1 (127.0.0.2) exited with code 5"
    assert report_line(rw.stderr) == "detlaunch: job failed: rank 1 on node 1 (127.0.0.2) exited with code 5"
    assert [line for line in rank_lines(rw.stdout, 1) if "starts at step" in line] == \
        ["rank 1 attempt 1 starts at step 0", "rank 1 attempt 2 starts at step 1",
         "rank 1 attempt 3 starts at step 1"]
    assert rw.stderr.count("the chief restarts the job") == 2


def test_ctrl_c_during_the_backoff_ends_the_job_without_a_restart(launcher: Launcher, tmp_path: Path) -> None:
    job = launcher.start("--layer", "direct", "--nproc-per-node", "2", "--master-port", str(free_port()),
                         "--max-restarts", "3", "--restart-backoff", "60", "--restart-backoff-max", "60",
                         *train_args(tmp_path, DDP, "--crash-step", "2", "--crash-rank", "1"))
    job.wait_for_output("restart 1 of 3 in", timeout=150)
    only_detlaunch_between_attempts(launcher, [job])
    sent = time.monotonic()
    job.send_signal(signal.SIGINT)
    r = job.wait(30)
    assert time.monotonic() - sent < 10
    assert r.returncode == 130, r.output
    assert "detlaunch: SIGINT received while waiting to restart: not restarting" in r.stderr
    lines = attempt_lines(r.stderr)
    assert len(lines) == 2 and lines[1] == "detlaunch:     -> the job was interrupted before attempt 2 started: " \
                                           "not restarting", lines
    assert "attempt 2 starts" not in r.stdout


def test_ctrl_c_to_the_worker_during_the_backoff_ends_both_nodes(launcher: Launcher, tmp_path: Path) -> None:
    chief_args, worker_args = torchrun_nodes("--max-restarts", "3", "--restart-backoff", "60",
                                             "--restart-backoff-max", "60", layer="direct")
    script = train_args(tmp_path, DDP, "--crash-step", "2", "--crash-rank", "0")
    chief = launcher.start(*chief_args, *script)
    worker = launcher.start(*worker_args, *script)
    worker.wait_for_output("the chief restarts the job: attempt 2 in", timeout=150)
    only_detlaunch_between_attempts(launcher, [chief, worker])
    worker.send_signal(signal.SIGINT)
    rc, rw = chief.wait(30), worker.wait(30)
    assert (rc.returncode, rw.returncode) == (130, 130), rc.output + rw.output
    assert attempt_lines(rc.stderr)[-1] == "detlaunch:     -> node 1 was interrupted by SIGINT before attempt 2 " \
                                           "started: not restarting"
    assert "attempt 2 starts" not in rc.stdout + rw.stdout


def test_a_hang_is_retried_and_the_job_resumes(launcher: Launcher, tmp_path: Path) -> None:
    rc, out, err = single_node(launcher, tmp_path, "--max-restarts", "1", "--hang-timeout", "30",
                               *train_args(tmp_path, DDP, "--crash-step", "3", "--crash-rank", "1",
                                           "--crash-how", "hang"))
    assert rc == 0, out + err
    lines = attempt_lines(err)
    assert len(lines) == 3 and lines[0].startswith("detlaunch:   attempt 1: hang after "), lines
    assert "restart 1 of 1 in 0.0 s" in err
    for rank in (0, 1):
        assert f"rank {rank} attempt 2 starts at step 2" in rank_lines(out, rank)
        assert rank_lines(out, rank)[-1] == f"rank {rank} done: 4 steps, weights {WEIGHTS}"


def test_torchrun_the_next_attempts_torchrun_waits_past_its_imports_and_runs_it(
        launcher: Launcher, tmp_path: Path) -> None:
    """Restarts on: while attempt 1 runs, attempt 2's torchrun is started ahead (standby.py), and attempt 2
    runs in it; none is started for an attempt 3 that the restart counts rule out (one node: no node
    can be lost, so --max-node-restarts does not count)."""
    rc, out, err = single_node(launcher, tmp_path, "--max-restarts", "1", "--debug",
                               *train_args(tmp_path, DDP, "--crash-step", "2", "--crash-rank", "1"), layer="torchrun")
    assert rc == 0, out + err
    assert re.search(r"started torchrun \(pid \d+\)\n", err), err
    assert re.search(r"started torchrun \(pid \d+, its standby\)\n", err), err
    assert err.count("standby torchrun for the next attempt") == 1, err
    for rank in (0, 1):
        assert f"rank {rank} attempt 2 starts at step 1" in rank_lines(out, rank), out
        assert rank_lines(out, rank)[-1] == f"rank {rank} done: 4 steps, weights {WEIGHTS}"
