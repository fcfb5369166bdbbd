"""horovodrun's own flags on detlaunch's command line: what detlaunch does with each (docs/LAUNCHER_FLAGS.md).

tests/planning/test_launcher_flags.py checks this table against horovodrun's own parser: a flag a new horovod
adds fails the test until it has a row here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from detlaunch import ConfigError
from detlaunch.launcher_flags import LauncherFlag, maps, passes, refuses, same_as_detlaunch

ELASTIC = ("elastic horovod is not supported: detlaunch runs a fixed set of ranks and stops the whole job at "
           "the first failure; give the nodes with -H/--hosts")
NO_OUTPUT = ("ranks write straight to detlaunch's console, not through horovodrun: detlaunch prefixes each line "
             "with its rank, and --log-dir DIR writes DIR/rank-N.log")


def _slots(hosts: str) -> int | None:
    """The ranks `-H h1:2,h2:2` asks for; None when a host has no slot count."""
    total = 0
    for item in hosts.split(","):
        _, sep, slots = item.strip().rpartition(":")
        if not sep or not slots.isdigit():
            return None
        total += int(slots)
    return total


def num_proc(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    """-np N: the job's ranks. detlaunch runs one rank per slot, so it must agree with the host list."""
    if not (value or "").isdigit() or int(value or 0) < 1:
        raise ConfigError(f"-np {value}: give a number of ranks")
    n = int(value or 0)
    if options.get("hostfile"):
        raise ConfigError(f"-np {n} with a hostfile: detlaunch runs one rank per slot the hostfile lists: drop -np")
    if options.get("hosts"):
        slots = _slots(options["hosts"])
        if slots is not None and slots != n:
            raise ConfigError(f"-np {n} but -H {options['hosts']} gives {slots} slots: detlaunch runs one rank "
                              "per slot: make them agree")
        return {}
    nnodes = options.get("nnodes") or 1
    if n % nnodes:
        raise ConfigError(f"-np {n} does not divide into {nnodes} nodes: give -H with each node's slots")
    return {"nproc_per_node": n // nnodes}


def controller(name: str) -> Any:
    def convert(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
        return {"controller": name}

    return convert


def verbose(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    return {"debug": True}


EXPORTS = "horovod_exports"  # -x's variables, in order: (NAME, VALUE) or (NAME, None) for this environment's
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def export(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    """mpirun's -x NAME (this environment's NAME) or -x NAME=VALUE: the variable reaches every rank. horovodrun
    itself has no -x (its users give it to mpirun through --mpi-args); the layer sets it for every process of
    the job (layer.py), and with --spawn a bare NAME is exported to every node too (--export)."""
    name, sep, val = (value or "").partition("=")
    if not _NAME.fullmatch(name):
        raise ConfigError(f"-x {value}: give -x NAME or -x NAME=VALUE (NAME: letters, digits and _)")
    out: dict[str, Any] = {EXPORTS: (*(options.get(EXPORTS) or ()), (name, val if sep else None))}
    if not sep:
        named = [n for n in str(options.get("export") or "").split(",") if n.strip()]
        out["export"] = ",".join(dict.fromkeys([*named, name]))
    return out


# Rows of flags that horovodrun users pass though horovodrun lacks them (mpirun's): tests/planning/
# test_launcher_flags.py does not look for them in horovodrun's parser.
NOT_HOROVODRUNS = ("-x",)

TABLE: tuple[LauncherFlag, ...] = (
    same_as_detlaunch("-h", "--help", value=False, doc="detlaunch's help (with --layer horovod, its options)"),
    refuses("-v", "--version", value=False, why="this is horovodrun's version: run horovodrun --version"),
    maps("-np", "--num-proc", to=num_proc,
         doc="--nproc-per-node N/--nnodes per node; agrees with -H's slots, refused with a hostfile"),
    refuses("-cb", "--check-build", value=False,
            why="run `detlaunch doctor --layer horovod` (or horovodrun --check-build)"),
    passes("--disable-cache", value=False),
    same_as_detlaunch("--start-timeout"),
    maps("--network-interfaces", to="network_interface"),
    same_as_detlaunch("--network-interface", doc="the horovod layer's option of the same name"),
    refuses("--output-filename", why=NO_OUTPUT),
    maps("--verbose", to=verbose, value=False, doc="--debug (horovodrun --verbose, its chatter shown)"),
    refuses("--config-file",
            why="detlaunch builds horovodrun's command line: give the settings as flags, or in "
            "detlaunch's --config file ([horovod] section)"),
    maps("-p", to="ssh_port", doc="--ssh-port (the per-job sshd's port)"),
    same_as_detlaunch("--ssh-port", doc="the horovod layer's option of the same name"),
    refuses("-i", "--ssh-identity-file", why="detlaunch makes per-job ssh keys for its per-job sshd: drop it"),
    same_as_detlaunch("--fusion-threshold-mb", doc="the horovod layer's option of the same name"),
    same_as_detlaunch("--cycle-time-ms", doc="the horovod layer's option of the same name"),
    passes("--cache-capacity"),
    passes("--hierarchical-allreduce", value=False),
    passes("--no-hierarchical-allreduce", value=False),
    passes("--hierarchical-allgather", value=False),
    passes("--no-hierarchical-allgather", value=False),
    passes("--torus-allreduce", value=False),
    passes("--no-torus-allreduce", value=False),
    same_as_detlaunch("--autotune", value=False, doc="the horovod layer's option of the same name"),
    passes("--no-autotune", value=False),
    same_as_detlaunch("--autotune-log-file", doc="the horovod layer's option of the same name"),
    passes("--autotune-warmup-samples"),
    passes("--autotune-steps-per-sample"),
    passes("--autotune-bayes-opt-max-samples"),
    passes("--autotune-gaussian-process-noise"),
    refuses("--min-np", "--min-num-proc", why=ELASTIC),
    refuses("--max-np", "--max-num-proc", why=ELASTIC),
    refuses("--slots-per-host", why=ELASTIC),
    refuses("--elastic-timeout", why=ELASTIC),
    refuses("--reset-limit", why=ELASTIC),
    refuses("--blacklist-cooldown-range", why=ELASTIC),
    passes("--timeline-filename"),
    passes("--timeline-mark-cycles", value=False),
    passes("--no-timeline-mark-cycles", value=False),
    passes("--no-stall-check", value=False),
    passes("--stall-check", value=False),
    passes("--stall-check-warning-time-seconds"),
    passes("--stall-check-shutdown-time-seconds"),
    passes("--mpi-threads-disable", value=False),
    passes("--no-mpi-threads-disable", value=False),
    passes("--mpi-args"),
    passes("--tcp", value=False),
    passes("--binding-args"),
    passes("--num-nccl-streams"),
    passes("--thread-affinity"),
    maps("--gloo-timeout-seconds", to="gloo_timeout"),
    passes("--log-level"),
    passes("--log-with-timestamp", value=False),
    passes("--log-without-timestamp", value=False),
    refuses("-prefix-timestamp", "--prefix-output-with-timestamp", value=False, why=NO_OUTPUT),
    passes("--log-hide-timestamp", value=False),
    passes("--no-log-hide-timestamp", value=False),
    maps("-H", to="hosts", doc="--hosts (the same host:slots list)"),
    same_as_detlaunch("--hosts", doc="detlaunch's --hosts (the same host:slots list)"),
    maps("-hostfile", to="hostfile", doc="--hostfile (the same 'host slots=N' file)"),
    same_as_detlaunch("--hostfile", doc="detlaunch's --hostfile (the same 'host slots=N' file)"),
    refuses("--host-discovery-script", why=ELASTIC),
    maps("--gloo", to=controller("gloo"), value=False, doc="--controller gloo"),
    maps("--mpi", to=controller("mpi"), value=False, doc="--controller mpi"),
    refuses("--jsrun", value=False, why="LSF's jsrun starts the ranks itself, where detlaunch's horovod layer "
            "starts them under its node supervisors (gloo or mpirun over a per-job sshd): use --controller gloo "
            "or --controller mpi"),
    maps("-x", to=export, narrows=(EXPORTS, "export"),
         doc="mpirun's -x NAME or -x NAME=VALUE (horovodrun has none): the variable reaches every rank, on every "
         "node (with --spawn, a bare NAME is exported as --export NAME does)"),
)
