"""horovod layer: the seed's chain (harness/determined/launch/horovod.py), on detlaunch's public API.

- chief: supervisor -> ``horovodrun -np N -p SSH_PORT -H localhost:S0,host1:S1,... ...`` -> rank
  wrapper -> script. horovodrun is stopped with SIGINT (it misbehaves on SIGTERM). It runs as
  ``python -m detlaunch_horovod.horovodrun`` (horovodrun.py: horovodrun's own run, with its imports and
  its build probe at import), so that with restarts on the next attempt's waits past them (a standby).
- worker nodes: supervisor -> the per-job ``sshd -D``; ranks arrive over ssh and register
  with this node's supervisor, which ends when they have all exited.
- ``--auto``: one node with at most one slot runs the script directly, without horovodrun.

Importing this module does not import horovod or torch.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import mmap
import os
import signal
import sys
from collections.abc import Mapping, Sequence

from detlaunch import (
    Check,
    Command,
    Config,
    ConfigError,
    Number,
    RankWrapper,
    Stage,
    StageContext,
    hookimpl,
)
from detlaunch.launcher_flags import add_launcher_flags, check_launcher_args
from detlaunch.ssh import SshLayout, add_ssh_options, client_path, ssh_client_parts, ssh_port_check, sshd_parts

from .flags import EXPORTS, TABLE
from .grace import GRACE_ENV

# horovodrun.py's names, written out: importing it imports horovod.
HOROVODRUN_MODULE = "detlaunch_horovod.horovodrun"
PROBE_ENV = "DETLAUNCH_HOROVOD_PROBE"

NAME = "horovod"
# The seed's constants (determined/constants.py), as documented defaults.
STARTUP_TIMEOUT_SECONDS = 1200
GLOO_TIMEOUT_SECONDS = 240
FUSION_THRESHOLD_MB = 64
CYCLE_TIME_MS = 1
CACHE_CAPACITY = 1024
RANK_ENV = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "DETLAUNCH_RANK")
# What horovod's stall inspector logs (horovod/common/stall_inspector.cc, on the coordinator, rank 0) every
# HOROVOD_STALL_CHECK_TIME_SECONDS (60) while ranks wait in a collective for the others: a hung job's only
# output, so not progress (else --hang-timeout above 60 would never fire). Each is the first line of one
# message, written at once ("Missing ranks:" and one line per rank follow it).
STALL_WARNINGS = (
    "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS is less than HOROVOD_STALL_CHECK_TIME_SECONDS",
)
REBUILD = ("HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 pip install --no-build-isolation --no-cache-dir "
           "--force-reinstall horovod (with torch installed first; see scripts/setup.sh)")
# Symbols of horovod's controllers in its torch extension: how a build shows what it was built with.
CONTROLLER_SYMBOLS = {"gloo": b"GlooController", "mpi": b"MPIController"}
SHOWN = {"gloo": "Gloo", "mpi": "MPI"}


def create_hostlist_arg(host_slot_counts: Sequence[int], ip_addresses: Sequence[str]) -> str:
    """``localhost:S0,host1:S1,...``: horovodrun does not read the chief's own address well."""
    if len(host_slot_counts) != len(ip_addresses):
        raise ValueError("need one slot count per host")
    hosts = ["localhost", *ip_addresses[1:]]
    return ",".join(f"{h}:{s}" for h, s in zip(hosts, host_slot_counts, strict=True))


def create_performance_args(autotune: bool, autotune_log_file: str, fusion_threshold_mb: int,
                            cycle_time_ms: float) -> list[str]:
    if autotune:
        args = ["--autotune", "--autotune-log-file", autotune_log_file]
    else:
        args = ["--fusion-threshold-mb", str(fusion_threshold_mb), "--cycle-time-ms", f"{cycle_time_ms:g}"]
    # Keep horovod from tuning these on its own.
    return args + ["--cache-capacity", str(CACHE_CAPACITY), "--no-hierarchical-allreduce",
                   "--no-hierarchical-allgather"]


