"""deepspeed's own flags on detlaunch's command line: what detlaunch does with each (docs/LAUNCHER_FLAGS.md).

tests/planning/test_launcher_flags.py checks this table against deepspeed's runner parser: a flag a new
deepspeed adds fails the test until it has a row here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from detlaunch import ConfigError
from detlaunch.launcher_flags import LauncherFlag, maps, passes, refuses, same_as_detlaunch, turns_on

HOSTS_INSTEAD = ("detlaunch picks the nodes with --hosts H:S,... or --hostfile and the devices with "
                 "CUDA_VISIBLE_DEVICES")


def include(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``--include host:0,1@host2:0,1``: the first N devices of each host are N slots each."""
    hosts = []
    for part in (value or "").split("@"):
        host, sep, ids = part.partition(":")
        if not sep:
            raise ConfigError(f"--include {value}: name the devices of each host (host:0,1); {HOSTS_INSTEAD}")
        devices = [d.strip() for d in ids.split(",") if d.strip()]
        if devices != [str(i) for i in range(len(devices))]:
            raise ConfigError(f"--include {value}: detlaunch runs the first N devices of a node: "
                              f"{HOSTS_INSTEAD} (CUDA_VISIBLE_DEVICES={','.join(devices)})")
        hosts.append((host.strip(), len(devices)))
    if len(hosts) == 1 and hosts[0][0] in ("localhost", "127.0.0.1"):
        return {"nproc_per_node": hosts[0][1]}
    return {"hosts": ",".join(f"{h}:{n}" for h, n in hosts)}


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
    maps("-i", "--include", to=include, doc="--nproc-per-node or --hosts, when it names the first N devices"),
    refuses("-e", "--exclude", why=f"{HOSTS_INSTEAD}: list the nodes and devices to use"),
    maps("--num_nodes", to="nnodes"),
    maps("--num_gpus", "--num_accelerators", to="nproc_per_node"),
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
