"""What differs from one attempt to the next for its ranks: the restart count in their environment,
and the folder their logs go to. Pure: no I/O.
"""

from __future__ import annotations

import os

RESTART_COUNT_ENV = "DETLAUNCH_RESTART_COUNT"
TORCHELASTIC_RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
TORCHELASTIC_MAX_RESTARTS_ENV = "TORCHELASTIC_MAX_RESTARTS"


def attempt_env(attempt: int, max_restarts: int | None = None) -> dict[str, str]:
    """Variables every rank of `attempt` (1 for the first) sees: the number of restarts so far.

    TORCHELASTIC_RESTART_COUNT too, for scripts written for torchrun (torchrun's own count is per
    node and its agent sets it in the workers' environment, over ours: the rank wrapper must set
    these in front of the rank). DETLAUNCH_MAX_RESTARTS is not set: it is detlaunch's own option
    variable and would configure a detlaunch nested in the job.
    """
    if attempt < 1:
        raise ValueError(f"attempts count from 1, not {attempt}")
    env = {RESTART_COUNT_ENV: str(attempt - 1), TORCHELASTIC_RESTART_COUNT_ENV: str(attempt - 1)}
    if max_restarts is not None:
        env[TORCHELASTIC_MAX_RESTARTS_ENV] = str(max_restarts)
    return env


def attempt_log_dir(log_dir: str, attempt: int, restarts_enabled: bool) -> str:
    """The folder for one attempt's logs under --log-dir: LOG_DIR/attempt-N, or LOG_DIR itself
    when restarts are off (rank-R.log stays where it always was, for every script reading it).

    With restarts on, the first attempt has its folder too: a job's layout follows its options,
    never its outcome, so a tool reading the logs needs no "did it restart?" branch.
    """
    return os.path.join(log_dir, f"attempt-{attempt}") if restarts_enabled else log_dir


def rank_log_path(log_dir: str, rank: int, attempt: int, restarts_enabled: bool) -> str:
    return os.path.join(attempt_log_dir(log_dir, attempt, restarts_enabled), f"rank-{rank}.log")
