"""Run discovery the way the CLI does: real plugins from their entry points, real firstresult order."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping

import pytest
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.command_line import CommandLine
from detlaunch.planning.config import Config
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
    """The Config ``detlaunch info ARGV`` discovers with (no layer, no command to run)."""
    return CommandLine.read(argv, env).config(hooks, job=False)


def discover(*argv: str, env: Mapping[str, str]) -> ClusterInfo:
    """What ``detlaunch`` discovers with these flags in this environment."""
    hooks = hooks_for(env)
    return hooks.discover_cluster(config_for(hooks, list(argv), env))


@pytest.fixture
def short_tmp() -> Iterator[str]:
    """A short private TMPDIR for real jobs (import this fixture into a test module to use it).

    The supervisor's socket lives in TMPDIR and an AF_UNIX path holds at most 107 bytes;
    pytest's tmp_path for a long test name leaves too little room.
    """
    path = tempfile.mkdtemp(prefix="dl-")
    yield path
    shutil.rmtree(path, ignore_errors=True)
