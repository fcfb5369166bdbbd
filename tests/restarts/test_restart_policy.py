"""The restart policy, as pure data: classification, every decision path, backoff, options, the report."""

from __future__ import annotations

import argparse
import random
import signal
import traceback
from collections.abc import Callable
from typing import Any

import pytest
from detlaunch.errors import ConfigError
from detlaunch.planning.config import Parser
from detlaunch.restarts.policy import (
    NO_RESTART_EXIT_CODE,
    USER_ERRORS,
    AttemptEnd,
    FailureClass,
    RestartDecision,
    RestartPolicy,
    add_restart_options,
    attempt_env,
    attempt_log_dir,
    classify,
    format_attempts,
    last_exception,
    policy_from_options,
    rank_log_path,
    signature,
)
from hypothesis import given
from hypothesis import strategies as st
from support import paths

pytestmark = pytest.mark.timeout(60)

RNG = random.Random(0)


def tail_of(raise_it: Callable[[], object]) -> list[str]:
    """The stderr lines a rank prints when `raise_it` raises uncaught: Python's own formatting."""
    try:
        raise_it()
    except BaseException as e:  # noqa: BLE001 - any exception is the point
        return "".join(traceback.format_exception(e)).splitlines()
    raise AssertionError("did not raise")


def import_missing() -> None:
    __import__("no_such_module_for_detlaunch_tests")


def compile_bad() -> None:
    compile("def f(:\n    pass\n", "train.py", "exec")


def use_undefined() -> None:
    exec("print(undefined_name_in_train)", {})


def boom() -> None:
    raise ValueError("boom")


def chained() -> None:
    try:
        import_missing()
    except ImportError:
        raise RuntimeError("could not load the model") from None


