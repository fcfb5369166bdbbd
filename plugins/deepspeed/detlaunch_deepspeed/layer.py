"""deepspeed layer: the seed's chain (harness/determined/launch/deepspeed.py) on detlaunch's public API.

- one node: supervisor -> ``deepspeed --num_gpus N --master_addr localhost --master_port P``
  -> rank_shim.py (puts ``--local_rank=N`` after the script, as deepspeed does) -> rank wrapper
  (rank from RANK) -> script.
- several nodes: every node's supervisor runs the per-job sshd. The chief waits for each of them
  (its own too: pdsh reaches the chief over ssh like any node), writes the hostfile and the env
  file into its private run directory, and runs ``deepspeed -H HOSTFILE --master_addr CHIEF
  --master_port P --no_ssh_check --launcher pdsh`` -> pdsh -> ssh -> each node's sshd ->
  deepspeed.launcher.launch -> rank_shim.py -> rank wrapper -> script. The ranks register
  with their own node's supervisor (DETLAUNCH_SSHD_SUPERVISOR, set by that node's sshd).

The runner (``deepspeed``) runs as ``python -m detlaunch_deepspeed.runner`` (runner.py: the
``deepspeed`` command's run), so that with restarts on the next attempt's waits past its imports
(a standby). Its one-node launch, deepspeed.launcher.launch, would be a new interpreter that
imports deepspeed (and torch) again at every start (~2 s): runner.py runs it in the runner's own
process, where those imports are done (same arguments, environment, output, exit code).

``--local_rank``: deepspeed's launcher passes ``--local_rank=N`` to the script, and many scripts
parse it (``deepspeed.initialize`` checks it against LOCAL_RANK). It puts it right after the
program it runs, which here is rank_shim.py: that moves it to right after the user's script and
execs the rank wrapper. ``--no-local-rank`` (deepspeed's ``--no_local_rank``) leaves it out. On
one node, deepspeed's runner exports MASTER_ADDR=127.0.0.1 whatever it is told; the shim puts
back the user's ``--master-addr``.

The env file. An ssh session starts with a bare environment, so every rank (the chief's too) gets
only what deepspeed exports from its env file (see envfile.py). deepspeed reads that file from a
fixed name, ``$DS_ENV_FILE`` or ``.deepspeed_env``, joined to the home and then the current
directory; os.path.join keeps an absolute DS_ENV_FILE as it is. So the file lives in the chief's
private run directory (0700, random name, removed at the end) and DS_ENV_FILE points at it: never
in the user's directories, where two jobs would overwrite each other's and a crash would leave it
behind. It is written by a step the chief's supervisor runs just before deepspeed, from the
environment deepspeed really gets (a stage hook sees only the user's, not what detlaunch and other
plugins add). deepspeed puts every exported value on pdsh's command line, visible in ``ps`` on
the chief, as it does without detlaunch. What the file leaves out as node-local comes from each
node's own sshd (detlaunch.ssh): its supervisor's socket, and the node's own CUDA_VISIBLE_DEVICES,
which rank_shim.py puts back after deepspeed's launch has overwritten it with slot indices.
Devices picked with ``--include host:1,3`` (resources.py) narrow that node's own list first, as if its
detlaunch had been started with them (``picked_devices_env``).

Stopping: deepspeed's runner answers SIGINT/SIGTERM by running ``pkill -f <python> -u -m
deepspeed.launcher.launch`` on every host through pdsh, which kills every deepspeed job on those
machines, not only this one. So the runner is stopped with SIGKILL, which it cannot catch: the
supervisors stop the ranks through their wrappers, the sshd sessions with sshd, and the other
nodes through the job link.

Importing this module imports neither deepspeed nor torch (deepspeed takes seconds to import).
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

from detlaunch import (
    Check,
    Command,
    Config,
    ConfigError,
    RankWrapper,
    Stage,
    StageContext,
    check_port_free,
    cuda_visible_devices,
    hookimpl,
)
from detlaunch.launcher_flags import add_launcher_flags, check_launcher_args
from detlaunch.ssh import SshLayout, SshParts, add_ssh_options, ssh_client_parts, ssh_port_check, sshd_parts

from . import envfile, ops, rank_shim, resources
from .envfile import DENY, parse_version, quoting_for
from .flags import TABLE

NAME = "deepspeed"
RUNNER_MODULE = "detlaunch_deepspeed.runner"  # runner.py, written out: importing it imports deepspeed
# Multi-node needs DS_ENV_FILE (so that the env file can live in a private folder rather than in
# the user's current or home directory); 0.15.0 is the oldest release checked to have it.
MIN_MULTI_NODE_VERSION = (0, 15, 0)
# Device nodes that mean an accelerator deepspeed would pick on its own (NVIDIA, ROCm, Gaudi, Ascend).
ACCELERATOR_DEVICES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/accel/accel[0-9]*", "/dev/davinci[0-9]*")


# -- pure functions (unit-tested) ------------------------------------------------------------------


def check_deepspeed_version(version: tuple[int, ...], multi_machine: bool) -> None:
    """Refuse the versions the multi-node chain cannot work with (one line, saying what to do)."""
    if not multi_machine:
        return
    shown = ".".join(map(str, version))
    if (0, 6, 1) <= version[:3] <= (0, 6, 4):
        # The seed's check: these releases always run their own ssh check, without the
        # per-job ssh settings, and have no --no_ssh_check to skip it.
        raise ConfigError(f"deepspeed {shown} cannot run multi-node jobs under detlaunch: deepspeed 0.6.1 to "
                          "0.6.4 run an ssh check that cannot be skipped and fails with per-job ssh; "
                          "install deepspeed >= 0.15 (pip install -U deepspeed)")
    if version < MIN_MULTI_NODE_VERSION:
        raise ConfigError(f"deepspeed {shown} is too old for multi-node jobs under detlaunch: it reads its env "
                          "file only from the current or home directory (DS_ENV_FILE came later); "
                          "install deepspeed >= 0.15 (pip install -U deepspeed)")


def create_hostfile(host_slot_counts: Sequence[int], ip_addresses: Sequence[str]) -> str:
    """deepspeed's (MPI-style) hostfile: ``host slots=N`` per node, the chief first."""
    if len(host_slot_counts) != len(ip_addresses):
        raise ValueError("need one slot count per host")
    return "".join(f"{host} slots={slots}\n" for host, slots in zip(ip_addresses, host_slot_counts, strict=True))


