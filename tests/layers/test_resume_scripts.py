"""The restart tests' training scripts, under detlaunch as it is: they checkpoint, fail when told, and resume.

The second attempt is started by hand here (DETLAUNCH_RESTART_COUNT=1, as detlaunch's restarts will
set it): it must resume from the step every rank saved and end with the weights of a job that
never failed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.helpers import free_port, rank_lines, report_line
from support.jobs import SCRIPTS, Launcher

pytestmark = pytest.mark.timeout(300)

SCRIPT = {"torchrun": SCRIPTS / "resume_ddp.py", "horovod": SCRIPTS / "resume_hvd.py"}


def weights(stdout: str, rank: int) -> str:
    m = re.fullmatch(r"rank \d+ done: 4 steps, weights (\S+)", rank_lines(stdout, rank)[-1])
    assert m, rank_lines(stdout, rank)
    return m.group(1)


@pytest.mark.parametrize("layer", ["torchrun", "horovod"])
def test_a_failed_job_resumes_from_its_checkpoints_to_the_same_weights(
        launcher: Launcher, tmp_path: Path, layer: str) -> None:
    def job(ckpt: str, *extra: str, restart_count: str = "0") -> tuple[int, str, str]:
        r = launcher.run("--layer", layer, "--nproc-per-node", "2", "--master-port", str(free_port()),
                         str(SCRIPT[layer]), "--ckpt-dir", str(tmp_path / ckpt), "--steps", "4", *extra,
                         env={"DETLAUNCH_RESTART_COUNT": restart_count}, timeout=120)
        return r.returncode, r.stdout, r.stderr

    rc, clean, err = job("clean")
    assert rc == 0, clean + err
    assert weights(clean, 0) == weights(clean, 1)

    crash = ("--crash-step", "3", "--crash-rank", "1", "--crash-code", "3")
    rc, out, err = job("crashed", *crash)
    assert rc == 3, out + err
    assert report_line(err) == "detlaunch: job failed: rank 1 on node 0 (127.0.0.1) exited with code 3"
    assert "detlaunch:   | injected failure at step 3" in err
    assert rank_lines(out, 1)[-1] == "rank 1 attempt 1 fails at step 3 (exit)"
    assert not [line for rank in (0, 1) for line in rank_lines(out, rank) if "step 3/4" in line]  # the barrier
    assert sorted(p.name for p in (tmp_path / "crashed").iterdir()) == ["rank-0.pt", "rank-1.pt"]

    rc, out, err = job("crashed", *crash, restart_count="1")  # attempt 2: the crash was for attempt 1 only
    assert rc == 0, out + err
    for rank in (0, 1):
        assert rank_lines(out, rank)[0] == f"rank {rank} attempt 2 starts at step 2"
        assert weights(out, rank) == weights(clean, 0)
