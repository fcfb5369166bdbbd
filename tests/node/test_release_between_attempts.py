"""Real restarts wait for the last attempt: for every thread of its processes (a rank whose thread is stuck in
a driver, which SIGKILL cannot end: a FUSE read answered late), and for its GPU memory (a stub nvidia-smi that
lists attempt 1's rank, by the host's pid as the driver does, until the test frees it)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from support.helpers import free_port, rank_lines
from support.jobs import SCRIPTS, Job, Launcher
from support.nvidia_smi import FakeNvidiaSmi
from support.stuck_fs import needs_fuse, stuck_file

pytestmark = pytest.mark.timeout(120)

RESTART_AT_ONCE = ("--layer", "direct", "--max-restarts", "1", "--restart-backoff", "0")


def attempt_2_starts(stdout: str, ranks: int) -> list[float]:
    starts = [float(line.rsplit(" ", 1)[1]) for rank in range(ranks) for line in rank_lines(stdout, rank)
              if "attempt 2 starts at" in line]
    assert len(starts) == ranks, stdout
    return starts


@needs_fuse
def test_a_rank_whose_thread_is_stuck_in_a_driver_is_waited_for_before_the_next_attempt(
        launcher: Launcher, tmp_path: Path) -> None:
    """Rank 0's leader exits while its thread is inside a read; rank 1 fails; the stop's SIGTERM and SIGKILL
    cannot end the thread. Before: the sweep took the zombie leader for gone and attempt 2 started ~1 s later,
    the thread (on a GPU: its device memory) still there. Now attempt 2 starts only once the thread has ended."""
    with stuck_file(tmp_path / "fs", hold=5.0) as fs:
        done = launcher.run(*RESTART_AT_ONCE, "--nproc-per-node", "2", "--master-port", str(free_port()),
                            "--grace-period", "1", "--dump-budget", "0", str(SCRIPTS / "stuck_rank.py"),
                            str(fs.path), str(fs.arrived), str(tmp_path / "rank0.pid"), timeout=90)
        answered = fs.answered_at
    assert done.returncode == 0, done.output
    assert rank_lines(done.stdout, 1)[0] == "rank 0's leader: Z; its other task(s): S", done.output
    waits = [line for line in done.stderr.splitlines() if "waiting for every thread" in line]
    assert len(waits) == 1 and re.fullmatch(r"detlaunch: waiting for every thread of the last attempt's "
                                            r"process\(es\) \d+ to end \(up to 50 s\)", waits[0]), done.stderr
    assert answered is not None and min(attempt_2_starts(done.stdout, 2)) > answered, (answered, done.output)


def gpu_held_by_attempt_1(launcher: Launcher, tmp_path: Path, *args: str) -> tuple[FakeNvidiaSmi, int, Job]:
    """Start a 1-rank job whose attempt 1 fails once the stub lists its rank (by the host's pid) as holding
    80 GB, beside another job's process: the stub, the rank's pid on the host, the job."""
    smi, go = FakeNvidiaSmi(tmp_path / "bin"), tmp_path / "go"
    job = launcher.start(*RESTART_AT_ONCE, "--nproc-per-node", "1", "--master-port", str(free_port()), *args,
                         str(SCRIPTS / "gpu_rank.py"), str(go), env={"PATH": smi.path})
    job.wait_for_output("rank 0 pid ", timeout=60)
    match = re.search(r"rank 0 pid (\d+)", job.read())
    assert match
    host = job.host_pid(int(match.group(1)))
    assert host != int(match.group(1))  # the job's namespace has pids of its own; nvidia-smi shows the host's
    smi.hold({host: 80000, 99999: 1000})  # 99999: another job's process on the GPU, never waited for
    go.touch()
    return smi, host, job


def test_the_next_attempt_waits_until_the_last_attempts_gpu_memory_is_freed(
        launcher: Launcher, tmp_path: Path) -> None:
    smi, host, job = gpu_held_by_attempt_1(launcher, tmp_path)
    line = f"detlaunch: waiting for GPU memory of the last attempt's pids {host} to be freed (up to 50 s)"
    job.wait_for_output(line, timeout=60)
    freed = time.time()
    smi.free()
    done = job.wait(60)
    assert done.returncode == 0, done.output
    assert done.stderr.count("waiting for GPU memory") == 1 and "99999" not in done.stderr, done.stderr
    assert min(attempt_2_starts(done.stdout, 1)) > freed, done.output
    assert len(smi.calls()) >= 2


def test_past_the_release_timeout_the_next_attempt_starts_anyway(launcher: Launcher, tmp_path: Path) -> None:
    smi, host, job = gpu_held_by_attempt_1(launcher, tmp_path, "--release-timeout", "2")
    done = job.wait(60)
    assert done.returncode == 0, done.output
    lines = [line for line in done.stderr.splitlines() if "GPU memory" in line]
    assert lines == [f"detlaunch: waiting for GPU memory of the last attempt's pids {host} to be freed (up to 2 s)",
                     f"detlaunch: GPU memory of the last attempt's pids {host} is still not freed after 2 s "
                     "(--release-timeout): attempt 2 starts anyway"], done.stderr
    polls = smi.calls()
    assert len(polls) >= 3 and min(attempt_2_starts(done.stdout, 1)) > polls[0][0] + 1.9, (polls, done.output)
