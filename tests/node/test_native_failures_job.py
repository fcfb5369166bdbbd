"""Ranks that die in C++ for real (SIGABRT after torch's recorded NCCL/CUDA text), and the environment every
rank gets (issue 24, items 5 and 8): one rank, the direct layer, no backoff; a few seconds each."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
from support.helpers import free_port
from support.jobs import SCRIPTS, Launcher
from support.native_stderr import ILLEGAL_ACCESS, TIMEOUT

pytestmark = pytest.mark.timeout(180)

ABORT = str(SCRIPTS / "native_abort.py")
SEEN = str(SCRIPTS / "torchrun_env.py")


def one_rank(*args: str, layer: str = "direct") -> list[str]:
    return ["--layer", layer, "--nproc-per-node", "1", "--master-port", str(free_port()), *args]


def attempt_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.match(r"detlaunch:   (attempt|  ->)", line)]


def test_the_same_nccl_timeout_twice_is_restarted_not_a_crash_loop(launcher: Launcher) -> None:
    r = launcher.run(*one_rank("--max-restarts", "2", "--restart-backoff", "0"), ABORT, f"{TIMEOUT},{TIMEOUT},ok")
    assert r.returncode == 0, r.output
    lines = attempt_lines(r.stderr)
    cause = ("rank 0 on node 0 (127.0.0.1) killed by SIGABRT (c10::DistBackendError: Watchdog caught collective "
             "operation timeout: WorkNCCL(SeqNum=?, OpType=ALLREDUCE, NumelIn=8192, NumelOut=8192, "
             "Timeout(ms)=600000) ran for ? milliseconds before timing out.)")
    assert lines[0].startswith("detlaunch:   attempt 1: rank-failed after ") and lines[0].endswith(cause), lines
    assert lines[2].startswith("detlaunch:   attempt 2: rank-failed after ") and lines[2].endswith(cause), lines
    assert lines[1].startswith("detlaunch:     -> attempt 2 started") and lines[3].startswith(
        "detlaunch:     -> attempt 3 started"), lines
    assert lines[4].startswith("detlaunch:   attempt 3: finished after "), lines
    assert "[rank=0] attempt 3 ok" in r.stdout
    launcher.assert_no_leftovers()


def test_the_same_illegal_memory_access_twice_is_a_crash_loop_after_a_timeout_is_not(launcher: Launcher) -> None:
    r = launcher.run(*one_rank("--max-restarts", "3", "--restart-backoff", "0"), ABORT,
                     f"{TIMEOUT},{ILLEGAL_ACCESS},{ILLEGAL_ACCESS},ok")
    assert r.returncode == 134, r.output
    lines = attempt_lines(r.stderr)
    assert len([line for line in lines if re.match(r"detlaunch:   attempt \d", line)]) == 3, lines
    assert lines[-1] == ("detlaunch:     -> attempt 3 failed the same way as attempt 2 (c10::DistBackendError: "
                         "CUDA error: an illegal memory access was encountered): not restarting (crash loop)")
    # The report shows why, not twenty lines of C++ frames.
    shown = [line.removeprefix("detlaunch:   | ") for line in r.stderr.splitlines()
             if line.startswith("detlaunch:   | ")]
    assert shown[0] == "terminate called after throwing an instance of 'c10::DistBackendError'", r.stderr
    assert shown[1].endswith("terminated with exception: CUDA error: an illegal memory access was encountered")
    assert not any(line.startswith("frame #") for line in shown)
    launcher.assert_no_leftovers()


def seen(launcher: Launcher, layer: str, env: dict[str, str] | None = None) -> dict[str, str]:
    r = launcher.run(*one_rank(layer=layer), SEEN, env=env)
    assert r.returncode == 0, r.output
    [line] = [line for line in r.stdout.splitlines() if line.startswith("[rank=0] SEEN ")]
    return dict(json.loads(line.removeprefix("[rank=0] SEEN "))["env"])


def test_the_ranks_compile_cache_is_the_same_private_folder_job_after_job(launcher: Launcher) -> None:
    first, second = seen(launcher, "direct"), seen(launcher, "torchrun")
    cache = str(launcher.cache / "detlaunch" / "torch-compile")
    assert first["TORCHINDUCTOR_CACHE_DIR"] == second["TORCHINDUCTOR_CACHE_DIR"] == cache
    assert first["TMPDIR"] != second["TMPDIR"]  # the job's own temp folder stays private and new
    assert not os.path.exists(first["TMPDIR"]) and os.path.isdir(cache)  # one is gone, the other kept
    st = os.stat(cache)
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, os.getuid())
    assert "TRITON_CACHE_DIR" not in first  # inductor keeps Triton's in its own: <cache>/triton/<device>
    assert first["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == second["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    launcher.assert_no_leftovers()


def test_what_the_user_set_reaches_the_ranks_unchanged(launcher: Launcher, tmp_path: Path) -> None:
    mine = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    env = seen(launcher, "torchrun", mine)
    assert {k: env.get(k) for k in mine} == mine
    assert not (launcher.cache / "detlaunch" / "torch-compile").exists()


def test_a_horovod_rank_gets_them_too(launcher: Launcher) -> None:
    env = seen(launcher, "horovod")
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(launcher.cache / "detlaunch" / "torch-compile")
