"""The slurm provider against SLURM's variables (as srun and sbatch set them), through the real hook order."""

from __future__ import annotations

import os

import pytest
from detlaunch.errors import ClusterError, ConfigError
from detlaunch.planning.providers.slurm import read_slurm_env
from support.discovery import clean_env, discover

pytestmark = pytest.mark.timeout(60)


def srun_env(node_id: int = 1, nodes: str = "127.0.0.[1-2]", changes: dict[str, str | None] | None = None,
             **extra: str) -> dict[str, str]:
    """What `srun -N2 --ntasks-per-node=1` sets on node `node_id` (checked on the real cluster); a None in
    `changes` unsets that variable."""
    names = {0: "127.0.0.1", 1: "127.0.0.2"}
    env: dict[str, str | None] = {"SLURM_JOB_ID": "12", "SLURM_JOBID": "12", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
           "SLURM_JOB_NODELIST": nodes, "SLURM_NODELIST": nodes, "SLURM_STEP_NODELIST": nodes,
           "SLURM_NODEID": str(node_id), "SLURMD_NODENAME": names.get(node_id, "x"), "SLURM_NNODES": "2",
           "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1(x2)",
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_PROCID": str(node_id), "SLURM_LOCALID": "0"}
    env.update(changes or {})
    env.update(extra)
    out = clean_env(os.environ, **{k: v for k, v in env.items() if v is not None})
    return {k: v for k, v in out.items() if env.get(k, v) is not None}


def without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


def test_an_srun_step_gives_nodes_rank_slots_and_job_id() -> None:
    c = discover(env=srun_env(node_id=1))
    assert (c.provider, c.node_addrs, c.slots, c.node_rank, c.chief_addr, c.job_id) == (
        "slurm", ("127.0.0.1", "127.0.0.2"), (1, 1), 1, "127.0.0.1", "12.0")
    assert dict(c.sources) == {
        "nodes": "SLURM_STEP_NODELIST=127.0.0.[1-2]", "node_rank": "SLURM_NODEID=1",
        "slots": "SLURM_NTASKS_PER_NODE=1", "job_id": "SLURM_JOB_ID=12, SLURM_STEP_ID=0",
        "addresses": "getaddrinfo: 127.0.0.1=127.0.0.1, 127.0.0.2=127.0.0.2",
        "chief": "first node of SLURM_STEP_NODELIST (127.0.0.1)"}


def test_names_resolve_with_getaddrinfo() -> None:
    env = srun_env(node_id=0, nodes="localhost", SLURMD_NODENAME="localhost", SLURM_TASKS_PER_NODE="1",
                   SLURM_STEP_TASKS_PER_NODE="1")
    c = discover(env=env)
    assert (c.node_addrs, c.chief_addr) == (("127.0.0.1",), "127.0.0.1")
    assert c.sources["addresses"] == "getaddrinfo: localhost=127.0.0.1"


def test_the_step_node_list_wins_over_the_jobs() -> None:
    # a step on 2 of the job's 3 nodes: SLURM_NODEID counts within the step
    env = srun_env(node_id=1, SLURM_JOB_NODELIST="127.0.0.[1-3]", SLURM_NODELIST="127.0.0.[1-2]")
    assert discover(env=env).node_addrs == ("127.0.0.1", "127.0.0.2")


def test_a_single_node_batch_script_uses_the_jobs_tasks_per_node() -> None:
    env = clean_env(os.environ, SLURM_JOB_ID="5", SLURM_JOB_NODELIST="localhost", SLURM_NODEID="0",
                    SLURM_TASKS_PER_NODE="4")
    c = discover(env=env)
    assert (c.slots, c.job_id, c.sources["slots"], c.sources["job_id"]) == (
        (4,), "5", "SLURM_TASKS_PER_NODE=4", "SLURM_JOB_ID=5")


# clean_env's CUDA_VISIBLE_DEVICES="" says "no GPU here"; these steps say nothing of it
NO_CUDA_VAR: dict[str, str | None] = {"CUDA_VISIBLE_DEVICES": None}


@pytest.mark.parametrize(("extra", "argv", "slots", "source"), [
    ({**NO_CUDA_VAR, "SLURM_GPUS_ON_NODE": "4"}, [], (4, 4), "SLURM_GPUS_ON_NODE=4"),
    # the recommended step (--ntasks-per-node=1) on 8-GPU nodes: one rank a GPU, not 1
    ({**NO_CUDA_VAR, "SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}, [], (8, 8),
     "SLURM_STEP_GPUS=0,1,2,3,4,5,6,7"),
    ({**NO_CUDA_VAR, "SLURM_JOB_GPUS": "4,5"}, [], (2, 2), "SLURM_JOB_GPUS=4,5"),
    # SLURM sets CUDA_VISIBLE_DEVICES in a step with GPUs; a user who narrows it gets what CUDA will see
    ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "0,1,2,3"}, [], (2, 2), "CUDA_VISIBLE_DEVICES=0,1"),
    ({"SLURM_NTASKS_PER_NODE": "3"}, [], (3, 3), "SLURM_NTASKS_PER_NODE=3"),
    ({"SLURM_NTASKS_PER_NODE": "3", "SLURM_STEP_GPUS": "0,1", **NO_CUDA_VAR}, [], (2, 2), "SLURM_STEP_GPUS=0,1"),
    ({"SLURM_NTASKS_PER_NODE": ""}, [], (1, 1), "default (1), no GPU: CUDA_VISIBLE_DEVICES="),
    ({"SLURM_NTASKS_PER_NODE": "", "CUDA_VISIBLE_DEVICES": "0,1"}, [], (2, 2), "CUDA_VISIBLE_DEVICES=0,1"),
    ({**NO_CUDA_VAR, "SLURM_GPUS_ON_NODE": "4"}, ["--nproc-per-node", "2"], (2, 2), "--nproc-per-node"),
])
def test_slots_precedence(extra: dict[str, str | None], argv: list[str], slots: tuple[int, ...], source: str) -> None:
    c = discover(*argv, env=srun_env(changes=extra))
    assert (c.slots, c.sources["slots"]) == (slots, source)


