"""deepspeed's own flags on detlaunch's command line: what detlaunch does with each (docs/LAUNCHER_FLAGS.md).

tests/planning/test_launcher_flags.py checks this table against deepspeed's runner parser: a flag a new
deepspeed adds fails the test until it has a row here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from detlaunch import ConfigError
from detlaunch.launcher_flags import GIVEN, LauncherFlag, maps, passes, refuses, same_as_detlaunch, turns_on

from .resources import options_for


def resources(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    """--include, --exclude, --num_nodes, --num_gpus: the nodes and devices, as deepspeed picks them (resources.py).

    Each of them converts all four, so that the last one applied leaves the same options as the first.
    """
    return options_for(options, options[GIVEN])


HOSTS = ("hosts", "hostfile")  # what they narrow: the hosts given, read as they were given

def launcher(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    if value != "pdsh":
        raise ConfigError(f"--launcher {value}: detlaunch's deepspeed layer starts the ranks of other nodes "
                          "through pdsh over its per-job sshd (under SLURM or MPI, detlaunch discovers the nodes "
                          "itself): drop it")
    return {}


def no_local_rank(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    return {"no_local_rank": True}


TABLE: tuple[LauncherFlag, ...] = (
    same_as_detlaunch("-h", "--help", value=False, doc="detlaunch's help (with --layer deepspeed, its options)"),
    maps("-H", to="hostfile", doc="--hostfile (the same 'host slots=N' file)"),
    same_as_detlaunch("--hostfile", doc="detlaunch's --hostfile (the same 'host slots=N' file)"),
    maps("-i", "--include", to=resources, narrows=HOSTS,
         doc="as deepspeed: only those hosts of --hostfile are nodes, and a host's devices listed are its ranks "
             "(CUDA_VISIBLE_DEVICES); without a hostfile, localhost is every node"),
    maps("-e", "--exclude", to=resources, narrows=HOSTS,
         doc="as deepspeed: the hosts of --hostfile but those, and a host's devices but those listed "
             "(needs a hostfile: without one, give --include)"),
    maps("--num_nodes", to=resources, narrows=HOSTS,
         doc="--nnodes; with --hostfile, as deepspeed: its first N hosts"),
    maps("--num_gpus", "--num_accelerators", to=resources, narrows=HOSTS,
         doc="--nproc-per-node; with --hostfile, as deepspeed: devices 0..N-1 of every host"),
    maps("--master_port", to="master_port"),
    maps("--master_addr", to="master_addr"),
    maps("--node_rank", to="node_rank"),
    maps("--launcher", to=launcher, doc="pdsh: what detlaunch uses; others refused"),
    refuses("--launcher_args", why="detlaunch runs pdsh itself, over its per-job sshd: drop it"),
    same_as_detlaunch("--module", value=False, doc="detlaunch's --module: every rank runs `python -m MODULE ARGS`"),
    maps("--no_python", to=turns_on("no_python"), value=False,
         doc="--no-python: the command runs as it is, even X.py"),
    maps("--no_local_rank", to=no_local_rank, value=False,
         doc="--no-local-rank (the script gets no --local_rank=N argument)"),
    refuses("--no_ssh", value=False,
            why="detlaunch reaches other nodes through its per-job sshd, and uses no ssh on one node: drop it"),
    passes("--no_ssh_check", value=False),
    refuses("--force_multi", value=False,
            why="detlaunch decides between one node and several from the cluster it discovers: drop it"),
    passes("--save_pid", value=False),
    maps("--enable_each_rank_log", to="log_dir", doc="--log-dir (DIR/rank-N.log)"),
    refuses("--autotuning", why="deepspeed's autotuner runs experiments of its own: run it with deepspeed itself"),
    passes("--bind_cores_to_rank", value=False),
    passes("--bind_core_list"),
    maps("--ssh_port", to="ssh_port"),
    passes("--venv_script"),
    passes("--log_level"),
    passes("-q", "--quiet", value=False),
)
