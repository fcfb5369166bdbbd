"""The kubernetes provider: PyTorchJob, JobSet and torchelastic variables; and a real 2-node job from env alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from detlaunch.errors import ClusterError, ConfigError
from detlaunch.planning.providers.kubernetes import read_torch_env
from support.discovery import clean_env, discover, short_tmp  # noqa: F401 (a fixture)
from support.helpers import free_port, rank_lines
from support.jobs import EXAMPLES, ROOT, Launcher

pytestmark = pytest.mark.timeout(120)


def env_of(**extra: str) -> dict[str, str]:
    return clean_env(os.environ, **extra)


@pytest.mark.parametrize(("extra", "nodes", "rank", "used"), [
    # PyTorchJob, one process per pod
    ({"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}, 3, 2,
     ("WORLD_SIZE=3", "RANK=2")),
    # JobSet / hand-written manifests
    ({"MASTER_ADDR": "10.0.0.1", "NNODES": "4", "NODE_RANK": "1"}, 4, 1, ("NNODES=4", "NODE_RANK=1")),
    # PyTorchJob with nprocPerNode: WORLD_SIZE counts processes, PET_NNODES counts pods
    ({"MASTER_ADDR": "m", "WORLD_SIZE": "8", "RANK": "1", "PET_NNODES": "2", "PET_NODE_RANK": "1",
      "PET_NPROC_PER_NODE": "4"}, 2, 1, ("PET_NNODES=2", "PET_NODE_RANK=1")),
    # torchelastic worker: GROUP_* are nodes, RANK/WORLD_SIZE are processes
    ({"MASTER_ADDR": "m", "WORLD_SIZE": "6", "RANK": "4", "GROUP_WORLD_SIZE": "3", "GROUP_RANK": "2",
      "LOCAL_WORLD_SIZE": "2"}, 3, 2, ("GROUP_WORLD_SIZE=3", "GROUP_RANK=2")),
    # mixed: NNODES with RANK
    ({"MASTER_ADDR": "m", "NNODES": "2", "RANK": "1", "WORLD_SIZE": "2"}, 2, 1, ("NNODES=2", "RANK=1")),
    ({"PET_MASTER_ADDR": "m", "PET_NNODES": "2", "PET_NODE_RANK": "0"}, 2, 0, ("PET_NNODES=2", "PET_NODE_RANK=0")),
])
def test_variable_combinations(extra: dict[str, str], nodes: int, rank: int, used: tuple[str, str]) -> None:
    c = discover(env=env_of(**extra))
    chief = extra.get("MASTER_ADDR") or extra["PET_MASTER_ADDR"]
    assert (c.provider, c.num_nodes, c.node_rank, c.chief_addr) == ("kubernetes", nodes, rank, chief)
    assert c.node_addrs == (chief, *[None] * (nodes - 1))
    assert (c.sources["nodes"], c.sources["node_rank"]) == used


@pytest.mark.parametrize(("extra", "argv", "slots", "source"), [
    ({"PET_NPROC_PER_NODE": "4"}, [], 4, "PET_NPROC_PER_NODE=4"),
    ({"LOCAL_WORLD_SIZE": "2"}, [], 2, "LOCAL_WORLD_SIZE=2"),
    ({"PET_NPROC_PER_NODE": "auto"}, [], 1, "default (1), no GPU: CUDA_VISIBLE_DEVICES="),
    ({"PET_NPROC_PER_NODE": "auto", "CUDA_VISIBLE_DEVICES": "0,1,2"}, [], 3, "CUDA_VISIBLE_DEVICES=0,1,2"),
    ({"PET_NPROC_PER_NODE": "4"}, ["--nproc-per-node", "2"], 2, "--nproc-per-node"),
])
def test_slots(extra: dict[str, str], argv: list[str], slots: int, source: str) -> None:
    c = discover(*argv, env=env_of(MASTER_ADDR="m", NNODES="2", NODE_RANK="1", **extra))
    assert (c.slots, c.sources["slots"]) == ((slots, slots), source)


def test_every_pod_derives_the_same_job_id_and_a_flag_wins() -> None:
    base = {"MASTER_ADDR": "m", "MASTER_PORT": "1234", "NNODES": "2"}
    ids = {discover(env=env_of(**base, NODE_RANK=str(r))).job_id for r in (0, 1)}
    assert len(ids) == 1 and ids.pop().startswith("dl-")
    other = discover(env=env_of(**base, NODE_RANK="0", JOBSET_NAME="other")).job_id
    assert other not in ids
    c = discover("--job-id", "j7", env=env_of(**base, NODE_RANK="0"))
    assert (c.job_id, c.sources["job_id"]) == (
        "j7", "--job-id (over derived from MASTER_ADDR, MASTER_PORT, NNODES)")


def test_flags_and_slurm_beat_the_torch_variables() -> None:
    torch_env = {"MASTER_ADDR": "m", "WORLD_SIZE": "2", "RANK": "1"}
    assert discover("--nnodes", "1", env=env_of(**torch_env)).provider == "static"
    slurm = {"SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "localhost", "SLURM_NODEID": "0"}
    assert discover(env=env_of(**torch_env, **slurm)).provider == "slurm"  # SLURM users export MASTER_ADDR too
    assert discover("--cluster", "kubernetes", env=env_of(**torch_env, **slurm)).provider == "kubernetes"


def test_only_master_addr_is_not_a_cluster() -> None:
    assert discover(env=env_of(MASTER_ADDR="m")).provider == "local"


def test_a_nested_detlaunch_ignores_the_outer_torchrun_variables(real_processes: None) -> None:
    """Inside a torchrun rank: MASTER_PORT is the outer job's store, WORLD_SIZE counts its processes."""
    env = env_of(MASTER_ADDR="127.0.0.1", MASTER_PORT="23456", WORLD_SIZE="4", RANK="3", GROUP_RANK="1",
                 GROUP_WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", DET_CHIEF_IP="127.0.0.1")
    assert discover(env=env).provider == "local"
    r = subprocess.run([sys.executable, "-m", "detlaunch", "--layer", "torchrun", "--dry-run", "--format", "json",
                        str(EXAMPLES / "allreduce.py")], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    argv = json.loads(r.stdout)["commands"][0]["argv"]
    assert argv[argv.index("--master-port") + 1] == "29500"


@pytest.mark.parametrize(("extra", "argv", "message"), [
    ({"MASTER_ADDR": "m", "NNODES": "2"}, [],
     "MASTER_ADDR=m and NNODES=2 are set, but no node rank: set NODE_RANK (or RANK, GROUP_RANK) on every pod"),
    ({"MASTER_ADDR": "m", "NNODES": "2", "NODE_RANK": "2"}, [],
     "NODE_RANK=2 is outside NNODES=2 (valid node ranks: 0..1)"),
    ({"MASTER_ADDR": "m", "NNODES": "1:4", "NODE_RANK": "0"}, [],
     "NNODES=1:4 is an elastic range; detlaunch needs a fixed node count: set NNODES to one number (e.g. 4)"),
    ({"MASTER_ADDR": "m", "WORLD_SIZE": "0", "RANK": "0"}, [], "WORLD_SIZE='0' is not a positive integer"),
    ({"MASTER_ADDR": "m", "WORLD_SIZE": "2", "RANK": "-1"}, [], "RANK='-1' is not a non-negative integer"),
    ({"MASTER_ADDR": "m", "NNODES": "2", "NODE_RANK": "0", "PET_NPROC_PER_NODE": "x"}, [],
     "PET_NPROC_PER_NODE='x' is not a number of ranks; fix it, or give --nproc-per-node N"),
    ({"NNODES": "2", "NODE_RANK": "0"}, ["--cluster", "kubernetes"],
     "MASTER_ADDR is not set: a Kubernetes/torchelastic job needs MASTER_ADDR, NNODES or WORLD_SIZE, and "
     "NODE_RANK or RANK; or drop --cluster kubernetes"),
    ({"MASTER_ADDR": "m"}, ["--cluster", "kubernetes"],
     "NNODES (or WORLD_SIZE) is not set: a Kubernetes/torchelastic job needs MASTER_ADDR, NNODES or WORLD_SIZE, "
     "and NODE_RANK or RANK; or drop --cluster kubernetes"),
])
def test_bad_input_is_one_clear_line(extra: dict[str, str], argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        discover(*argv, env=env_of(**extra))
    assert str(e.value) == message


def test_reading_the_variables_is_pure() -> None:
    c = read_torch_env({"MASTER_ADDR": "h", "NNODES": "2", "NODE_RANK": "1", "CUDA_VISIBLE_DEVICES": ""}, 3)
    assert (c.node_addrs, c.slots, c.node_rank) == (("h", None), (3, 3), 1)
    with pytest.raises(ClusterError):
        read_torch_env({})


# -- the real thing --------------------------------------------------------------------------------


def info_json(env: dict[str, str], *argv: str) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-m", "detlaunch", "info", "--format", "json", *argv], env=env,
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert isinstance(data, dict)
    return data


def test_master_port_is_the_rendezvous_port_unless_a_flag_says_otherwise(real_processes: None) -> None:
    env = env_of(MASTER_ADDR="127.0.0.1", MASTER_PORT="23456", WORLD_SIZE="2", RANK="1")
    assert info_json(env)["sources"]["master_port"] == "MASTER_PORT=23456"  # type: ignore[index]
    over = "--master-port 29999 (over MASTER_PORT=23456)"
    assert info_json(env, "--master-port", "29999")["sources"]["master_port"] == over  # type: ignore[index]
    env["DETLAUNCH_MASTER_PORT"] = "29999"
    assert info_json(env)["sources"]["master_port"] == over  # type: ignore[index]
    bad = subprocess.run([sys.executable, "-m", "detlaunch", "info"], capture_output=True, text=True, timeout=60,
                         env={**env_of(MASTER_ADDR="m", MASTER_PORT="http", NNODES="2", NODE_RANK="0")})
    assert (bad.returncode, bad.stderr) == (2, "detlaunch: error: MASTER_PORT='http' is not a port number (1-65535)\n")


def test_two_nodes_from_the_environment_alone(launcher: Launcher, short_tmp: str) -> None:  # noqa: F811
    """Two detlaunch processes, no flag about hosts, ranks or ports: only what PyTorchJob pods get.

    (Torch takes seconds to import here, so one real job; the other spellings are checked above.)
    """
    port = free_port()
    common = clean_env(launcher.env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                       TMPDIR=short_tmp)
    script = str(EXAMPLES / "allreduce.py")
    plan = launcher.run("--layer", "torchrun", "--dry-run", "--format", "json", script, env={**common, "RANK": "1"})
    argv = json.loads(plan.stdout)["commands"][0]["argv"]
    assert argv[argv.index("--master-port") + 1] == str(port), argv  # MASTER_PORT reached torchrun
    chief = launcher.start("--layer", "torchrun", script, env={**common, "RANK": "0"})
    worker = launcher.start("--layer", "torchrun", script, env={**common, "RANK": "1"})
    rc, rw = chief.wait(), worker.wait()
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    assert rank_lines(rc.stdout, 0) == ["rank 0 of 2: all_reduce sum = 1 (chief 127.0.0.1)"]
    assert rank_lines(rw.stdout, 1) == ["rank 1 of 2: all_reduce sum = 1 (chief 127.0.0.1)"]
    assert "job finished" in rc.stderr
