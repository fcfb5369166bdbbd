"""What differs from one attempt to the next for its ranks (per_attempt.py): their restart count, their log folder."""

from __future__ import annotations

import pytest
from detlaunch.restarts.per_attempt import attempt_env, attempt_log_dir, rank_log_path

pytestmark = pytest.mark.timeout(10)


def test_log_paths_per_attempt_only_when_restarts_are_on() -> None:
    assert rank_log_path("logs", 3, 1, restarts_enabled=False) == "logs/rank-3.log"
    assert rank_log_path("logs", 3, 1, restarts_enabled=True) == "logs/attempt-1/rank-3.log"
    assert attempt_log_dir("/l", 2, restarts_enabled=True) == "/l/attempt-2"


def test_each_attempt_sees_its_restart_count() -> None:
    assert attempt_env(1) == {"DETLAUNCH_RESTART_COUNT": "0", "TORCHELASTIC_RESTART_COUNT": "0"}
    assert attempt_env(3, max_restarts=4) == {"DETLAUNCH_RESTART_COUNT": "2", "TORCHELASTIC_RESTART_COUNT": "2",
                                              "TORCHELASTIC_MAX_RESTARTS": "4"}
    with pytest.raises(ValueError):
        attempt_env(0)
