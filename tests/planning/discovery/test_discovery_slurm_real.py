"""detlaunch under a REAL two-node SLURM cluster (tests/support/slurm_cluster.py): no flag about hosts or ranks.

srun and sbatch start one detlaunch per node; each finds the nodes (n1 = 127.0.0.1,
n2 = 127.0.0.2), its rank and the job id from SLURM's variables alone. The only flag
is --master-port: the rendezvous port must be free on this shared machine.
"""

from __future__ import annotations

import json
import shlex
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.discovery import short_tmp  # noqa: F401 (a fixture)
from support.helpers import free_port, rank_lines, report_line
from support.jobs import EXAMPLES, ROOT, SCRIPTS, Launcher
from support.slurm_cluster import SlurmCluster, slurm_cluster  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(240)
_script = Path(sys.executable).with_name("detlaunch")
DETLAUNCH = [str(_script)] if _script.exists() else [sys.executable, "-m", "detlaunch"]
ALLREDUCE = str(EXAMPLES / "allreduce.py")
RANKS = str(SCRIPTS / "ranks.py")


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, launcher: Launcher, short_tmp: str) -> Iterator[SlurmCluster]:  # noqa: F811
    """The cluster, alive and idle, with this test's environment (leak marker, short TMPDIR) for its jobs."""
    slurm_cluster.check_running()
    slurm_cluster.job_env = {**launcher.env, "TMPDIR": short_tmp}
    yield slurm_cluster
    left = slurm_cluster.jobs(settle=15)  # a finished job stays "completing" a moment after srun returns
    if left:
        slurm_cluster.cancel_all()
        pytest.fail(f"SLURM jobs were left running: {left}")


def torchrun_args(script: str) -> list[str]:
    return [*DETLAUNCH, "--layer", "torchrun", "--master-port", str(free_port()), script]


def test_srun_two_nodes_all_reduce(slurm: SlurmCluster) -> None:
    r = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--time=3", *torchrun_args(ALLREDUCE)], cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert rank_lines(r.stdout, rank) == [f"rank {rank} of 2: all_reduce sum = 1 (chief 127.0.0.1)"]
    assert "detlaunch: job finished: 2 rank(s) exited 0" in r.stderr
    assert "detlaunch: job finished: 1 rank(s) on node 1 exited 0" in r.stderr


def test_info_shows_what_each_node_found_and_from_where(slurm: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "info-%t.json"
    r = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--time=1", "-o", str(out),
                   *DETLAUNCH, "info", "--format", "json"], cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    infos = [json.loads((tmp_path / f"info-{task}.json").read_text()) for task in (0, 1)]
    job = infos[0]["job_id"]
    for node, info in enumerate(infos):
        assert info["provider"] == "slurm" and info["node_rank"] == node and info["chief"] == "127.0.0.1"
        assert info["job_id"] == job and job.endswith(".0")  # SLURM's job.step, the same on both nodes
        assert info["nodes"] == [{"rank": 0, "addr": "127.0.0.1", "slots": 1},
                                 {"rank": 1, "addr": "127.0.0.2", "slots": 1}]
        assert info["sources"] == {
            "nodes": "SLURM_STEP_NODELIST=n[1-2]", "node_rank": f"SLURM_NODEID={node}",
            "slots": "SLURM_NTASKS_PER_NODE=1", "job_id": f"SLURM_JOB_ID={job[:-2]}, SLURM_STEP_ID=0",
            "addresses": "getaddrinfo: n1=127.0.0.1, n2=127.0.0.2", "chief": "first node of SLURM_STEP_NODELIST (n1)"}


def test_a_step_given_gpus_runs_one_rank_a_gpu(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The recommended step (one detlaunch a node, --ntasks-per-node=1) given 3 of each node's fake GPUs
    (gres): 3 ranks a node, not 1, from what SLURM set; without GPUs, the step's 1."""
    out = tmp_path / "info-%t.json"
    r = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--gres=gpu:3", "--time=1", "-o", str(out),
                   *DETLAUNCH, "info", "--format", "json"], cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    for task in (0, 1):
        info = json.loads((tmp_path / f"info-{task}.json").read_text())
        assert ([n["slots"] for n in info["nodes"]], info["sources"]["slots"]) == (
            [3, 3], "CUDA_VISIBLE_DEVICES=0,1,2"), info