def create_run_command(
    host_slot_counts: Sequence[int],
    ip_addresses: Sequence[str],
    *,
    ssh_port: int,
    start_timeout: int = STARTUP_TIMEOUT_SECONDS,
    gloo_timeout: int = GLOO_TIMEOUT_SECONDS,
    network_interface: str | None = None,
    autotune: bool = False,
    autotune_log_file: str = "horovod_autotune_log.csv",
    fusion_threshold_mb: int = FUSION_THRESHOLD_MB,
    cycle_time_ms: float = CYCLE_TIME_MS,
    debug: bool = False,
    optional_args: Sequence[str] = (),
) -> list[str]:
    """The horovodrun command, as the seed's create_run_command builds it; ends with ``--``."""
    cmd = [
        "horovodrun",
        "-np", str(sum(host_slot_counts)),
        "-p", str(ssh_port),
        "-H", create_hostlist_arg(host_slot_counts, ip_addresses),
        "--start-timeout", str(start_timeout),
        "--gloo-timeout-seconds", str(gloo_timeout),
    ]
    if network_interface is not None and len(ip_addresses) > 1:
        cmd += ["--network-interface", network_interface]
    cmd += create_performance_args(autotune, autotune_log_file, fusion_threshold_mb, cycle_time_ms)
    if debug:
        cmd.append("--verbose")
    cmd += list(optional_args)
    cmd.append("--")
    return cmd