def test_a_job_id_flag_wins_and_says_over_what() -> None:
    c = discover("--job-id", "mine", env=srun_env())
    assert (c.job_id, c.sources["job_id"]) == ("mine", "--job-id (over SLURM_JOB_ID=12, SLURM_STEP_ID=0)")


def test_node_addr_flag_wins_for_this_node() -> None:
    c = discover("--node-addr", "10.9.9.9", env=srun_env(node_id=1))
    assert c.node_addrs == ("127.0.0.1", "10.9.9.9")
    assert c.sources["node_addr"] == "--node-addr (over 127.0.0.2=127.0.0.2)"


def test_host_flags_describe_the_whole_cluster_and_beat_slurm() -> None:
    c = discover("--hosts", "10.0.0.1:2,10.0.0.2:2", "--node-rank", "0", env=srun_env())
    assert (c.provider, c.node_addrs) == ("static", ("10.0.0.1", "10.0.0.2"))


def test_cluster_flag_forces_a_provider() -> None:
    assert discover("--cluster", "local", env=srun_env()).provider == "local"
    assert discover("--cluster", "slurm", env=srun_env()).provider == "slurm"


def test_a_nested_detlaunch_does_not_read_the_outer_jobs_slurm_variables() -> None:
    c = discover(env=srun_env(DET_CHIEF_IP="127.0.0.5"))
    assert (c.provider, c.chief_addr, c.num_nodes) == ("local", "127.0.0.5", 1)


