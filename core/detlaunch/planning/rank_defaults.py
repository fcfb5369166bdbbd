"""Variables every rank gets unless the user or its launcher set them, whatever the layer.

- ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``: what torchrun's agent gives its workers
  (torch/distributed/elastic/agent/server/local_elastic_agent.py: ``os.getenv(name, str(1))``; torch's
  own default when it is unset is 3). The ranks of horovod, deepspeed and third-party layers then
  handle a NCCL error or timeout as torchrun's do: the watchdog aborts the communicators and takes
  the process down, which the report reads (native_errors.py).
- ``TORCHINDUCTOR_CACHE_DIR``: ``torch.compile``'s caches. torch puts them under the temp dir
  (torch/_inductor/runtime/cache_dir_utils.py: ``$TMPDIR/torchinductor_$USER``), and a rank's TMPDIR
  is the job's private folder (torchrun and direct layers), new and removed with every job: every job
  compiled from cold, minutes on a large model. The ranks get a persistent, private folder instead,
  under the user's own cache dir (``$XDG_CACHE_HOME`` or ``~/.cache``)/detlaunch/torch-compile, never a
  predictable path in a shared temp dir; the supervisor makes it 0700 and checks it is the user's own.
  Triton's cache follows (inductor keeps it in ``<that folder>/triton/<device>``; Triton on its own
  uses ``~/.triton/cache``, already persistent), so ``TRITON_CACHE_DIR`` is left as the user has it.

The supervisor of each node hands them to its ranks' wrappers, which set each one only where the
rank's environment does not have it (a value the user exported, or a launcher's ``-x``, wins).
Pure: the dry run shows them, nothing here touches the disk.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

NCCL_ERROR_HANDLING_ENV = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
NCCL_ERROR_HANDLING = "1"  # torchrun's value (local_elastic_agent.py)
COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def user_cache_dir(env: Mapping[str, str]) -> str:
    """The user's cache dir: $XDG_CACHE_HOME when it is an absolute path (the XDG rule), else ~/.cache."""
    xdg = env.get("XDG_CACHE_HOME", "")
    return xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")


def compile_cache_dir(env: Mapping[str, str]) -> str:
    return os.path.join(user_cache_dir(env), "detlaunch", "torch-compile")


def rank_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """What the ranks get where unset, for a detlaunch started in `env` (a variable set there is the user's)."""
    defaults = {}
    if NCCL_ERROR_HANDLING_ENV not in env:
        defaults[NCCL_ERROR_HANDLING_ENV] = NCCL_ERROR_HANDLING
    if COMPILE_CACHE_ENV not in env:
        defaults[COMPILE_CACHE_ENV] = compile_cache_dir(env)
    return defaults