def torch_extension() -> str | None:
    """horovod's compiled PyTorch extension, found without importing horovod (or torch)."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(folder, "torch", "mpi_lib_v2*.so")))
        if found:
            return found[0]
    return None


def built_controllers(extension: str) -> set[str]:
    """The controllers compiled into the extension (a scan of its symbol names, in milliseconds)."""
    with open(extension, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return {name for name, symbol in CONTROLLER_SYMBOLS.items() if m.find(symbol) >= 0}


def check_build(controller: str) -> None:
    """While planning: a horovod that pip built without its compiled parts is one line, not a traceback."""
    if importlib.util.find_spec("horovod") is None:
        raise ConfigError("the horovod layer needs horovod in this Python environment: " + REBUILD)
    extension = torch_extension()
    if extension is None:
        raise ConfigError("horovod is installed without its PyTorch extension (pip built it without torch): "
                          f"reinstall it: {REBUILD}")
    if controller not in built_controllers(extension):
        other = "mpi" if controller == "gloo" else "gloo"
        raise ConfigError(f"horovod was built without {SHOWN[controller]} support: reinstall it with "
                          f"HOROVOD_WITH_{controller.upper()}=1 ({REBUILD}), or use --controller {other}")


def horovodrun_check() -> Check:
    """What the layer runs as horovodrun (``python -m detlaunch_horovod.horovodrun``): horovod's launcher,
    importable in this Python; not a horovodrun command on PATH, which the job never runs."""
    launcher = Check.importable("horovod.runner.launch", "pip install horovod into this Python environment")
    detail = f"horovod.runner.launch, run by {sys.executable}" if launcher.ok else launcher.detail
    return Check("horovodrun", launcher.ok, detail, launcher.fix)


@hookimpl
def detlaunch_add_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("horovod layer (also read from the config file's [horovod] section)")
    g.add_argument("--fusion-threshold-mb", type=Number(int, 0, 65536, unit="MB"), default=FUSION_THRESHOLD_MB,
                   metavar="MB", help=f"tensor fusion buffer (default {FUSION_THRESHOLD_MB})")
    g.add_argument("--cycle-time-ms", type=Number(float, 0, 60000, unit="ms"), default=CYCLE_TIME_MS, metavar="MS",
                   help=f"tensor fusion cycle time (default {CYCLE_TIME_MS})")
    g.add_argument("--autotune", action="store_true", help="let horovod tune fusion (replaces the two above)")
    g.add_argument("--autotune-log-file", metavar="FILE", help="autotune log (default: "
                   "horovod_autotune_log.csv in --log-dir, else in the current directory)")
    g.add_argument("--network-interface", metavar="NIC", help="inter-node interface, e.g. eth0 (multi-node)")
    g.add_argument("--gloo-timeout", type=Number(int, 1, 7 * 86400, unit="s"), default=GLOO_TIMEOUT_SECONDS,
                   metavar="S", help=f"horovodrun --gloo-timeout-seconds (default {GLOO_TIMEOUT_SECONDS})")
    g.add_argument("--controller", choices=("gloo", "mpi"), default="gloo",
                   help="horovodrun's controller (default gloo, the build scripts/setup.sh makes)")
    g.add_argument("--auto", action="store_true",
                   help="one node with at most one slot: run the script directly, without horovodrun")
    add_ssh_options(parser, NAME)
    parser.set_defaults(**{EXPORTS: ()})  # mpirun's -x (flags.py): no option of its own
    add_launcher_flags(parser, TABLE, NAME)


def multi_node(options: Mapping[str, object]) -> bool:
    return bool((options.get("nnodes") or 1) != 1 or options.get("hosts") and "," in str(options["hosts"])
                or options.get("hostfile"))


def build_checks(controller: str) -> list[Check]:
    """horovod.torch imports and reports the controller built in (what horovodrun --check-build shows)."""
    if importlib.util.find_spec("horovod") is None:
        return [Check("horovod importable", False, "not installed", REBUILD)]
    try:
        import horovod.torch as hvd
    except Exception as e:  # no extension, or one built against another torch
        return [Check("horovod's PyTorch extension", False, f"{type(e).__name__}: {e}", REBUILD)]
    built = {"gloo": bool(hvd.gloo_built()), "mpi": bool(hvd.mpi_built())}
    shown = ", ".join(name for name, ok in built.items() if ok) or "none"
    return [Check("horovod's PyTorch extension", True, getattr(hvd, "__file__", "") or "imported"),
            Check(f"horovod built with {SHOWN[controller]} (--controller {controller})", built[controller],
                  f"controllers built: {shown}", f"reinstall: HOROVOD_WITH_{controller.upper()}=1 {REBUILD}")]


@hookimpl
def detlaunch_doctor_checks(config: Config) -> list[Check]:
    multi = multi_node(config.options)
    where = "" if multi else " (only for jobs on several nodes)"
    return [
        Check.importable("torch", "pip install torch, then rebuild horovod against it"),
        *build_checks(str(config.options.get("controller") or "gloo")),
        horovodrun_check(),
        Check.on_path("sshd", "apt-get install openssh-server" + where, config.env, required=multi,
                      also=("/usr/sbin", "/sbin")),
        Check.on_path("ssh", "apt-get install openssh-client" + where, config.env, required=multi),
        *ssh_port_check(config, required=multi),
    ]


@hookimpl
def detlaunch_rank_wrappers(ctx: StageContext) -> RankWrapper:
    return RankWrapper(rank_env=RANK_ENV, not_progress=STALL_WARNINGS, warm_env=import_time_env(ctx),
                       preload=("horovod.torch",))


def import_time_env(ctx: StageContext) -> dict[str, str]:
    """What horovodrun adds to its ranks' environment that Python reads at start (RankWrapper.warm_env: their ranks
    are forked from the node's rank template, which imported horovod.torch once): under gloo, PYTHONUNBUFFERED=1
    (horovod/runner/gloo_run.py). The rest (HOROVOD_*, and mpirun's OMPI_*/PMIX_*) is read by hvd.init().
    On the other nodes of a gloo run, horovodrun's ranks get its environment, the chief's: its PATH starts with the
    per-job ssh (ssh.client_path), taken here to be this node's PATH after that (nodes started alike); where the
    chief's differs, the ranks start cold, with one line."""
    if str(ctx.option("controller", "gloo")) != "gloo" or single_slot(ctx):
        return {}
    if ctx.cluster.num_nodes > 1 and not ctx.cluster.is_chief:
        return {"PYTHONUNBUFFERED": "1", "PATH": client_path(ctx)}
    return {"PYTHONUNBUFFERED": "1"}


@hookimpl
def detlaunch_environment(ctx: StageContext) -> dict[str, str]:
    return {"USE_HOROVOD": "1", **exported_variables(ctx)}


def exported_variables(ctx: StageContext) -> dict[str, str]:
    """-x NAME and -x NAME=VALUE (flags.py): every process of the job gets them, horovodrun too, which hands its
    environment to every rank it starts, on every node. A bare NAME must be set here (with --spawn, the
    spawning command exported it to this node)."""
    out: dict[str, str] = {}
    for name, value in ctx.option(EXPORTS) or ():
        if value is None and name not in ctx.env:
            raise ConfigError(f"-x {name}: {name} is not set here; set it, or give -x {name}=VALUE")
        out[name] = ctx.env[name] if value is None else value
    return out


def single_slot(ctx: StageContext) -> bool:
    return bool(ctx.option("auto")) and ctx.cluster.num_nodes == 1 and ctx.cluster.local_slots <= 1


def _autotune_log(ctx: StageContext) -> str:
    given = ctx.option("autotune_log_file")
    if given:
        return str(given)
    return os.path.join(os.path.abspath(ctx.option("log_dir") or "."), "horovod_autotune_log.csv")


@hookimpl
def detlaunch_chief_stage(ctx: StageContext) -> Stage:
    c = ctx.cluster
    check_launcher_args(TABLE, ctx.launcher_args, "horovodrun")
    if single_slot(ctx):
        return Stage(commands=(Command(ctx.rank_command, name="rank", env={"DETLAUNCH_RANK": "0"}),))
    multi = c.num_nodes > 1
    check_build(str(ctx.option("controller", "gloo")))
    addrs = c.require_addresses(NAME) if multi else (c.node_addr or "localhost",)
    layout = SshLayout.for_job(ctx)
    argv = create_run_command(
        c.slots, addrs, ssh_port=layout.port, start_timeout=int(ctx.option("start_timeout")),
        gloo_timeout=ctx.option("gloo_timeout", GLOO_TIMEOUT_SECONDS),
        network_interface=ctx.option("network_interface"), autotune=bool(ctx.option("autotune")),
        autotune_log_file=_autotune_log(ctx), fusion_threshold_mb=ctx.option("fusion_threshold_mb"),
        cycle_time_ms=ctx.option("cycle_time_ms"), debug=bool(ctx.option("debug")),
        optional_args=ctx.launcher_args,
    )
    # The seed ends the command with "--"; horovodrun 0.28 hands that "--" on to `env` in each
    # rank's command line, which then fails with exit 127. The rank command starts with an
    # absolute path, so horovodrun cannot mistake it for one of its options.
    # horovodrun runs as `python -m detlaunch_horovod.horovodrun` (horovodrun.py): the same run, with its
    # imports and its build probe done at import, so that with restarts on the next attempt's waits past them.
    controller = str(ctx.option("controller", "gloo"))
    argv = [sys.executable, "-m", HOROVODRUN_MODULE, *argv[1:-1]]
    # Naming the controller spares horovodrun its probe for an MPI build (seconds at every start).
    argv.append(f"--{controller}")
    # The seed: SIGINT, since horovodrun misbehaves on SIGTERM.
    # And it waits out detlaunch's grace period before it SIGKILLs a rank (grace.py).
    env = {PROBE_ENV: controller, GRACE_ENV: f"{float(ctx.option('grace_period') or 0):g}"}
    horovodrun = Command((*argv, *ctx.rank_command), name="horovodrun", stop_signal=signal.SIGINT,
                         env=env, standby=f"{HOROVODRUN_MODULE}:main")
    # SLURM_JOBID would make horovod/mpirun ignore -H and pack every rank here.
    unset = ("SLURM_JOBID",)
    if not multi:
        return Stage(commands=(horovodrun,), unset_env=unset)
    return ssh_client_parts(ctx, list(range(1, c.num_nodes)), layout).stage(horovodrun, unset_env=unset)


@hookimpl
def detlaunch_worker_stage(ctx: StageContext) -> Stage:
    return sshd_parts(ctx).stage()
