"""Every launcher the bench compares, one small function each: how it runs `n` ranks of a script.

Each function takes (n, script, job) and returns the argv; `script` is a Python script
and its arguments, `job` is a scratch folder of this run. A function raises NotAvailable
when it cannot run here (a detlaunch layer that does not load yet, a missing tool).
A new case is one more function in LAUNCHERS.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from .common import DET_PY, DETLAUNCH, PY, VENV, NotAvailable, detlaunch_layer, free_port

Launcher = Callable[[int, list[str], Path, dict[str, str]], list[str]]


def _detlaunch(layer: str, n: int, script: list[str], env: dict[str, str], *extra: str) -> list[str]:
    argv = ["--nproc-per-node", str(n), *extra, *script]
    detlaunch_layer(layer, env, argv)
    return [DETLAUNCH, "--layer", layer, *argv]


def detlaunch_torchrun(n: int, script: list[str], job: Path, env: dict[str, str]) -> list[str]:
    return _detlaunch("torchrun", n, script, env, "--master-port", str(free_port()))


def detlaunch_horovod(n: int, script: list[str], job: Path, env: dict[str, str]) -> list[str]:
    return _detlaunch("horovod", n, script, env)


def detlaunch_deepspeed(n: int, script: list[str], job: Path, env: dict[str, str]) -> list[str]:
    return _detlaunch("deepspeed", n, script, env, "--master-port", str(free_port()))


def bare_torchrun(n: int, script: list[str], job: Path, env: dict[str, str]) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(n),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--max-restarts", "0", *script]


def bare_deepspeed(n: int, script: list[str], job: Path, env: dict[str, str]) -> list[str]:
    return [str(VENV / "bin" / "deepspeed"), "--num_gpus", str(n), "--master_port", str(free_port()),
            "--no_local_rank", *script]


def bare_horovodrun(n: int, script: list[str], job: Path, env: dict[str, str]) -> list[str]:
    return [str(VENV / "bin" / "horovodrun"), "-np", str(n), "-H", f"localhost:{n}", "--gloo", PY, *script]


def mpirun(n: int, script: list[str], job: Path, env: dict[str, str]) -> list[str]:
    exe = shutil.which("mpirun")
    if not exe:
        raise NotAvailable("mpirun not installed (apt: openmpi-bin)")
    return [exe, "--allow-run-as-root", "--oversubscribe", "-np", str(n),
            "--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo", PY, *script]


def determined_chain(n: int, script: list[str], job: Path, env: dict[str, str]) -> list[str]:
    """Determined's torch_distributed layer: pid_server -> torchrun -> pid_client -> wrap_rank -> script.

    As determined/launch/torch_distributed.py builds it (pid_server --on-fail SIGTERM --on-exit WAIT),
    with torchrun from our venv and Determined's helpers from its own.
    """
    if not os.access(DET_PY, os.X_OK):
        raise NotAvailable("Determined's venv is missing (bench/run.sh makes it)")
    sock = str(job / "pid_server.sock")
    return [DET_PY, "-m", "determined.exec.pid_server", "--on-fail", "SIGTERM", "--on-exit", "WAIT", sock, str(n),
            "--", PY, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(n),
            "--node-rank", "0", "--max-restarts", "0", "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), "--no-python",
            DET_PY, "-m", "determined.exec.pid_client", sock, "--",
            DET_PY, "-m", "determined.launch.wrap_rank", "RANK", "--", PY, *script]


LAUNCHERS: dict[str, Launcher] = {
    "detlaunch --layer torchrun": detlaunch_torchrun,
    "bare torchrun": bare_torchrun,
    "detlaunch --layer horovod": detlaunch_horovod,
    "bare horovodrun --gloo": bare_horovodrun,
    "detlaunch --layer deepspeed": detlaunch_deepspeed,
    "bare deepspeed": bare_deepspeed,
    "mpirun": mpirun,
    "Determined pid_server chain": determined_chain,
}
# detlaunch's layer vs the launcher it wraps, for the overhead ratios
PAIRS = {
    "detlaunch --layer torchrun": "bare torchrun",
    "detlaunch --layer horovod": "bare horovodrun --gloo",
    "detlaunch --layer deepspeed": "bare deepspeed",
}