def create_run_command(
    *,
    master_address: str,
    master_port: int,
    hostfile_path: str | None = None,
    num_gpus: int | None = None,
    optional_args: Sequence[str] = (),
    shim: bool = False,
    local_rank: bool = True,
) -> list[str]:
    """The deepspeed command, as the seed builds it (``deepspeed`` first; the rank command follows).

    With a hostfile, pdsh starts the ranks on every node; without, deepspeed starts them here.
    The seed's final ``--`` is left out: the rank command starts with an absolute path, so
    deepspeed cannot take it for one of its options. shim: the command runs rank_shim.py under
    Python (with ``--local_rank=N`` unless local_rank is False); without, as the seed does, it runs
    the rank command as it is, without ``--local_rank``.
    """
    cmd = ["deepspeed"]
    if hostfile_path is not None:
        cmd += ["-H", hostfile_path]
    elif num_gpus is not None:
        cmd += ["--num_gpus", str(num_gpus)]
    cmd += ["--master_addr", master_address, "--master_port", str(master_port)]
    if not shim:
        cmd += ["--no_python", "--no_local_rank"]
    elif not local_rank:
        cmd.append("--no_local_rank")
    if hostfile_path is not None:
        cmd += ["--no_ssh_check", "--launcher", "pdsh"]
    return cmd + list(optional_args)


def pdsh_ssh_args_append(existing: str | None, ssh_config: str, port: int) -> str:
    """PDSH_SSH_ARGS_APPEND: the user's value, then the per-job client config and port.

    pdsh runs ``ssh`` from PATH (the per-job wrapper, which already uses the config); these make
    the per-job settings win over the user's own -F/-p (for ssh the last -F and -p count), while
    the wrapper's leading ``-o StrictHostKeyChecking=yes`` wins over any later ``-o``.
    """
    ours = f"-F {shlex.quote(ssh_config)} -p {port}"
    return f"{existing.strip()} {ours}" if existing and existing.strip() else ours


def visible_devices(env: Mapping[str, str]) -> list[str]:
    """The devices CUDA_VISIBLE_DEVICES lists, as CUDA reads it (``0,-1,2`` is one); [] when unset."""
    return cuda_visible_devices(env) or []


def has_accelerator(env: Mapping[str, str], devices: Sequence[str]) -> bool:
    """Whether this node has a GPU (or other accelerator) for deepspeed to find by itself.

    devices: the accelerator device nodes present (see ACCELERATOR_DEVICES).
    """
    return bool(devices) or bool(visible_devices(env))


def accelerator_env(env: Mapping[str, str], devices: Sequence[str]) -> dict[str, str]:
    """DS_ACCELERATOR=cpu where there is no accelerator, unless the user chose one."""
    if "DS_ACCELERATOR" in env or has_accelerator(env, devices):
        return {}
    return {"DS_ACCELERATOR": "cpu"}


