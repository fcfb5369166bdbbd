"""The restart policy (policy.py), as pure data: every decision path, the backoff, what --dry-run shows."""

from __future__ import annotations

import random
from typing import Any

import detlaunch.exit_codes as exit_codes
import pytest
from detlaunch.outcome import AttemptEnd, RestartClass
from detlaunch.restarts.classify import USER_ERRORS
from detlaunch.restarts.options import policy_from_options
from detlaunch.restarts.policy import RestartDecision, RestartPolicy
from hypothesis import given
from hypothesis import strategies as st
from support import paths

pytestmark = pytest.mark.timeout(60)


def end(attempt: int = 1, restart_class: RestartClass | None = RestartClass.RANK_FAILED, exit_code: int = 1,
        cause: str = "ValueError: boom", **kw: Any) -> AttemptEnd:
    exception = cause.split(":")[0] if ":" in cause else ""
    return AttemptEnd(attempt=attempt, restart_class=restart_class, exit_code=exit_code,
                      signature=f"exit {exit_code}: {cause}",
                      what=f"rank 1 on node 0 (127.0.0.1) exited with code {exit_code}", exception=exception, **kw)


def decide(policy: RestartPolicy, *history: AttemptEnd) -> RestartDecision:
    return policy.decide(history, random.Random(1))


# -- decisions -------------------------------------------------------------------------------


def test_restarts_are_off_by_default() -> None:
    d = decide(RestartPolicy(), end())
    assert not d.restart and d.why == "restarts are off (--max-restarts 0): not restarting"
    assert not RestartPolicy().enabled


def test_a_failed_rank_restarts_with_the_count_and_the_wait_in_one_line() -> None:
    d = decide(RestartPolicy(max_restarts=3), end())
    assert d.restart and d.next_attempt == 2
    assert 0.5 <= d.delay <= 1.0
    assert d.why == f"restart 1 of 3 in {d.delay:.1f} s"


def test_the_budget_is_one_count_for_the_job() -> None:
    p = RestartPolicy(max_restarts=2)
    history = [end(1, cause="ValueError: a"), end(2, cause="ValueError: b"), end(3, cause="ValueError: c")]
    assert decide(p, *history[:2]).why.startswith("restart 2 of 2")
    d = decide(p, *history)
    assert not d.restart and d.why == "all 2 restarts used: not restarting"


@pytest.mark.parametrize(("last", "why"), [
    (end(restart_class=RestartClass.USER_ERROR, cause="ModuleNotFoundError: No module named 'x'"),
     "ModuleNotFoundError is a user error: not restarting (--restart-on ModuleNotFoundError retries it)"),
    (end(restart_class=RestartClass.USER_ERROR, exit_code=2, cause="usage"),
     "exit code 2 is bad usage: not restarting (--restart-on 2 retries it)"),
    (end(restart_class=RestartClass.START_FAILURE, cause="never started"),
     "the job failed before any rank started: not restarting (--restart-on start-failure retries it)"),
    (end(restart_class=RestartClass.NO_RESTART, exit_code=64, cause="x"),
     "exit code 64 asks not to be restarted: not restarting"),
    (end(restart_class=RestartClass.INTERRUPTED, exit_code=130, cause="x"), "interrupted by a signal: not restarting"),
])
def test_failures_that_a_restart_cannot_fix_are_not_retried(last: AttemptEnd, why: str) -> None:
    d = decide(RestartPolicy(max_restarts=5), last)
    assert (d.restart, d.why) == (False, why)


@pytest.mark.parametrize("restart_class", [RestartClass.HANG, RestartClass.NODE_LOST, RestartClass.RANK_FAILED])
def test_hangs_lost_nodes_and_failed_ranks_are_retried(restart_class: RestartClass) -> None:
    assert decide(RestartPolicy(max_restarts=1), end(restart_class=restart_class)).restart


def test_restart_on_and_no_restart_on_override_the_defaults() -> None:
    user_error = end(restart_class=RestartClass.USER_ERROR, cause="ImportError: libfoo.so: cannot open")
    assert decide(RestartPolicy(max_restarts=1, restart_on=("ImportError",)), user_error).restart
    assert decide(RestartPolicy(max_restarts=1, restart_on=("user-error",)), user_error).restart
    assert decide(RestartPolicy(max_restarts=1, restart_on=(1,)), user_error).restart
    not_started = end(restart_class=RestartClass.START_FAILURE, cause="x")
    assert decide(RestartPolicy(max_restarts=1, restart_on=("start-failure",)), not_started).restart

    p = RestartPolicy(max_restarts=3, no_restart_on=("ValueError",))
    assert decide(p, end()).why == "ValueError is in --no-restart-on: not restarting"
    p = RestartPolicy(max_restarts=3, no_restart_on=(3,))
    assert decide(p, end(exit_code=3)).why == "exit code 3 is in --no-restart-on: not restarting"
    assert decide(p, end(exit_code=4)).restart
    p = RestartPolicy(max_restarts=3, no_restart_on=("hang",))
    assert decide(p, end(restart_class=RestartClass.HANG)).why == "hang is in --no-restart-on: not restarting"


