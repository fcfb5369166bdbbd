"""deepspeed's compiled ops on this node: prebuilt, cached, or compiled by the first rank that needs them.

Why a ZeRO job "hangs" on CPU after "deepspeed_shm_comm_op built successfully": the first
``deepspeed.initialize`` with an Adam optimizer needs deepspeed's CPU Adam op (``fused_adam`` on
the CPU accelerator, ``cpu_adam`` for DeepSpeedCPUAdam). Unless deepspeed was installed with it
prebuilt, one rank compiles it with ninja, silently (about 70 s on an idle 2-core machine, minutes
on a busy one) while the others wait on torch's build lock. The result is cached in the torch
extensions folder; a private XDG_CACHE_HOME (a test sandbox) means a fresh compile every time. And
a build killed midway leaves its ``lock`` file behind: torch's FileBaton then waits for it forever,
with bare deepspeed too. Reading all of this imports neither deepspeed nor torch.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import os
from collections.abc import Mapping

ADAM_OPS = ("fused_adam", "cpu_adam")
PREBUILD = ("prebuild it: DS_BUILD_FUSED_ADAM=1 DS_BUILD_CPU_ADAM=1 pip install --no-build-isolation "
            "--force-reinstall deepspeed, or give the optimizer \"torch_adam\": true")


def torch_extensions_dir(env: Mapping[str, str]) -> str:
    """Where torch caches JIT-built ops (torch.utils.cpp_extension's rule)."""
    if env.get("TORCH_EXTENSIONS_DIR"):
        return env["TORCH_EXTENSIONS_DIR"]
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "torch_extensions")


def build_locks(env: Mapping[str, str]) -> list[str]:
    """The build lock files in the torch extensions folder (one per op being built, or left by a killed build)."""
    return sorted(glob.glob(os.path.join(torch_extensions_dir(env), "*", "*", "lock")))


def prebuilt_ops() -> set[str]:
    """The ops deepspeed was installed with (its git_version_info_installed.py), without importing it."""
    spec = importlib.util.find_spec("deepspeed")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            with open(os.path.join(folder, "git_version_info_installed.py")) as f:
                text = f.read()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("installed_ops"):
                ops = ast.literal_eval(line.partition("=")[2].strip())
                return {name for name, built in ops.items() if built}
    return set()


def cached_ops(env: Mapping[str, str]) -> set[str]:
    """The ops already JIT-built in the torch extensions folder."""
    found = glob.glob(os.path.join(torch_extensions_dir(env), "*", "*", "*.so"))
    return {os.path.basename(os.path.dirname(path)) for path in found}


def lock_warning(path: str) -> str:
    return (f"torch's build lock {path} exists: an op is being built, or a killed build left it, and then "
            "every rank waits for it forever: remove it if no build is running")


def adam_note(env: Mapping[str, str]) -> str | None:
    """None when the CPU Adam op is ready; else what happens at the first ZeRO step (the fix: PREBUILD)."""
    ready = (prebuilt_ops() | cached_ops(env)) & set(ADAM_OPS)
    if ready:
        return None
    return (f"neither prebuilt nor cached in {torch_extensions_dir(env)}: the first deepspeed.initialize with an "
            "Adam optimizer compiles it, silently, for a minute or more")
