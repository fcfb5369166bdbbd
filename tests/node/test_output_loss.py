"""Nothing is lost, nothing waits: a rank's exit is reported at once even when something it left
behind holds its output open, and a log file that cannot be written never stops the job."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.helpers import free_port, small_tmpfs
from support.jobs import Launcher

pytestmark = pytest.mark.timeout(120)

LEAVES_A_DAEMON = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
if rank == 1:
    if os.fork() == 0:  # a daemon: its own session, deaf to SIGTERM, holding the rank's stdout
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(120)
        os._exit(0)
    print(f"rank 1 leaves a daemon and fails at {time.time()}", flush=True)
    sys.exit(3)
print("rank 0 sleeping", flush=True)
time.sleep(120)
"""

LOUD = """
import os, sys
rank = int(os.environ["RANK"])
line = f"rank {rank} says " + "x" * 200
for i in range(int(os.environ["LINES"])):
    print(f"{i} {line}")
print(f"rank {rank} done", flush=True)
"""


def test_a_rank_that_leaves_a_daemon_holding_its_output_stops_the_job_at_once(launcher: Launcher,
                                                                             tmp_path: Path) -> None:
    script = tmp_path / "daemon.py"
    script.write_text(LEAVES_A_DAEMON)
    done = launcher.run("--layer", "torchrun", "--nproc-per-node", "2", "--master-port", str(free_port()),
                        str(script), timeout=60)
    ended_at = time.time()
    assert done.returncode == 3, done.output
    assert "detlaunch: job failed: rank 1 on node 0 (127.0.0.1) exited with code 3" in done.stderr
    assert "detlaunch:   rank 0 (node 0): killed by SIGTERM (stopped by detlaunch)" in done.stderr
    (line,) = [x for x in done.rank_lines(1) if x.startswith("rank 1 leaves a daemon and fails at ")]
    failed_at = float(line.rsplit(" ", 1)[1])
    # Waiting for the daemon to close the rank's output would take 5 s (what an ended rank's leftovers get).
    assert ended_at - failed_at < 3.0, done.output


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs of the test's own: a disk that fills."""
    with small_tmpfs(tmp_path / "disk", "256k") as mount:
        yield mount


def test_a_log_dir_that_fills_up_is_said_once_and_the_job_goes_on(launcher: Launcher, tmp_path: Path,
                                                                   small_disk: Path) -> None:
    script = tmp_path / "loud.py"
    script.write_text(LOUD)
    logs = small_disk / "logs"
    done = launcher.run("--layer", "torchrun", "--nproc-per-node", "2", "--master-port", str(free_port()),
                        "--log-dir", str(logs), str(script), env={"LINES": "2000"}, timeout=90)
    assert done.returncode == 0, done.output
    for rank in (0, 1):  # the console keeps everything
        lines = done.rank_lines(rank)
        assert len(lines) == 2001 and lines[-1] == f"rank {rank} done"
    warnings = [line for line in done.stderr.splitlines() if "is incomplete: no space left on device" in line]
    # at most one warning per file at the time it happens, and each again in the end report
    said = {w for w in warnings if w.endswith("the console has every line")}
    reported = {w for w in warnings if not w.endswith("the console has every line")}
    assert said and len(said) == len(reported) <= 3, done.stderr
    assert all(str(logs) in w for w in warnings)
    assert "job finished: 2 rank(s) exited 0" in done.stderr


def test_a_log_dir_full_at_start_is_said_and_the_job_runs(launcher: Launcher, tmp_path: Path,
                                                          small_disk: Path) -> None:
    logs = small_disk / "logs"
    logs.mkdir()
    filler = small_disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k", "count=1000"], capture_output=True)
    script = tmp_path / "loud.py"
    script.write_text(LOUD)
    done = launcher.run("--layer", "torchrun", "--nproc-per-node", "2", "--master-port", str(free_port()),
                        "--log-dir", str(logs), str(script), env={"LINES": "10"}, timeout=90)
    assert done.returncode == 0, done.output
    assert "Traceback" not in done.stderr
    assert len(done.rank_lines(0)) == 11 and len(done.rank_lines(1)) == 11
    assert "detlaunch: warning:" in done.stderr and "no space left on device" in done.stderr, done.stderr
