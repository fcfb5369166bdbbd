"""horovodrun's helper process for one rank, waiting out detlaunch's grace period before its SIGKILL.

When detlaunch stops horovodrun (gloo), horovodrun's helper for each rank (safe_shell_exec's middleman,
a process of its own) SIGTERMs the children of the rank's shell and SIGKILLs everything under them
GRACEFUL_TERMINATION_TIME_S (5 s) later: a rank saving a checkpoint on SIGTERM had 5 s, not
--grace-period. Here that wait is 5 s past the grace (DETLAUNCH_HOROVOD_GRACE, which the layer sets),
so detlaunch's deadline is the one that counts. horovodrun.py makes this the helper's entry point; the
helper is a new interpreter ("spawn"), which imports this small module and horovod's safe_shell_exec.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

GRACE_ENV = "DETLAUNCH_HOROVOD_GRACE"  # stays in the environment: each helper reads it
AFTER_GRACE = 5  # seconds


def termination_wait(default: float, env: Mapping[str, str]) -> float:
    """Seconds between the helper's SIGTERM and its SIGKILL: past detlaunch's grace, never under horovod's own."""
    try:
        grace = float(env.get(GRACE_ENV, ""))
    except ValueError:
        return default
    return max(default, math.ceil(grace) + AFTER_GRACE)


def exec_middleman(*args: Any) -> None:
    """safe_shell_exec's middleman, with the wait past the grace (its arguments are the middleman's)."""
    from horovod.runner.common.util import safe_shell_exec

    safe_shell_exec.GRACEFUL_TERMINATION_TIME_S = termination_wait(safe_shell_exec.GRACEFUL_TERMINATION_TIME_S,
                                                                   os.environ)
    safe_shell_exec._exec_middleman(*args)  # horovod's own: this is a new interpreter, nothing replaced it here