# What torch 2.13 ranks printed here (resume_ddp.py --crash-how raise under detlaunch's torchrun layer):
# once a process group exists, torch's excepthook prefixes every traceback line with "[rankN]: ".
TORCH_ROOT_CAUSE = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/wt/parts-13/tests/support/scripts/resume_ddp.py", line 37, in <module>
[rank1]:     train(options, comm)
[rank1]:   File "/work/wt/parts-13/tests/support/scripts/resumable.py", line 90, in crash
[rank1]:     raise RuntimeError(message)
[rank1]: RuntimeError: injected failure at step 3
""".splitlines()
GLOO_SURVIVOR = """\
[rank0]:   File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 979, in _engine_run_backward
[rank0]:     return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass
[rank0]:            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by \
peer [127.0.0.1]:14738. This is typically caused by a remote worker crashing. Check the logs of the remote worker \
before reporting an error. GLHF! 🏖️
""".splitlines()


def end(attempt: int = 1, kind: FailureClass | None = FailureClass.RANK_FAILED, exit_code: int = 1,
        cause: str = "ValueError: boom", **kw: Any) -> AttemptEnd:
    exception = cause.split(":")[0] if ":" in cause else ""
    return AttemptEnd(attempt=attempt, kind=kind, exit_code=exit_code, signature=f"exit {exit_code}: {cause}",
                      what=f"rank 1 on node 0 (127.0.0.1) exited with code {exit_code}", exception=exception, **kw)


def decide(policy: RestartPolicy, *history: AttemptEnd) -> RestartDecision:
    return policy.decide(history, random.Random(1))


# -- classification --------------------------------------------------------------------------


@pytest.mark.parametrize(("raise_it", "line"), [
    (import_missing, "ModuleNotFoundError: No module named 'no_such_module_for_detlaunch_tests'"),
    (compile_bad, "SyntaxError: invalid syntax"),
    (use_undefined, "NameError: name 'undefined_name_in_train' is not defined"),
    (boom, "ValueError: boom"),
    (chained, "RuntimeError: could not load the model"),
])
def test_last_exception_reads_pythons_own_tracebacks(raise_it: Callable[[], object], line: str) -> None:
    assert last_exception(tail_of(raise_it)) == line


def test_last_exception_reads_torchs_rank_prefixed_tracebacks() -> None:
    assert last_exception(TORCH_ROOT_CAUSE) == "RuntimeError: injected failure at step 3"
    # The header was cut off (the tail keeps 20 lines): the last exception-looking line.
    assert last_exception(GLOO_SURVIVOR).startswith("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo")


def test_last_exception_ignores_what_is_printed_after_the_traceback() -> None:
    after = [*tail_of(boom), "[W1201 08:40:12.123 ProcessGroupGloo.cpp:123] Warning: destroy_process_group() "
             "was not called", "Exception ignored in atexit callback"]
    assert last_exception(after) == "ValueError: boom"


def test_last_exception_without_the_header_takes_the_last_exception_looking_line() -> None:
    cut = tail_of(boom)[1:]  # the tail kept only the last lines: no "Traceback" header
    assert last_exception([*cut, "saving a last log line"]) == "ValueError: boom"
    assert last_exception(["epoch 3", "Loss: 0.25", "done"]) == ""  # "Loss: ..." is no exception


@pytest.mark.parametrize(("args", "kind"), [
    ({"exit_code": 1, "tail": tail_of(import_missing)}, FailureClass.USER_ERROR),
    ({"exit_code": 1, "tail": tail_of(compile_bad)}, FailureClass.USER_ERROR),
    ({"exit_code": 1, "tail": tail_of(use_undefined)}, FailureClass.USER_ERROR),
    ({"exit_code": 2, "tail": ["usage: train.py [-h]", "train.py: error: unrecognized arguments: --epoch"]},
     FailureClass.USER_ERROR),
    ({"exit_code": 1, "tail": tail_of(boom)}, FailureClass.RANK_FAILED),
    ({"exit_code": 1, "tail": GLOO_SURVIVOR}, FailureClass.RANK_FAILED),
    ({"exit_code": 137, "signal": signal.SIGKILL}, FailureClass.RANK_FAILED),
    ({"exit_code": 130, "signal": signal.SIGINT, "interrupted": True}, FailureClass.INTERRUPTED),
    ({"exit_code": NO_RESTART_EXIT_CODE}, FailureClass.NO_RESTART),
    ({"exit_code": 1, "started": False}, FailureClass.START_FAILURE),
    ({"exit_code": 1, "started": False, "tail": tail_of(import_missing)}, FailureClass.USER_ERROR),
    ({"exit_code": 1, "lost": True}, FailureClass.NODE_LOST),
    ({"exit_code": 1, "lost": True, "started": False}, FailureClass.NODE_LOST),
    ({"exit_code": 1, "hung": True}, FailureClass.HANG),
    ({"exit_code": 2, "interrupted": True}, FailureClass.INTERRUPTED),
])
def test_classify(args: dict[str, Any], kind: FailureClass) -> None:
    assert classify(args["exit_code"], args.get("signal"), args.get("tail", ()), args.get("started", True),
                    lost=args.get("lost", False), hung=args.get("hung", False),
                    interrupted=args.get("interrupted", False)) is kind


def test_the_no_restart_exit_code_is_configurable_and_can_be_off() -> None:
    assert classify(7, None, (), True, no_restart_exit_code=7) is FailureClass.NO_RESTART
    assert classify(NO_RESTART_EXIT_CODE, None, (), True, no_restart_exit_code=None) is FailureClass.RANK_FAILED
    # A signal is never the script asking: 128+N is how a kill reads.
    assert classify(137, signal.SIGKILL, (), True, no_restart_exit_code=137) is FailureClass.RANK_FAILED


def test_signature_is_how_it_ended_and_the_last_traceback_line() -> None:
    assert signature(1, None, tail_of(boom)) == "exit 1: ValueError: boom"
    assert signature(137, signal.SIGKILL, ()) == "killed by SIGKILL"
    # An object's address differs on every run; the same failure must compare equal.
    a = signature(1, None, ["ValueError: bad <Batch object at 0x7f3a1c2b4d90>"])
    assert a == signature(1, None, ["ValueError: bad <Batch object at 0x7f00deadbeef>"])
    assert signature(1, None, ["ValueError: bad step 3"]) != signature(1, None, ["ValueError: bad step 4"])
    # The same failure of another rank, or with another ephemeral port, is the same failure.
    assert signature(1, None, TORCH_ROOT_CAUSE) == "exit 1: RuntimeError: injected failure at step 3"
    other_port = [line.replace("14738", "40001") for line in GLOO_SURVIVOR]
    assert signature(1, None, GLOO_SURVIVOR) == signature(1, None, other_port)
    assert "[127.0.0.1]:?." in signature(1, None, GLOO_SURVIVOR)


def test_attempt_end_from_failure() -> None:
    e = AttemptEnd.from_failure(2, 1, None, tail_of(import_missing), "rank 0 exited with code 1", started=True)
    assert (e.attempt, e.kind, e.exception) == (2, FailureClass.USER_ERROR, "ModuleNotFoundError")
    assert e.cause == "ModuleNotFoundError: No module named 'no_such_module_for_detlaunch_tests'"


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
    (end(kind=FailureClass.USER_ERROR, cause="ModuleNotFoundError: No module named 'x'"),
     "ModuleNotFoundError is a user error: not restarting (--restart-on ModuleNotFoundError retries it)"),
    (end(kind=FailureClass.USER_ERROR, exit_code=2, cause="usage"),
     "exit code 2 is bad usage: not restarting (--restart-on 2 retries it)"),
    (end(kind=FailureClass.START_FAILURE, cause="never started"),
     "the job failed before any rank started: not restarting (--restart-on start-failure retries it)"),
    (end(kind=FailureClass.NO_RESTART, exit_code=64, cause="x"),
     "exit code 64 asks not to be restarted: not restarting"),
    (end(kind=FailureClass.INTERRUPTED, exit_code=130, cause="x"), "interrupted by a signal: not restarting"),
])
def test_failures_that_a_restart_cannot_fix_are_not_retried(last: AttemptEnd, why: str) -> None:
    d = decide(RestartPolicy(max_restarts=5), last)
    assert (d.restart, d.why) == (False, why)


@pytest.mark.parametrize("kind", [FailureClass.HANG, FailureClass.NODE_LOST, FailureClass.RANK_FAILED])
def test_hangs_lost_nodes_and_failed_ranks_are_retried(kind: FailureClass) -> None:
    assert decide(RestartPolicy(max_restarts=1), end(kind=kind)).restart


def test_restart_on_and_no_restart_on_override_the_defaults() -> None:
    user_error = end(kind=FailureClass.USER_ERROR, cause="ImportError: libfoo.so: cannot open")
    assert decide(RestartPolicy(max_restarts=1, restart_on=("ImportError",)), user_error).restart
    assert decide(RestartPolicy(max_restarts=1, restart_on=("user-error",)), user_error).restart
    assert decide(RestartPolicy(max_restarts=1, restart_on=(1,)), user_error).restart
    not_started = end(kind=FailureClass.START_FAILURE, cause="x")
    assert decide(RestartPolicy(max_restarts=1, restart_on=("start-failure",)), not_started).restart

    p = RestartPolicy(max_restarts=3, no_restart_on=("ValueError",))
    assert decide(p, end()).why == "ValueError is in --no-restart-on: not restarting"
    p = RestartPolicy(max_restarts=3, no_restart_on=(3,))
    assert decide(p, end(exit_code=3)).why == "exit code 3 is in --no-restart-on: not restarting"
    assert decide(p, end(exit_code=4)).restart
    p = RestartPolicy(max_restarts=3, no_restart_on=("hang",))
    assert decide(p, end(kind=FailureClass.HANG)).why == "hang is in --no-restart-on: not restarting"


def test_exit_codes_and_classes_apply_to_a_ranks_own_end_only() -> None:
    # A lost node or a job that never started ends with detlaunch's exit code 1, not the script's.
    p = RestartPolicy(max_restarts=2, no_restart_on=(1,), restart_on=(7,))
    assert decide(p, end(kind=FailureClass.NODE_LOST, cause="node 1 lost")).restart
    assert not decide(p, end(exit_code=1)).restart
    assert not decide(RestartPolicy(max_restarts=2, restart_on=(1,)), end(kind=FailureClass.START_FAILURE)).restart


def test_a_dotted_exception_matches_by_its_full_or_its_short_name() -> None:
    oom = end(cause="torch.OutOfMemoryError: CUDA out of memory")
    assert not decide(RestartPolicy(max_restarts=1, no_restart_on=("OutOfMemoryError",)), oom).restart
    assert not decide(RestartPolicy(max_restarts=1, no_restart_on=("torch.OutOfMemoryError",)), oom).restart


def test_an_exit_code_or_class_is_more_specific_than_a_kind() -> None:
    # Restart only on exit code 3: every failed rank refused, but 3 allowed.
    p = RestartPolicy(max_restarts=2, no_restart_on=("rank-failed",), restart_on=(3,))
    assert decide(p, end(exit_code=3)).restart
    assert not decide(p, end(exit_code=1)).restart


def test_a_signal_kill_matches_its_signal_name() -> None:
    p = policy_from_options({"max_restarts": 2, "no_restart_on": "SIGKILL"})
    killed = AttemptEnd.from_failure(1, 137, signal.SIGKILL, (), "rank 1 was killed", started=True)
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
    imp = [end(n, kind=FailureClass.USER_ERROR, cause="ImportError: x") for n in (1, 2)]
    assert decide(p, imp[0]).restart
    assert decide(p, *imp).why.endswith("(crash loop)")


def test_lost_nodes_have_their_own_count_and_are_never_a_crash_loop() -> None:
    p = RestartPolicy(max_restarts=1, max_node_restarts=2)
    lost = [end(n, kind=FailureClass.NODE_LOST, cause="node 1 lost") for n in (1, 2, 3)]
    d = decide(p, lost[0], lost[1])
    assert d.restart and d.why.startswith("restart 2 of 2 (a lost node: not counted against --max-restarts)")
    assert decide(p, *lost).why == "all 2 restarts after a lost node used: not restarting"
    # Two lost nodes did not spend the one restart left for the code's own failures.
    assert decide(p, lost[0], lost[1], end(3)).why.startswith("restart 1 of 1")
    assert RestartPolicy(max_restarts=3).node_restarts == 3
    assert not decide(RestartPolicy(max_restarts=3, max_node_restarts=0), lost[0]).restart


def test_a_finished_attempt_ends_the_job() -> None:
    d = decide(RestartPolicy(max_restarts=2), end(1), end(2, kind=None, exit_code=0))
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


# -- options ---------------------------------------------------------------------------------


def parse_restart(*argv: str) -> RestartPolicy:
    parser = Parser(prog="detlaunch")
    add_restart_options(parser)
    return policy_from_options(vars(parser.parse_args(argv)))


def test_options_parse_into_a_policy() -> None:
    p = parse_restart("--max-restarts", "3", "--restart-on", "ImportError,start_failure",
                      "--no-restart-on", "3, SIGTERM,Hang,torch.OutOfMemoryError", "--restart-backoff", "0.5",
                      "--restart-backoff-max", "10", "--no-restart-exit-code", "none")
    assert p.max_restarts == 3 and p.node_restarts == 3
    assert p.restart_on == ("ImportError", "start-failure")
    assert p.no_restart_on == (3, 128 + signal.SIGTERM, "hang", "torch.OutOfMemoryError")
    assert (p.backoff_initial, p.backoff_cap, p.no_restart_exit_code) == (0.5, 10.0, None)
    assert parse_restart() == RestartPolicy()


def test_options_from_the_environment_or_a_config_file_come_as_text() -> None:
    p = policy_from_options({"max_restarts": "2", "restart_on": "user-error", "restart_backoff": "0"})
    assert (p.max_restarts, p.restart_on, p.backoff_initial) == (2, ("user-error",), 0.0)


@pytest.mark.parametrize(("argv", "message"), [
    (["--max-restarts", "-1"], "argument --max-restarts: '-1' is out of range; valid: 0..1000000"),
    (["--max-restarts", "two"], "argument --max-restarts: 'two' is not an integer; valid: 0..1000000"),
    (["--max-node-restarts", "1e9"], "argument --max-node-restarts: '1e9' is not an integer; valid: 0..1000000"),
    (["--restart-backoff", "nan"], "argument --restart-backoff: 'nan' is not a finite number; valid: 0..86400 s"),
    (["--restart-backoff-max", "inf"], "'inf' is not a finite number; valid: 0..86400 s"),
    (["--restart-backoff", "-2"], "'-2' is out of range; valid: 0..86400 s"),
    (["--restart-backoff", "3e6"], "'3e6' is out of range; valid: 0..86400 s"),  # a timer would overflow
    (["--restart-on", "rank-faild"], "argument --restart-on: invalid list of exit codes"),
    (["--restart-on", "hangs"], "argument --restart-on: invalid list of exit codes"),
    (["--no-restart-on", "300"], "argument --no-restart-on: invalid list of exit codes"),
    (["--no-restart-exit-code", "0"], "invalid exit code (1-255, or none) value: '0'"),
    (["--restart-backoff", "20", "--restart-backoff-max", "5"],
     "--restart-backoff 20 is more than --restart-backoff-max 5: raise the maximum or lower the first backoff"),
    (["--restart-on", "3", "--no-restart-on", "3,4"], "3 is in both --restart-on and --no-restart-on: keep it in one"),
    (["--restart-on", "interrupted"], "'interrupted' cannot be in --restart-on or --no-restart-on"),
])
def test_bad_option_values_are_one_clear_line(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_restart(*argv)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_text_values_name_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--max-restarts 'x': 'x' is not an integer; valid: 0\.\.1000000$"):
        policy_from_options({"max_restarts": "x"})
    with pytest.raises(ConfigError, match=r"^--restart-backoff '1e300': '1e300' is out of range; valid: 0\.\.86400 s$"):
        policy_from_options({"restart_backoff": "1e300"})
    with pytest.raises(ConfigError, match="the backoff jitter 2.0 is out of range"):
        RestartPolicy(backoff_jitter=2.0)


def test_the_options_are_a_group_of_their_own() -> None:
    parser = argparse.ArgumentParser()
    add_restart_options(parser)
    group = [g for g in parser._action_groups if g.title and g.title.startswith("restarts")]
    assert {a.dest for a in group[0]._group_actions} == {
        "max_restarts", "max_node_restarts", "restart_on", "no_restart_on", "no_restart_exit_code",
        "restart_backoff", "restart_backoff_max"}


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


def test_the_report_lists_each_attempt_and_why_the_next_started_or_none_did() -> None:
    history = [end(1, started_at=100.0, ended_at=110.0, cause="ValueError: a"),
               end(2, started_at=111.2, ended_at=112.0, exit_code=3, cause="ValueError: a")]
    decision = RestartDecision(False, "attempt 2 failed the same way as attempt 1 (ValueError: a): not restarting "
                        "(crash loop)")
    assert format_attempts(history, decision) == [
        "detlaunch: 2 attempt(s):",
        "detlaunch:   attempt 1: rank-failed after 10.0 s: rank 1 on node 0 (127.0.0.1) exited with code 1 "
        "(ValueError: a)",
        "detlaunch:     -> attempt 2 started 1.2 s later",
        "detlaunch:   attempt 2: rank-failed after 0.8 s: rank 1 on node 0 (127.0.0.1) exited with code 3 "
        "(ValueError: a)",
        "detlaunch:     -> attempt 2 failed the same way as attempt 1 (ValueError: a): not restarting (crash loop)",
    ]
    ok = format_attempts([end(1), end(2, kind=None, exit_code=0)], RestartDecision(False, "attempt 2 finished"))
    assert ok[-2:] == ["detlaunch:     -> attempt 2 started", "detlaunch:   attempt 2: finished (exit 0)"]
    lost = AttemptEnd.from_failure(1, 1, None, (), "node 1 (127.0.0.2) was lost: no heartbeat for 5 s",
                                   started=True, lost=True)
    assert format_attempts([lost], RestartDecision(True, "restart 1 of 1 in 1.0 s", 1.0, 2))[1:] == [
        "detlaunch:   attempt 1: node-lost: node 1 (127.0.0.2) was lost: no heartbeat for 5 s",
        "detlaunch:     -> restart 1 of 1 in 1.0 s"]


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


def test_the_user_docs_say_what_the_policy_does() -> None:
    doc = (paths.DOCS / "RESTARTS.md").read_text()
    for kind in FailureClass:
        assert f"| `{kind.value}` |" in doc, f"docs/RESTARTS.md does not describe the kind {kind.value}"
    for name in USER_ERRORS:
        assert f"`{name}`" in doc, f"docs/RESTARTS.md does not list the user error {name}"
    assert f"exits with {NO_RESTART_EXIT_CODE}: `sys.exit({NO_RESTART_EXIT_CODE})`" in doc
    d = RestartPolicy()
    assert f"(default {d.backoff_initial:g} s)" in doc and f"(default {d.backoff_cap:g} s)" in doc
    shown = RestartPolicy(max_restarts=3).describe()
    assert f"    {shown[0]}\n" in doc and f"    {shown[2]}\n" in doc and f"    {shown[3]}\n" in doc
