"""Jobs keep to themselves, for real (torchrun, two nodes on 127.0.0.1 / 127.0.0.2):

- the job secret never reaches a rank: a rank that prints its whole environment shows none of it;
- two jobs on the same hosts: another --master-port is another job id and job dir; the same one is one
  clear line and exit 2 before anything starts;
- a SIGKILLed detlaunch's run dir is removed by the next start; a live job's never is.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from detlaunch.system.rundirs import RUN_DIR_NAME
from support.helpers import free_port, rank_lines
from support.jobs import SCRIPTS, Launcher

pytestmark = pytest.mark.timeout(240)
RANKS = str(SCRIPTS / "ranks.py")


def two_nodes(port: int, node_rank: int, *args: str) -> list[str]:
    return ["--layer", "torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--node-rank", str(node_rank), "--node-addr", f"127.0.0.{node_rank + 1}",
            *args]


def test_no_rank_sees_the_job_secret(launcher: Launcher, tmp_path: Path) -> None:
    secret = secrets.token_hex(16)
    dump = tmp_path / "env.py"
    dump.write_text("import os\nfor k, v in sorted(os.environ.items()):\n    print(f'env {k}={v}')\n")
    port, logs = free_port(), tmp_path / "logs"
    env = {"DETLAUNCH_JOB_SECRET": secret}
    chief = launcher.start(*two_nodes(port, 0, "--log-dir", str(logs), str(dump)), env=env)
    worker = launcher.start(*two_nodes(port, 1, "--log-dir", str(logs), str(dump)), env=env)
    rc, rw = chief.wait(), worker.wait()
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    for r, rank in ((rc, 0), (rw, 1)):
        seen = rank_lines(r.stdout, rank)
        assert f"env RANK={rank}" in seen and "env DET_CHIEF_IP=127.0.0.1" in seen, r.output  # it did print
        assert not [line for line in seen if "DETLAUNCH_JOB_SECRET" in line], seen
        assert secret not in r.output
    files = sorted(logs.iterdir())
    assert [f.name for f in files if f.name.startswith("rank-")] == ["rank-0.log", "rank-1.log"]
    for f in files:
        assert secret not in f.read_text(errors="replace"), f


def test_two_jobs_on_the_same_hosts(launcher: Launcher, tmp_path: Path) -> None:
    first_port = free_port()
    first = [launcher.start(*two_nodes(first_port, n, RANKS), env={"SLEEP": "120"}) for n in (0, 1)]
    for job, rank in zip(first, (0, 1), strict=True):
        job.wait_for_output(f"rank {rank} sleeping", timeout=120)
    jobs_dir = launcher.cache / "detlaunch" / "jobs"
    assert len(os.listdir(jobs_dir)) == 1, os.listdir(jobs_dir)
    first_id = os.listdir(jobs_dir)[0]

    # The same hosts and port: the same job id, so the same job dir. The chief finds its port taken; the
    # worker (which would have joined the first job's chief) finds the job dir locked: one line each, at once.
    r = launcher.run(*two_nodes(first_port, 0, RANKS), timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"detlaunch: error: --master-port {first_port} is already "
                                                  "in use on 127.0.0.1: pick a free port with --master-port PORT\n")
    r = launcher.run(*two_nodes(first_port, 1, RANKS), timeout=60)
    assert (r.returncode, r.stdout) == (2, ""), r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"detlaunch: error: job dir {jobs_dir / first_id} is in use by another job on node 1 (detlaunch pid "), r.stderr
    assert lines[0].endswith(f"(job id {first_id}): give this job another --master-port (its id is derived "
                             "from it), --job-id or --job-dir"), r.stderr
    assert r.duration < 10, r.duration  # before anything started

    # Another --master-port: its own id and dir; it runs to the end while the first job goes on.
    second_port = free_port()
    second = [launcher.start(*two_nodes(second_port, n, RANKS)) for n in (0, 1)]
    results = [job.wait(120) for job in second]
    assert [r.returncode for r in results] == [0, 0], "".join(r.output for r in results)
    assert [rank_lines(r.stdout, n)[-1] for r, n in zip(results, (0, 1), strict=True)] == ["rank 0 done",
                                                                                          "rank 1 done"]
    assert all(job.proc.poll() is None for job in first)  # untouched
    assert os.listdir(jobs_dir) == [first_id]  # the second's dir is gone, the first's is still there
    for job in first:
        job.send_signal(signal.SIGTERM)
    assert [job.wait(60).returncode for job in first] == [143, 143]
    assert not jobs_dir.exists() or os.listdir(jobs_dir) == []


def run_dirs(tmpdir: str) -> list[str]:
    return sorted(n for n in os.listdir(tmpdir) if RUN_DIR_NAME.fullmatch(n))


@pytest.fixture
def short_tmpdir() -> Iterator[str]:
    """A TMPDIR short enough that the run dirs land in it (a socket path must fit in 108 bytes)."""
    path = tempfile.mkdtemp(prefix="dl-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_next_start_removes_a_sigkilled_jobs_run_dir_and_never_a_live_ones(launcher: Launcher,
                                                                                short_tmpdir: str) -> None:
    tmp = {"TMPDIR": short_tmpdir}
    killed = launcher.start("--layer", "torchrun", "--master-port", str(free_port()), RANKS,
                            env={"SLEEP": "300", **tmp})
    killed.wait_for_output("rank 0 sleeping")
    left = run_dirs(short_tmpdir)
    assert len(left) == 1
    killed.send_signal(signal.SIGKILL)
    killed.proc.wait()
    assert launcher.leftovers(settle=10) == []
    assert run_dirs(short_tmpdir) == left  # what the SIGKILL leaves

    live = launcher.start("--layer", "torchrun", "--master-port", str(free_port()), RANKS,
                          env={"SLEEP": "300", **tmp})
    live.wait_for_output("rank 0 sleeping")  # this start removed the dead one
    live_dir = run_dirs(short_tmpdir)
    assert len(live_dir) == 1 and live_dir != left
    r = launcher.run("--layer", "torchrun", "--master-port", str(free_port()), RANKS, env=tmp, timeout=60)
    assert r.returncode == 0, r.output
    assert run_dirs(short_tmpdir) == live_dir  # the live job's is kept
    live.send_signal(signal.SIGTERM)
    assert live.wait(60).returncode == 143
    assert run_dirs(short_tmpdir) == []


def test_no_horovod_rank_sees_the_job_secret_not_even_over_ssh(launcher: Launcher, tmp_path: Path) -> None:
    # horovodrun exports its whole environment on the ssh command line of every remote rank: had the
    # secret been in it, the worker's rank (and `ps` there) would show it.
    secret = secrets.token_hex(16)
    dump = tmp_path / "env.py"
    dump.write_text("import os\nimport horovod.torch as hvd\nhvd.init()\n"
                    "for k, v in sorted(os.environ.items()):\n    print(f'env {k}={v}')\nhvd.shutdown()\n")
    args = ["--layer", "horovod", "--hosts", "127.0.0.1:1,127.0.0.2:1", "--ssh-port", str(free_port("127.0.0.2")),
            "--master-port", str(free_port())]
    env = {"DETLAUNCH_JOB_SECRET": secret}
    worker = launcher.start(*args, "--node-rank", "1", str(dump), env=env)
    chief = launcher.start(*args, "--node-rank", "0", str(dump), env=env)
    rc, rw = chief.wait(180), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    for r, rank in ((rc, 0), (rw, 1)):
        seen = rank_lines(r.stdout, rank)
        assert f"env HOROVOD_RANK={rank}" in seen, r.output  # it did print its environment
        assert not [line for line in seen if "DETLAUNCH_JOB_SECRET" in line], seen
        assert secret not in r.output