def sbatch(slurm: SlurmCluster, tmp_path: Path, command: list[str]) -> str:
    """Run `command` as a two-node batch script; its output, once each rank's all_reduce line is checked."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\ncd {ROOT}\nexec {shlex.join(command)}\n")
    out = tmp_path / "job.out"
    r = slurm.run(["sbatch", "--wait", "-N2", "--ntasks-per-node=1", "--time=3", "-o", str(out), str(script)])
    text = out.read_text() if out.exists() else "(no output file)"
    assert r.returncode == 0, r.stdout + r.stderr + text
    for rank in (0, 1):
        assert rank_lines(text, rank) == [f"rank {rank} of 2: all_reduce sum = 1 (chief 127.0.0.1)"], text
    return text


def test_sbatch_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    sbatch(slurm, tmp_path, ["srun", *torchrun_args(ALLREDUCE)])


def test_spawn_srun_from_an_sbatch_script(slurm: SlurmCluster, tmp_path: Path) -> None:
    """One detlaunch in the batch script starts both nodes' (docs/SPAWN.md): one srun step, one task a node."""
    text = sbatch(slurm, tmp_path, [*DETLAUNCH, "--layer", "direct", "--spawn", "srun", "--master-port",
                                    str(free_port()), ALLREDUCE])
    assert "detlaunch: [srun] job finished: 2 rank(s) exited 0" in text, text


def test_ctrl_c_of_spawn_srun_stops_every_node(slurm: SlurmCluster, launcher: Launcher) -> None:
    """srun runs in a session of its own, which no terminal's Ctrl-C reaches: the spawning command (here in
    salloc's allocation, as its shell would run it) passes the stop on to srun as SIGTERM, and SLURM ends the
    step on every node (the ranks would sleep 300 s; the fixtures check that nothing is left)."""
    env = {**slurm.env, **slurm.job_env, "SLEEP": "300"}
    job = launcher.start("--layer", "direct", "--spawn", "srun", "--master-port", str(free_port()), RANKS, env=env,
                         command=DETLAUNCH, prefix=("salloc", "-N2", "--ntasks-per-node=1", "--time=3"))
    for rank in (0, 1):
        job.wait_for_output(f"[rank={rank}] rank {rank} sleeping", timeout=60)
    [spawning] = psutil.Process(job.proc.pid).children()
    spawning.send_signal(signal.SIGINT)
    done = job.wait(timeout=60)
    assert done.returncode == 130 and "srun: forcing job termination" in done.stderr, done.output


def test_a_failing_rank_on_the_second_node(slurm: SlurmCluster) -> None:
    """srun's exit code is the failing rank's, and detlaunch's report names that rank and node."""
    env = {"FAIL_RANK": "1", "FAIL_CODE": "3", "SLEEP": "120"}
    started = time.monotonic()
    r = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--time=3", *torchrun_args(RANKS)], env=env, cwd=ROOT,
                  timeout=150)
    took = time.monotonic() - started
    assert r.returncode == 3, r.stdout + r.stderr
    assert report_line(r.stderr) == "detlaunch: job failed: rank 1 on node 1 (127.0.0.2) exited with code 3"
    assert "srun: error: n2: task 1: Exited with exit code 3" in r.stderr
    assert rank_lines(r.stdout, 1)[-1] == "rank 1 failing"
    # Rank 1 fails at once, so rank 0 may be stopped before it says anything; it is never left to sleep.
    last = rank_lines(r.stdout, 0)[-1:]
    assert last in ([], ["rank 0 sleeping"]) or last[0].startswith("rank 0 started"), r.stdout
    assert took < 100, r.stdout + r.stderr


def test_srun_two_nodes_horovod(slurm: SlurmCluster) -> None:
    """n1 runs horovodrun, n2 the per-job sshd it reaches; both found from SLURM alone."""
    ssh_port = str(free_port())
    r = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--time=4", *DETLAUNCH, "--layer", "horovod",
                   "--master-port", str(free_port()), "--ssh-port", ssh_port,
                   str(EXAMPLES / "hvd_allreduce.py")], cwd=ROOT, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert rank_lines(r.stdout, rank) == [f"rank {rank} of 2: hvd.allreduce sum = 1 (chief 127.0.0.1)"]
    assert "detlaunch: job finished: 2 rank(s) exited 0" in r.stderr
    assert "detlaunch: job finished: 1 rank(s) on node 1 exited 0" in r.stderr


def test_the_cluster_is_loopback_only(slurm: SlurmCluster) -> None:
    listening = slurm.listening_addresses()
    assert listening and all(addr.startswith("127.") for addr in listening), listening


def test_node_names_resolve_inside_the_nodes_only(slurm: SlurmCluster) -> None:
    """n1/n2 come from the nodes' private /etc/hosts (mount namespaces); this machine's is untouched."""
    r = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--time=1", "-l", "getent", "hosts", "n1", "n2"])
    assert r.returncode == 0, r.stderr
    lines = sorted(" ".join(line.split()) for line in r.stdout.splitlines())
    assert lines == ["0: 127.0.0.1 n1", "0: 127.0.0.2 n2", "1: 127.0.0.1 n1", "1: 127.0.0.2 n2"]
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("n2", None)