def test_exit_codes_and_classes_apply_to_a_ranks_own_end_only() -> None:
    # A lost node or a job that never started ends with detlaunch's exit code 1, not the script's.
    p = RestartPolicy(max_restarts=2, no_restart_on=(1,), restart_on=(7,))
    assert decide(p, end(restart_class=RestartClass.NODE_LOST, cause="node 1 lost")).restart
    assert not decide(p, end(exit_code=1)).restart
    not_started = end(restart_class=RestartClass.START_FAILURE)
    assert not decide(RestartPolicy(max_restarts=2, restart_on=(1,)), not_started).restart


def test_a_dotted_exception_matches_by_its_full_or_its_short_name() -> None:
    oom = end(cause="torch.OutOfMemoryError: CUDA out of memory")
    assert not decide(RestartPolicy(max_restarts=1, no_restart_on=("OutOfMemoryError",)), oom).restart
    assert not decide(RestartPolicy(max_restarts=1, no_restart_on=("torch.OutOfMemoryError",)), oom).restart


def test_an_exit_code_or_an_exception_is_more_specific_than_a_restart_class() -> None:
    # Restart only on exit code 3: every failed rank refused, but 3 allowed.
    p = RestartPolicy(max_restarts=2, no_restart_on=("rank-failed",), restart_on=(3,))
    assert decide(p, end(exit_code=3)).restart
    assert not decide(p, end(exit_code=1)).restart


def test_a_signal_kill_matches_its_signal_name() -> None:
    p = policy_from_options({"max_restarts": 2, "no_restart_on": "SIGKILL"})
    killed = end(exit_code=137, cause="killed by SIGKILL")
    assert decide(p, killed).why == "exit code 137 is in --no-restart-on: not restarting"


def test_the_crash_loop_breaker_stops_the_same_failure_twice_in_a_row() -> None:
    p = RestartPolicy(max_restarts=5)
    d = decide(p, end(1), end(2))
    assert not d.restart
    assert d.why == "attempt 2 failed the same way as attempt 1 (ValueError: boom): not restarting (crash loop)"
    # Different in between: not a loop.
    assert decide(p, end(1), end(2, cause="OSError: disk full"), end(3)).restart
    # The limit is configurable, and 0 turns it off.
    p3 = RestartPolicy(max_restarts=5, crash_loop_limit=3)
    assert decide(p3, end(1), end(2)).restart
    assert decide(p3, end(1), end(2), end(3)).why.startswith("attempts 1-3 failed the same way (ValueError: boom)")
    assert decide(RestartPolicy(max_restarts=5, crash_loop_limit=0), end(1), end(2), end(3)).restart


def test_the_breaker_also_guards_failures_the_user_asked_to_retry() -> None:
    p = RestartPolicy(max_restarts=5, restart_on=("ImportError",))
    imp = [end(n, restart_class=RestartClass.USER_ERROR, cause="ImportError: x") for n in (1, 2)]
    assert decide(p, imp[0]).restart
    assert decide(p, *imp).why.endswith("(crash loop)")


def test_lost_nodes_have_their_own_count_and_are_never_a_crash_loop() -> None:
    p = RestartPolicy(max_restarts=1, max_node_restarts=2)
    lost = [end(n, restart_class=RestartClass.NODE_LOST, cause="node 1 lost") for n in (1, 2, 3)]
    d = decide(p, lost[0], lost[1])
    assert d.restart and d.why.startswith("restart 2 of 2 (a lost node: not counted against --max-restarts)")
    assert decide(p, *lost).why == "all 2 restarts after a lost node used: not restarting"
    # Two lost nodes did not spend the one restart left for the code's own failures.
    assert decide(p, lost[0], lost[1], end(3)).why.startswith("restart 1 of 1")
    assert RestartPolicy(max_restarts=3).node_restarts == 3
    assert not decide(RestartPolicy(max_restarts=3, max_node_restarts=0), lost[0]).restart


