"""Run discovery the way the CLI does: real plugins from their entry points, real firstresult order."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping

import pytest
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.config import Config, apply_defaults, build_parser, parse
from detlaunch.planning.plugin_manager import Hooks, PluginSet
from detlaunch.testing.runner import MARKER_VAR

# Variables of the machine running the tests that would make a provider answer.
SCHEDULER_PREFIXES = ("SLURM_", "SLURMD_", "DET_", "PET_", "MASTER_", "JOBSET_", "TORCHELASTIC_")
SCHEDULER_NAMES = ("NNODES", "WORLD_SIZE", "RANK", "NODE_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE",
                   "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")


def clean_env(base: Mapping[str, str], **extra: str) -> dict[str, str]:
    """`base` without any scheduler variable, plus `extra`; CUDA_VISIBLE_DEVICES empty (no GPU here)."""
    env = {k: v for k, v in base.items()
           if not k.startswith(SCHEDULER_PREFIXES) and k not in SCHEDULER_NAMES
           and (not k.startswith("DETLAUNCH_") or k == MARKER_VAR)}  # the leak check's marker stays
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra)
    return env


def hooks_for(env: Mapping[str, str]) -> Hooks:
    plugins = PluginSet(env)
    plugins.load_plugins()
    plugins.check_hooks()
    return plugins.hooks


def config_for(hooks: Hooks, argv: list[str], env: Mapping[str, str]) -> Config:
    parser = build_parser()
    hooks.add_options(parser)
    apply_defaults(parser, env, {}, {}, None)
    ns, launcher_args, command = parse(parser, [*argv, "train.py"], env)
    return Config(layer="", command=tuple(command), launcher_args=tuple(launcher_args), options=vars(ns),
                  env=dict(env))


def discover(*argv: str, env: Mapping[str, str]) -> ClusterInfo:
    """What ``detlaunch`` discovers with these flags in this environment."""
    hooks = hooks_for(env)
    return hooks.discover_cluster(config_for(hooks, list(argv), env))


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port P with P+1 free too: torchrun's rendezvous and detlaunch's link port (P+1 by default)."""
    for _ in range(100):
        with socket.socket() as a:
            a.bind((host, 0))
            port = int(a.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind((host, port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free ports")



@pytest.fixture
def short_tmp() -> Iterator[str]:
    """A short private TMPDIR for real jobs (import this fixture into a test module to use it).

    The supervisor's socket lives in TMPDIR and an AF_UNIX path holds at most 107 bytes;
    pytest's tmp_path for a long test name leaves too little room.
    """
    path = tempfile.mkdtemp(prefix="dl-")
    yield path
    shutil.rmtree(path, ignore_errors=True)
