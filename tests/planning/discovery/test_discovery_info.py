"""`detlaunch info` as users see it: what was discovered, by which provider, from which flag or variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.discovery import clean_env
from support.jobs import ROOT

pytestmark = pytest.mark.timeout(60)


def info(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "detlaunch", "info", *argv], env=clean_env(os.environ, **env),
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


SRUN_NODE_1 = {"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "127.0.0.[1-2]",
               "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NTASKS_PER_NODE": "1"}


def test_info_under_slurm(real_processes: None) -> None:
    r = info(**SRUN_NODE_1)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == [
        "provider: slurm",
        "job id:   41.0",
        "this node: rank 1 of 2, 1 slot(s)",
        "chief:    127.0.0.1",
        "  node 0: 127.0.0.1  slots=1",
        "  node 1: 127.0.0.2  slots=1  (this node)",
        "  nodes from SLURM_STEP_NODELIST=127.0.0.[1-2]",
        "  node_rank from SLURM_NODEID=1",
        "  slots from SLURM_NTASKS_PER_NODE=1",
        "  job_id from SLURM_JOB_ID=41, SLURM_STEP_ID=0",
        "  addresses from getaddrinfo: 127.0.0.1=127.0.0.1, 127.0.0.2=127.0.0.2",
        "  chief from first node of SLURM_STEP_NODELIST (127.0.0.1)",
    ]


def test_info_shows_which_flag_won_over_the_environment(real_processes: None) -> None:
    r = info("--nproc-per-node", "4", "--job-id", "mine", **SRUN_NODE_1)
    assert r.returncode == 0, r.stderr
    assert "  slots from --nproc-per-node" in r.stdout.splitlines()
    assert "  job_id from --job-id (over SLURM_JOB_ID=41, SLURM_STEP_ID=0)" in r.stdout.splitlines()
    r = info("--hosts", "10.0.0.1:2,10.0.0.2:2", "--node-rank", "0", **SRUN_NODE_1)
    assert r.stdout.splitlines()[0] == "provider: static"


def test_info_names_the_kubernetes_variables(real_processes: None) -> None:
    r = info(MASTER_ADDR="job-master-0", MASTER_PORT="23456", WORLD_SIZE="3", RANK="2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].startswith("job id:   dl-")
    assert lines[:1] + lines[2:7] == [
        "provider: kubernetes", "this node: rank 2 of 3, 1 slot(s)", "chief:    job-master-0",
        "  node 0: job-master-0  slots=1", "  node 1: (address unknown)  slots=1",
        "  node 2: (address unknown)  slots=1  (this node)"]
    assert "  master_port from MASTER_PORT=23456" in r.stdout.splitlines()


@pytest.mark.parametrize(("argv", "env", "line"), [
    ([], {**SRUN_NODE_1, "SLURM_NODEID": "7"},
     "detlaunch: error: SLURM_NODEID=7 is outside SLURM_STEP_NODELIST=127.0.0.[1-2] (2 node(s): valid 0..1); "
     "do not mix variables of different jobs or steps"),
    ([], {**SRUN_NODE_1, "SLURM_STEP_NODELIST": "gpu[01-04,07"},
     "detlaunch: error: SLURM_STEP_NODELIST: '[' is never closed in 'gpu[01-04,07'"),
    (["--cluster", "determined"], {},
     "detlaunch: error: Determined cluster info /run/determined/info/cluster.json does not exist: run inside a "
     "Determined task, point DET_CLUSTER_INFO at cluster.json, or drop --cluster determined"),
    (["--cluster", "lsf"], {},
     "detlaunch: error: cluster provider 'lsf' found nothing here, or is not installed (see detlaunch plugins)"),
])
def test_bad_input_is_one_error_line_and_exit_2(real_processes: None, argv: list[str], env: dict[str, str],
                                                line: str) -> None:
    r = info(*argv, **env)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", line + "\n")
