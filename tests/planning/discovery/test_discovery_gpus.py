"""Counting a node's GPUs for --nproc-per-node (planning/gpus.py): fake machines, in milliseconds.

A machine is the paths its glob finds: /dev/nvidiaN device nodes, and MIG's GPU instances under /proc.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable

import pytest
from detlaunch.errors import ClusterError
from detlaunch.planning.gpus import GpuCount, cuda_visible_devices, visible_gpus
from detlaunch.planning.providers.slurm import read_slurm_env
from support.discovery import clean_env

pytestmark = pytest.mark.timeout(30)

MIG_GI = "/proc/driver/nvidia/capabilities/gpu0/mig/gi1"


def machine(gpus: int = 0, *extra: str) -> Callable[[str], list[str]]:
    """A glob over a fake machine with `gpus` device nodes (and nvidiactl, nvidia-uvm, as real ones have)."""
    paths = [f"/dev/nvidia{i}" for i in range(gpus)] + ["/dev/nvidiactl", "/dev/nvidia-uvm", *extra]
    return lambda pattern: sorted(fnmatch.filter(paths, pattern))


@pytest.mark.parametrize(("value", "gpus", "count", "source"), [
    ("0,1", 0, 2, "CUDA_VISIBLE_DEVICES=0,1"),  # no GPU here: a CPU job's own choice is kept
    ("0,-1,2", 8, 1, "CUDA_VISIBLE_DEVICES=0,-1,2: 1 device(s) as CUDA reads it"),
    ("-1", 8, 0, "CUDA_VISIBLE_DEVICES=-1: 0 device(s) as CUDA reads it"),
    ("", 8, 0, "CUDA_VISIBLE_DEVICES="),
    (" 0, 1", 8, 2, "CUDA_VISIBLE_DEVICES= 0, 1"),
    ("1gpu,2", 8, 2, "CUDA_VISIBLE_DEVICES=1gpu,2"),  # strtoul: the leading digits
    ("0,1,0", 8, 0, "CUDA_VISIBLE_DEVICES=0,1,0: 0 device(s) as CUDA reads it"),  # repeated: none
    ("0,1,2,3,4,5,6,7", 4, 4, "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7: 4 device(s) as CUDA reads it"),
    ("GPU-aa,GPU-bb,GPU-cc", 8, 3, "CUDA_VISIBLE_DEVICES=GPU-aa,GPU-bb,GPU-cc"),
    ("GPU-aa,1,GPU-cc", 8, 1, "CUDA_VISIBLE_DEVICES=GPU-aa,1,GPU-cc: 1 device(s) as CUDA reads it"),
    ("MIG-aa,MIG-bb", 1, 2, "CUDA_VISIBLE_DEVICES=MIG-aa,MIG-bb: 2 MIG device(s)"),
])
def test_cuda_visible_devices_counts_as_cuda_does(value: str, gpus: int, count: int, source: str) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": value}, machine(gpus)) == GpuCount(count, source)


def test_cuda_visible_devices_is_none_when_unset_and_the_entries_otherwise() -> None:
    assert cuda_visible_devices({}) is None
    assert cuda_visible_devices({"CUDA_VISIBLE_DEVICES": "2, 3,x,4"}) == ["2", "3"]
    assert cuda_visible_devices({"CUDA_VISIBLE_DEVICES": "1,3"}, device_count=2) == ["1"]


@pytest.mark.parametrize(("env", "gpus", "count", "source"), [
    ({}, 8, 8, "8 /dev/nvidiaN"),
    ({}, 0, 0, "0 /dev/nvidiaN"),
    # a privileged pod sees every /dev/nvidiaN of its host: it has the GPUs the runtime was told
    ({"NVIDIA_VISIBLE_DEVICES": "0,1,2,3"}, 8, 4, "NVIDIA_VISIBLE_DEVICES=0,1,2,3: 4 of 8 /dev/nvidiaN"),
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, 8, 2, "NVIDIA_VISIBLE_DEVICES=GPU-aa,GPU-bb: 2 of 8 /dev/nvidiaN"),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, 8, 8, "8 /dev/nvidiaN"),
    ({"NVIDIA_VISIBLE_DEVICES": "none"}, 8, 0, "NVIDIA_VISIBLE_DEVICES=none"),
    ({"NVIDIA_VISIBLE_DEVICES": "void"}, 8, 0, "NVIDIA_VISIBLE_DEVICES=void"),
    ({"NVIDIA_VISIBLE_DEVICES": ""}, 8, 0, "NVIDIA_VISIBLE_DEVICES="),
    ({"NVIDIA_VISIBLE_DEVICES": "0,1"}, 0, 0, "NVIDIA_VISIBLE_DEVICES=0,1: 0 of 0 /dev/nvidiaN"),  # no runtime here
    ({"NVIDIA_VISIBLE_DEVICES": "MIG-aa,MIG-bb,MIG-cc"}, 1, 3, "NVIDIA_VISIBLE_DEVICES=MIG-aa,MIG-bb,MIG-cc: "
     "3 MIG device(s)"),
    ({"NVIDIA_VISIBLE_DEVICES": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "0,1"}, 8, 2, "CUDA_VISIBLE_DEVICES=0,1"),
    ({"SLURM_STEP_GPUS": "4,5,6,7", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}, 8, 4, "SLURM_STEP_GPUS=4,5,6,7"),
    ({"SLURM_JOB_GPUS": "0,1,2"}, 8, 3, "SLURM_JOB_GPUS=0,1,2"),
    ({"SLURM_GPUS_ON_NODE": "0"}, 8, 0, "SLURM_GPUS_ON_NODE=0"),  # SLURM gave none: the machine's are not ours
])
def test_a_nodes_gpus_first_source_that_is_set(env: dict[str, str], gpus: int, count: int, source: str) -> None:
    assert visible_gpus(env, machine(gpus)) == GpuCount(count, source)


def test_mig_seen_only_in_the_device_nodes_is_said_not_guessed() -> None:
    with pytest.raises(ClusterError) as e:
        visible_gpus({}, machine(2, MIG_GI))
    assert str(e.value) == (f"this node's GPUs are split into MIG instances ({MIG_GI}): detlaunch does not guess "
                            "how many ranks they take; give --nproc-per-node N, or list the MIG devices in "
                            "CUDA_VISIBLE_DEVICES (nvidia-smi -L)")
    # listed MIG devices are counted: one each
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "MIG-aa,MIG-bb,MIG-cc"}, machine(2, MIG_GI)).count == 3


def slurm_step(**changes: str) -> dict[str, str]:
    """What `srun -N1 --ntasks-per-node=1` sets (no CUDA_VISIBLE_DEVICES: a cluster without gres files)."""
    step = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n1", "SLURM_JOB_NODELIST": "n1",
            "SLURM_NODEID": "0", "SLURM_NTASKS_PER_NODE": "1", "SLURM_STEP_TASKS_PER_NODE": "1"}
    env = clean_env(os.environ, **{**step, **changes})
    if "CUDA_VISIBLE_DEVICES" not in changes:
        del env["CUDA_VISIBLE_DEVICES"]
    return env


@pytest.mark.parametrize(("env", "gpus", "slots", "source"), [
    # the recommended step on an 8-GPU node: 8 ranks, whichever says so
    (slurm_step(SLURM_STEP_GPUS="0,1,2,3,4,5,6,7"), 8, 8, "SLURM_STEP_GPUS=0,1,2,3,4,5,6,7"),
    (slurm_step(SLURM_GPUS_ON_NODE="8"), 8, 8, "SLURM_GPUS_ON_NODE=8"),
    (slurm_step(CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7"), 8, 8, "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"),
    (slurm_step(), 8, 8, "8 /dev/nvidiaN"),  # no gres: the machine's GPUs, not the step's 1 task
    # --ntasks-per-node=8 and no GPU asked for: 8, even where the machine's GPUs show
    (slurm_step(SLURM_NTASKS_PER_NODE="8"), 0, 8, "SLURM_NTASKS_PER_NODE=8"),
    (slurm_step(SLURM_NTASKS_PER_NODE="4"), 8, 4, "SLURM_NTASKS_PER_NODE=4"),
    (slurm_step(SLURM_NTASKS_PER_NODE="4", SLURM_STEP_GPUS="0,1"), 8, 2, "SLURM_STEP_GPUS=0,1"),
    (slurm_step(), 0, 1, "SLURM_NTASKS_PER_NODE=1"),
    (slurm_step(CUDA_VISIBLE_DEVICES=""), 8, 1, "SLURM_NTASKS_PER_NODE=1"),  # CUDA will see none
    (slurm_step(SLURM_NTASKS_PER_NODE=""), 0, 1, "default (1), no GPU: 0 /dev/nvidiaN"),
    (slurm_step(SLURM_STEP_GPUS="0,1"), 8, 2, "SLURM_STEP_GPUS=0,1"),  # MIG below: not asked
])
def test_slurm_slots(env: dict[str, str], gpus: int, slots: int, source: str) -> None:
    job = read_slurm_env(env, glob=machine(gpus))
    assert (job.slots, job.sources["slots"]) == ((slots,), source)


def test_slurm_on_mig_nodes_says_so_when_only_the_devices_tell() -> None:
    with pytest.raises(ClusterError, match="split into MIG instances"):
        read_slurm_env(slurm_step(), glob=machine(8, MIG_GI))
    assert read_slurm_env(slurm_step(), nproc_per_node=14, glob=machine(8, MIG_GI)).slots == (14,)