@pytest.mark.parametrize(("argv", "extra", "message"), [
    ([], {"SLURM_STEP_NODELIST": "n[1-"}, "SLURM_STEP_NODELIST: '[' is never closed in 'n[1-'"),
    ([], {"SLURM_STEP_NODELIST": "n[2-1]"},
     "SLURM_STEP_NODELIST: range '2-1' in 'n[2-1]' goes backwards; write LO-HI with LO <= HI"),
    ([], {"SLURM_NODEID": "2"},
     "SLURM_NODEID=2 is outside SLURM_STEP_NODELIST=127.0.0.[1-2] (2 node(s): valid 0..1); "
     "do not mix variables of different jobs or steps"),
    ([], {"SLURM_NODEID": "one"},
     "SLURM_NODEID='one' is not a non-negative integer; is it overwritten in your script?"),
    ([], {"SLURMD_NODENAME": "127.0.0.1"},
     "SLURMD_NODENAME=127.0.0.1 but SLURM_NODEID=1 is 127.0.0.2 in SLURM_STEP_NODELIST=127.0.0.[1-2]: these come "
     "from different jobs or steps; start detlaunch with srun from a clean environment"),
    ([], {"SLURM_STEP_TASKS_PER_NODE": "2(x2)"},
     "SLURM runs 2 detlaunch processes on node 127.0.0.2 (SLURM_STEP_TASKS_PER_NODE=2(x2)); detlaunch starts the "
     "ranks itself, so run one per node: srun --ntasks-per-node=1 --ntasks=NODES detlaunch ... "
     "(and --nproc-per-node N for N ranks per node)"),
    ([], {"SLURM_STEP_TASKS_PER_NODE": "1(x3)"}, "SLURM_STEP_TASKS_PER_NODE=1(x3) gives 3 count(s) for 2 node(s)"),
    ([], {"SLURM_STEP_NODELIST": "127.0.0.1,127.0.0.1"},
     "SLURM_STEP_NODELIST=127.0.0.1,127.0.0.1 lists node 127.0.0.1 twice"),
    ([], {"SLURM_GPUS_ON_NODE": "lots", **NO_CUDA_VAR},
     "SLURM_GPUS_ON_NODE='lots' is not a number of GPUs; fix it, or give --nproc-per-node N"),
    ([], {"SLURM_STEP_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n2"},
     "cannot resolve node 'n1' (from SLURM_STEP_NODELIST=n[1-2]): Name or service not known; every node's name "
     "must resolve on every node (DNS or /etc/hosts), or give --hosts ADDR:SLOTS,..."),
    (["--cluster", "slurm", "--nnodes", "2"], {},
     "--cluster slurm takes the nodes from slurm, but --nnodes was given too: drop --nnodes, or drop --cluster to "
     "use the flags"),
])
def test_bad_slurm_input_is_one_clear_line(argv: list[str], extra: dict[str, str | None], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        discover(*argv, env=srun_env(changes=extra))
    assert str(e.value) == message


def test_missing_variables() -> None:
    with pytest.raises(ClusterError) as e:
        discover(env=without(srun_env(), "SLURM_NODEID"))
    assert str(e.value) == "SLURM_NODEID is not set inside a SLURM step: is it unset by your script?"
    with pytest.raises(ClusterError) as e:
        discover(env=without(srun_env(), "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"))
    assert str(e.value) == ("SLURM_JOB_ID is set but SLURM_STEP_NODELIST is not: run detlaunch inside the job "
                            "(srun/sbatch), or unset SLURM_JOB_ID")
    with pytest.raises(ClusterError) as e:
        discover("--cluster", "slurm", env=clean_env(os.environ))
    assert str(e.value) == ("SLURM_JOB_ID is not set: run detlaunch inside a SLURM job (srun, sbatch), or drop "
                            "--cluster slurm")


def test_a_multi_node_batch_script_must_use_srun() -> None:
    env = clean_env(os.environ, SLURM_JOB_ID="5", SLURM_JOB_NODELIST="n[1-2]", SLURM_NODEID="0",
                    SLURM_TASKS_PER_NODE="1(x2)")
    with pytest.raises(ClusterError) as e:
        discover(env=env)
    assert str(e.value) == (
        "this is a 2-node SLURM job, but detlaunch runs outside a job step (no SLURM_STEP_ID: the batch script "
        "or an salloc shell): start one detlaunch per node with srun --ntasks-per-node=1 --ntasks=NODES "
        "detlaunch ...")


def test_reading_the_variables_is_pure() -> None:
    job = read_slurm_env({"SLURM_JOB_ID": "3", "SLURM_STEP_ID": "1", "SLURM_STEP_NODELIST": "gpu[01-04,07],cpu3",
                          "SLURM_NODEID": "5", "SLURM_STEP_TASKS_PER_NODE": "1(x6)",
                          "SLURM_GPUS_ON_NODE": "8"})
    assert (job.nodes, job.node_id, job.slots, job.job_id) == (
        ("gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"), 5, (8,) * 6, "3.1")
