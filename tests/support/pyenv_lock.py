"""The pyenv rehash lock a killed shell leaves behind, taken away again.

On a machine whose shell startup runs ``pyenv init`` (root's ~/.bashrc here), every bash an ssh
session starts (a job's per-job sshd: horovodrun, pdsh) rehashes pyenv's shims under a lock file,
``$PYENV_ROOT/shims/.pyenv-shim``, removed by a shell trap when the rehash ends. Tests SIGKILL nodes
and whole jobs; a shell killed in that fraction of a second leaves the lock, and from then on every
new bash on the machine waits PYENV_REHASH_TIMEOUT (60 s) for it, then gives up: each ssh-based job
of the rest of the run (and of anyone else) takes a minute more per shell.

`remove_if_left_by_this_run` takes the lock away only when this run is the one that left it (made
after the run started) and pyenv itself counts it as stale (older than its 60 s timeout: every
waiting rehash has given up on it, and a real rehash takes well under a second).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

REHASH_TIMEOUT = 60  # pyenv-rehash's PYENV_REHASH_TIMEOUT default: a lock older than this is stale to pyenv too


def lock_path(env: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    return Path(env.get("PYENV_ROOT") or Path.home() / ".pyenv") / "shims" / ".pyenv-shim"


def remove_if_left_by_this_run(run_started: float, lock: Path | None = None, now: float | None = None) -> bool:
    """Remove the rehash lock if it was made after `run_started` (time.time()) and is stale; True if it did."""
    lock = lock or lock_path()
    try:
        made = lock.stat().st_mtime
    except OSError:
        return False
    if made < run_started or (now or time.time()) - made <= REHASH_TIMEOUT + 5:
        return False
    lock.unlink(missing_ok=True)
    return True