def network_env(env: Mapping[str, str]) -> dict[str, str]:
    """The seed: on GPUs, NCCL uses Determined's inter-node interface unless the user chose one."""
    nic = (env.get("DET_INTER_NODE_NETWORK_INTERFACE") or "").strip()
    if visible_devices(env) and nic and not (env.get("NCCL_SOCKET_IFNAME") or "").strip():
        return {"NCCL_SOCKET_IFNAME": nic}
    return {}


def node_devices_env(env: Mapping[str, str]) -> dict[str, str]:
    """This node's own CUDA_VISIBLE_DEVICES for rank_shim.py, which its sshd's sessions get (deepspeed's
    launch overwrites the variable itself); nothing where the node has none."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    return {} if value is None else {rank_shim.NODE_DEVICES: value}


def one_node_gpu_args(env: Mapping[str, str], devices: Sequence[str], slots: int) -> int | None:
    """--num_gpus for one node, or None to let deepspeed follow CUDA_VISIBLE_DEVICES.

    deepspeed ignores CUDA_VISIBLE_DEVICES when given --num_gpus (it would use GPUs 0..N-1, maybe
    another job's): on a node with GPUs and CUDA_VISIBLE_DEVICES, it must pick them itself.
    On CPU, --num_gpus is what sets the number of ranks (--include needs LOCAL_SIZE there).
    """
    visible = visible_devices(env)
    if not (devices and visible):
        return slots
    if len(visible) != slots:
        raise ConfigError(f"CUDA_VISIBLE_DEVICES lists {len(visible)} device(s) but this node runs {slots} "
                          f"rank(s): make them agree (--nproc-per-node {len(visible)})")
    return None


def picked_devices_env(ctx: StageContext) -> dict[str, str]:
    """This node's CUDA_VISIBLE_DEVICES where --include/--exclude/--num_gpus picked its devices (resources.py)."""
    slots = resources.node_devices(ctx.option(resources.DEVICES), ctx.cluster.node_addr)
    if slots is None:
        return {}
    own = cuda_visible_devices(ctx.env)
    shown = ctx.env.get("CUDA_VISIBLE_DEVICES", "")
    return {"CUDA_VISIBLE_DEVICES": resources.visible_devices_for(slots, own, shown)}


def with_picked_devices(ctx: StageContext) -> StageContext:
    """The stage's view of this node: its devices as picked, as if its detlaunch had been started with them."""
    picked = picked_devices_env(ctx)
    return ctx.replace(env={**ctx.env, **picked}) if picked else ctx


# -- what reads the machine ------------------------------------------------------------------------


def deepspeed_version() -> tuple[int, ...]:
    try:
        return parse_version(importlib.metadata.version("deepspeed"))
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError("the deepspeed layer needs deepspeed in this Python environment: "
                          "pip install 'detlaunch[deepspeed]'") from None


def accelerator_devices(globber: Callable[[str], list[str]] = glob.glob) -> list[str]:
    return [path for pattern in ACCELERATOR_DEVICES for path in globber(pattern)]


# -- hooks -----------------------------------------------------------------------------------------


PYTHON = re.compile(r"python[\d.]*$")
PYTHON_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def script_end(command: Sequence[str]) -> int:
    """The index right after the script in `command`, where deepspeed puts ``--local_rank=N``:
    after ``train.py`` in ``python -u train.py``, after ``pkg.train`` in ``python -m pkg.train``,
    after the program itself when it is not a Python interpreter."""
    if not command or not PYTHON.match(os.path.basename(command[0])):
        return 1
    i = 1
    while i < len(command):
        word = command[i]
        if word in ("-m", "-c"):
            return min(i + 2, len(command))
        if not word.startswith("-") or word == "-":
            return i + 1
        if word.startswith(("-m", "-c")) and not word.startswith("--"):
            return i + 1  # -mpkg.train
        i += 2 if word in PYTHON_OPTIONS_WITH_VALUE else 1
    return len(command)


def shim_args(ctx: StageContext, master_addr: str) -> tuple[str, ...]:
    """What deepspeed runs under Python in front of the rank command (see rank_shim.py): the shim,
    where the user's script ends in the rank command (python -u train.py: after train.py), and the
    MASTER_ADDR to put back ("-" for deepspeed's own)."""
    cmd = ctx.user_command
    at = len(ctx.rank_command) - len(cmd) + script_end(cmd)
    return (os.path.abspath(rank_shim.__file__), str(at), master_addr or "-")


def _launch_command(ctx: StageContext, argv: Sequence[str], master_addr: str = "",
                    env: Mapping[str, str] | None = None, over_pdsh: bool = False,
                    notes: Sequence[str] = ()) -> Command:
    # deepspeed's runner runs as `python -m detlaunch_deepspeed.runner` (runner.py), the `deepspeed` command's
    # run: with restarts on, the next attempt's waits past its imports (deepspeed and torch).
    # Over pdsh, the rank command and directory go as one word no remote shell changes (rank_shim.py).
    words = (rank_shim.encode_words(list(ctx.rank_command), os.getcwd()),) if over_pdsh else ctx.rank_command
    env = dict(env or {})
    if over_pdsh and shlex.quote(os.getcwd()) != os.getcwd():  # deepspeed's `cd DIR;` would break on it
        env[runner_cwd_env()] = "/"
    return Command((sys.executable, "-m", RUNNER_MODULE, *argv[1:], *shim_args(ctx, master_addr), *words),
                   name=NAME, stop_signal=signal.SIGKILL, env=env, standby=f"{RUNNER_MODULE}:main", notes=tuple(notes))


def runner_cwd_env() -> str:
    """The variable that runs deepspeed's runner from another directory (runner.py; written out: importing it
    imports deepspeed)."""
    return "DETLAUNCH_DS_RUNNER_CWD"


@hookimpl
def detlaunch_add_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("deepspeed layer")
    g.add_argument("--no-local-rank", action="store_true",
                   help="do not pass --local_rank=N to the script (deepspeed's --no_local_rank)")
    add_ssh_options(parser, NAME)
    add_launcher_flags(parser, TABLE, NAME)


def accelerator_check(env: Mapping[str, str]) -> Check:
    """deepspeed's accelerator as the ranks will get it (DS_ACCELERATOR=cpu where there is no GPU)."""
    for key, value in accelerator_env(env, accelerator_devices()).items():
        os.environ.setdefault(key, value)
    try:
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        detail = f"{accelerator.device_name()}, backend {accelerator.communication_backend_name()}"
    except Exception as e:  # whatever deepspeed raises is what the ranks would get
        return Check("deepspeed's accelerator", False, f"{type(e).__name__}: {e}", "set DS_ACCELERATOR (cpu, cuda...)")
    return Check("deepspeed's accelerator", True, detail)


@hookimpl
def detlaunch_doctor_checks(config: Config) -> list[Check]:
    env, o = config.env, config.options
    multi = bool((o.get("nnodes") or 1) > 1 or o.get("hostfile") or "," in str(o.get("hosts") or ""))
    where = "" if multi else " (only for jobs on several nodes)"
    checks = [Check.importable("torch", "pip install torch"),
              Check.importable("deepspeed", "pip install 'detlaunch[deepspeed]'")]
    if not checks[-1].ok:
        return checks
    checks.append(accelerator_check(env))
    note = ops.adam_note(env)
    checks.append(Check("deepspeed's CPU Adam op ready", note is None, note or "prebuilt or cached", ops.PREBUILD,
                        required=False))
    locks = ops.build_locks(env)
    checks.append(Check("no stale torch build lock", not locks, ", ".join(locks) or "none",
                        "remove the lock file if no build is running" if locks else "", required=False))
    checks += [Check.on_path(tool, f"apt-get install {package}{where}", env, required=multi,
                             also=("/usr/sbin", "/sbin") if tool == "sshd" else ())
               for tool, package in (("sshd", "openssh-server"), ("ssh", "openssh-client"), ("pdsh", "pdsh"))]
    return checks + ssh_port_check(config, required=multi)


def import_time_env(ctx: StageContext) -> dict[str, str]:
    """What deepspeed adds to its ranks' environment that is read at import (RankWrapper.warm_env): on several
    nodes its runner puts its current directory first on PYTHONPATH (deepspeed/launcher/runner.py), which the
    env file carries to every node; on one node, nothing (RANK, LOCAL_RANK, MASTER_*, CROSS_* are read later)."""
    if ctx.cluster.num_nodes == 1:
        return {}
    path = ctx.env.get("PYTHONPATH")
    return {"PYTHONPATH": os.path.abspath(".") + (f":{path}" if path is not None else "")}


@hookimpl
def detlaunch_rank_wrappers(ctx: StageContext) -> RankWrapper:
    return RankWrapper(rank_env=("RANK",), warm_env=import_time_env(ctx))


@hookimpl
def detlaunch_environment(ctx: StageContext) -> dict[str, str]:
    return {"USE_DEEPSPEED": "1", **accelerator_env(ctx.env, accelerator_devices()), **network_env(ctx.env),
            **picked_devices_env(ctx)}


def _master_port(ctx: StageContext) -> int:
    return int(ctx.option("master_port"))


def _warn_unexported(env: Mapping[str, str], quoting: str) -> None:
    """The writer runs under the supervisor, where its output is not shown: warn while planning."""
    _, skipped = envfile.env_file_lines(env, quoting)
    for name, reason in skipped:
        print(f"detlaunch: warning: deepspeed: not exporting {name} to the ranks: {reason}", file=sys.stderr)


@hookimpl
def detlaunch_chief_stage(ctx: StageContext) -> Stage:
    ctx = with_picked_devices(ctx)
    c = ctx.cluster
    check_launcher_args(TABLE, ctx.launcher_args, NAME)
    multi = c.num_nodes > 1
    version = deepspeed_version()
    check_deepspeed_version(version, multi)
    for lock in ops.build_locks(ctx.env):
        print(f"detlaunch: warning: deepspeed: {ops.lock_warning(lock)}", file=sys.stderr)
    port = _master_port(ctx)
    if not multi:
        master = ctx.option("master_addr") or "localhost"
        check_port_free("127.0.0.1" if master == "localhost" else master, port)
        argv = create_run_command(master_address=master, master_port=port,
                                  num_gpus=one_node_gpu_args(ctx.env, accelerator_devices(), c.local_slots),
                                  optional_args=ctx.launcher_args, shim=True,
                                  local_rank=not ctx.option("no_local_rank"))
        return Stage(commands=(_launch_command(ctx, argv, "" if master == "localhost" else master),))

    addrs = c.require_addresses(NAME)
    check_port_free(c.chief_addr, port)
    layout = SshLayout.for_job(ctx)
    client = ssh_client_parts(ctx, list(range(c.num_nodes)), layout)
    # The per-job client config is the one file ssh_client_parts writes (its ssh wrapper is an executable).
    ssh_config = next(path for path in client.files if path.startswith(layout.client_dir + os.sep))
    # The chief's own files, in its private run directory (0700, random name, removed at the end):
    # it is their only reader and writer.
    folder = os.path.join(ctx.run_dir, NAME)
    hostfile = os.path.join(folder, "hostfile")
    env_file = os.path.join(folder, "env")
    quoting = quoting_for(version)
    _warn_unexported(ctx.env, quoting)
    writer = (sys.executable, "-S", os.path.abspath(envfile.__file__), "--quoting", quoting,
              *[arg for pattern in DENY for arg in ("--deny", pattern)], "--replace", env_file)
    # The rank command crosses pdsh as one encoded word (rank_shim.py); this file says in words what it carries.
    shown = {os.path.join(folder, "rank-command"): shlex.join(ctx.rank_command) + "\n"}
    hosts = create_hostfile(c.slots, addrs)
    own = SshParts(dirs=(folder,), files={hostfile: hosts, **shown}, prelaunch=(writer,))
    argv = create_run_command(master_address=c.chief_addr, master_port=port, hostfile_path=hostfile,
                              optional_args=ctx.launcher_args, shim=True, local_rank=not ctx.option("no_local_rank"))
    env = {"DS_ENV_FILE": env_file,
           "PDSH_SSH_ARGS_APPEND": pdsh_ssh_args_append(ctx.env.get("PDSH_SSH_ARGS_APPEND"), ssh_config, layout.port)}
    launcher = _launch_command(ctx, argv, env=env, over_pdsh=True, notes=pdsh_notes(ctx, hosts))
    return (sshd_parts(ctx, layout, node_devices_env(ctx.env)) + client + own).stage(launcher)


def pdsh_notes(ctx: StageContext, hostfile: str) -> tuple[str, ...]:
    """What the dry run says under the runner on several nodes: the hostfile, and what every host runs."""
    moves = ctx.option("spares") or ctx.option("min_nodes")
    when = " (a later attempt on other nodes, a spare in a lost node's place or fewer nodes, writes its own)" \
        if moves else ""
    return (f"hostfile{when}: " + "; ".join(hostfile.splitlines()),
            "pdsh runs on every host of the hostfile, over that host's per-job sshd: deepspeed.launcher.launch, "
            "which starts rank_shim.py once per rank there",
            f"the --words= word, decoded: in {os.getcwd()}, {shlex.join(ctx.rank_command)}")


@hookimpl
def detlaunch_worker_stage(ctx: StageContext) -> Stage:
    ctx = with_picked_devices(ctx)
    return sshd_parts(ctx, env=node_devices_env(ctx.env)).stage()
