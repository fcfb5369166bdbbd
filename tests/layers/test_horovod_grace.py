"""horovodrun's helper waits out detlaunch's grace period before it SIGKILLs a rank (detlaunch_horovod/grace.py)."""

from __future__ import annotations

from detlaunch_horovod.grace import AFTER_GRACE, GRACE_ENV, termination_wait


def test_the_wait_is_past_the_grace_and_never_under_horovods_own() -> None:
    assert termination_wait(5, {GRACE_ENV: "30"}) == 30 + AFTER_GRACE
    assert termination_wait(5, {GRACE_ENV: "0.5"}) == 1 + AFTER_GRACE
    assert termination_wait(5, {GRACE_ENV: "0"}) == 5
    assert termination_wait(5, {}) == termination_wait(5, {GRACE_ENV: "x"}) == 5  # not set by the layer: horovod's
