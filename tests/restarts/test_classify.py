"""What ended an attempt, as the restart policy reads it (classify.py): its class and its signature."""

from __future__ import annotations

import signal
import traceback
from collections.abc import Callable
from typing import Any

import detlaunch.exit_codes as exit_codes
import pytest
from detlaunch.outcome import FailureKind, ProcessEnd, RestartClass
from detlaunch.restarts.classify import FIXED, classify, exception_of, signature

pytestmark = pytest.mark.timeout(60)


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


# -- classification --------------------------------------------------------------------------


@pytest.mark.parametrize(("raise_it", "line"), [
    (import_missing, "ModuleNotFoundError: No module named 'no_such_module_for_detlaunch_tests'"),
    (compile_bad, "SyntaxError: invalid syntax"),
    (use_undefined, "NameError: name 'undefined_name_in_train' is not defined"),
    (boom, "ValueError: boom"),
    (chained, "RuntimeError: could not load the model"),
])
def test_the_exception_of_pythons_own_tracebacks(raise_it: Callable[[], object], line: str) -> None:
    assert exception_of(tail_of(raise_it))[0] == line


def test_the_exception_of_torchs_rank_prefixed_tracebacks() -> None:
    assert exception_of(TORCH_ROOT_CAUSE) == ("RuntimeError: injected failure at step 3", "RuntimeError")
    # The header was cut off (the tail keeps 20 lines): read from the first frame left.
    assert exception_of(GLOO_SURVIVOR)[0].startswith("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo")


def test_what_is_printed_after_the_traceback_does_not_hide_it() -> None:
    after = [*tail_of(boom), "[W1201 08:40:12.123 ProcessGroupGloo.cpp:123] Warning: destroy_process_group() "
             "was not called", "Exception ignored in atexit callback"]
    assert exception_of(after)[0] == "ValueError: boom"


def test_without_the_header_the_frames_left_are_read() -> None:
    cut = tail_of(boom)[1:]  # the tail kept only the last lines: no "Traceback" header
    assert exception_of([*cut, "saving a last log line"])[0] == "ValueError: boom"
    assert exception_of(["epoch 3", "Loss: 0.25", "done"]) == ("", "")  # "Loss: ..." is no exception


RANK = FailureKind.RANK


@pytest.mark.parametrize(("args", "restart_class"), [
    ({"code": 1, "tail": tail_of(import_missing)}, RestartClass.USER_ERROR),
    ({"code": 1, "tail": tail_of(compile_bad)}, RestartClass.USER_ERROR),
    ({"code": 1, "tail": tail_of(use_undefined)}, RestartClass.USER_ERROR),
    ({"code": 2, "tail": ["usage: train.py [-h]", "train.py: error: unrecognized arguments: --epoch"]},
     RestartClass.USER_ERROR),
    ({"code": 1, "tail": tail_of(boom)}, RestartClass.RANK_FAILED),
    ({"code": 1, "tail": GLOO_SURVIVOR}, RestartClass.RANK_FAILED),
    ({"code": 137, "signal": signal.SIGKILL}, RestartClass.RANK_FAILED),
    ({"code": 1, "kind": FailureKind.LAUNCHER}, RestartClass.RANK_FAILED),
    ({"code": 1, "kind": FailureKind.LAUNCHER, "tail": tail_of(import_missing)}, RestartClass.USER_ERROR),
    ({"code": 130, "signal": signal.SIGINT, "kind": FailureKind.INTERRUPTED}, RestartClass.INTERRUPTED),
    ({"code": exit_codes.NO_RESTART}, RestartClass.NO_RESTART),
    ({"code": 1, "started": False, "kind": FailureKind.START}, RestartClass.START_FAILURE),
    ({"code": 1, "started": False, "tail": tail_of(import_missing)}, RestartClass.USER_ERROR),
    ({"code": 1, "kind": FailureKind.NODE_LOST}, RestartClass.NODE_LOST),
    ({"code": 1, "kind": FailureKind.CHIEF_LOST, "started": False}, RestartClass.NODE_LOST),
    ({"code": 124, "kind": FailureKind.HANG}, RestartClass.HANG),
    ({"code": 2, "kind": FailureKind.INTERRUPTED}, RestartClass.INTERRUPTED),
])
def test_classify(args: dict[str, Any], restart_class: RestartClass) -> None:
    end = ProcessEnd(args["code"], args.get("signal"))
    assert classify(args.get("kind", RANK), end, args.get("tail", ()), started=args.get("started", True)) \
        is restart_class


def test_a_lost_node_a_hang_and_the_users_signal_are_what_they_are_whatever_their_exit_code() -> None:
    """The exit code of these is detlaunch's, not a rank's: it cannot make them a user error or a "do not restart"."""
    for kind, restart_class in FIXED.items():
        for code in (exit_codes.USAGE, exit_codes.NO_RESTART, 1):
            assert classify(kind, ProcessEnd(code), tail_of(import_missing), started=False) is restart_class


def test_the_no_restart_exit_code_is_configurable_and_can_be_off() -> None:
    assert classify(RANK, ProcessEnd(7), (), started=True, no_restart_exit_code=7) is RestartClass.NO_RESTART
    assert classify(RANK, ProcessEnd(exit_codes.NO_RESTART), (), started=True, no_restart_exit_code=None) \
        is RestartClass.RANK_FAILED
    # A signal is never the script asking: 128+N is how a kill reads.
    assert classify(RANK, ProcessEnd.killed(signal.SIGKILL), (), started=True, no_restart_exit_code=137) \
        is RestartClass.RANK_FAILED


def test_signature_is_how_it_ended_and_the_last_traceback_line() -> None:
    one = ProcessEnd(1)
    assert signature(one, tail_of(boom)) == "exit 1: ValueError: boom"
    assert signature(ProcessEnd.killed(signal.SIGKILL), ()) == "killed by SIGKILL"
    # An object's address differs on every run; the same failure must compare equal.
    batch = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>']
    a = signature(one, [*batch, "ValueError: bad <Batch object at 0x7f3a1c2b4d90>"])
    assert a == signature(one, [*batch, "ValueError: bad <Batch object at 0x7f00deadbeef>"])
    assert a == "exit 1: ValueError: bad <Batch object at 0x?>"
    assert signature(one, [*batch, "ValueError: bad step 3"]) != signature(one, [*batch, "ValueError: bad step 4"])
    # The same failure of another rank, or with another ephemeral port, is the same failure.
    assert signature(one, TORCH_ROOT_CAUSE) == "exit 1: RuntimeError: injected failure at step 3"
    other_port = [line.replace("14738", "40001") for line in GLOO_SURVIVOR]
    assert signature(one, GLOO_SURVIVOR) == signature(one, other_port)
    assert "[127.0.0.1]:?." in signature(one, GLOO_SURVIVOR)