def test_a_finished_attempt_ends_the_job() -> None:
    d = decide(RestartPolicy(max_restarts=2), end(1), end(2, restart_class=None, exit_code=0))
    assert (d.restart, d.why) == (False, "attempt 2 finished")
    with pytest.raises(ValueError):
        decide(RestartPolicy())


# -- backoff ---------------------------------------------------------------------------------


@given(initial=st.floats(0, 100), factor=st.floats(1, 10), cap=st.floats(0, 600), jitter=st.floats(0, 1),
       restart=st.integers(1, 10_000), seed=st.integers(0, 2**32))
def test_backoff_is_within_zero_and_the_cap(initial: float, factor: float, cap: float, jitter: float,
                                            restart: int, seed: int) -> None:
    p = RestartPolicy(backoff_initial=min(initial, cap), backoff_factor=factor, backoff_cap=cap, backoff_jitter=jitter)
    assert 0.0 <= p.backoff(restart, random.Random(seed)) <= cap


class FixedRng:
    """A generator that always draws the same number: one point of the jitter's distribution."""

    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


@given(initial=st.floats(0, 10), factor=st.floats(1, 4), cap=st.floats(10, 100), jitter=st.floats(0, 1),
       u=st.floats(0, 1, exclude_max=True), restart=st.integers(1, 2000))
def test_backoff_never_shrinks_for_the_same_draw(initial: float, factor: float, cap: float, jitter: float,
                                                 u: float, restart: int) -> None:
    """Non-decreasing for every draw of the jitter, so non-decreasing in expectation too."""
    p = RestartPolicy(backoff_initial=initial, backoff_factor=factor, backoff_cap=cap, backoff_jitter=jitter)
    assert p.backoff(restart, FixedRng(u)) <= p.backoff(restart + 1, FixedRng(u)) <= cap


def test_backoff_with_a_seeded_rng() -> None:
    p = RestartPolicy(backoff_initial=1.0, backoff_factor=2.0, backoff_cap=5.0, backoff_jitter=0.5)
    draws = random.Random(42)
    expected = [base * (1 - 0.5 * draws.random()) for base in (1, 2, 4, 5, 5)]
    rng = random.Random(42)
    assert [p.backoff(k, rng) for k in (1, 2, 3, 4, 5)] == pytest.approx(expected)
    assert 0.5 <= expected[0] <= 1 and 2.5 <= expected[-1] <= 5
    assert RestartPolicy(backoff_jitter=0.0).backoff(2, FixedRng(0.9)) == 2.0  # no jitter: exact
    assert RestartPolicy(backoff_jitter=1.0).backoff(2, FixedRng(0.999)) < 0.01  # full jitter reaches 0
    assert RestartPolicy(backoff_initial=0.0).backoff(9, rng) == 0.0


# -- data shown by --dry-run, the report, logs, environment -----------------------------------


def test_the_policy_is_data() -> None:
    j = RestartPolicy(max_restarts=2, no_restart_on=("ValueError",)).to_json()
    assert j["max_restarts"] == 2 and j["max_node_restarts"] == 2 and j["no_restart_on"] == ["ValueError"]
    assert j["retried_by_default"] == ["hang", "node-lost", "rank-failed"]
    assert "ModuleNotFoundError" in j["user_errors"] and j["no_restart_exit_code"] == 64
    assert RestartPolicy().describe() == ["restarts: off (--max-restarts 0): the first failure ends the job"]
    text = "\n".join(RestartPolicy(max_restarts=2, no_restart_on=("ValueError",)).describe())
    assert "at most 2 after failures, 2 after lost nodes" in text
    assert "--no-restart-on ValueError" in text
    assert "restart 1 after 0.5-1 s, restart 2 after 1-2 s, restart 3 after 2-4 s" in text


def test_the_user_docs_say_what_the_policy_does() -> None:
    doc = (paths.DOCS / "RESTARTS.md").read_text()
    for restart_class in RestartClass:
        assert f"| `{restart_class.value}` |" in doc, f"docs/RESTARTS.md does not describe {restart_class.value}"
    for name in USER_ERRORS:
        assert f"`{name}`" in doc, f"docs/RESTARTS.md does not list the user error {name}"
    assert f"exits with {exit_codes.NO_RESTART}: `sys.exit({exit_codes.NO_RESTART})`" in doc
    d = RestartPolicy()
    assert f"(default {d.backoff_initial:g} s)" in doc and f"(default {d.backoff_cap:g} s)" in doc
    shown = RestartPolicy(max_restarts=3).describe()
    assert f"    {shown[0]}\n" in doc and f"    {shown[2]}\n" in doc and f"    {shown[3]}\n" in doc
