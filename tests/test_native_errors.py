"""What the C++ side printed before a rank died (native_errors.py), on recorded stderr of real failures:
a NCCL watchdog timeout, a CUDA illegal memory access, a peer lost. Milliseconds, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from detlaunch.native_errors import Kind, NativeError, explaining_lines, of_tail, read, recognise
from support.native_stderr import ILLEGAL_ACCESS, REMOTE_ERROR, REMOTE_ERROR_PYTHON, TIMEOUT, another_run, tail

pytestmark = pytest.mark.timeout(10)


def test_a_nccl_timeout_is_read_from_what_the_watchdog_threw() -> None:
    error = read(tail(TIMEOUT))
    assert error == NativeError(
        Kind.TIMEOUT, "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2415, OpType=ALLREDUCE, "
        "NumelIn=8192, NumelOut=8192, Timeout(ms)=600000) ran for 600058 milliseconds before timing out.",
        "c10::DistBackendError")
    assert error.infrastructure
    assert error.key == ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=?, OpType=ALLREDUCE, "
                         "NumelIn=8192, NumelOut=8192, Timeout(ms)=600000) ran for ? milliseconds before timing out.")


def test_a_cuda_illegal_memory_access_is_not_a_timeout() -> None:
    error = read(tail(ILLEGAL_ACCESS))
    assert error == NativeError(Kind.CUDA, "CUDA error: an illegal memory access was encountered",
                                "c10::DistBackendError")
    assert not error.infrastructure  # a kernel's bad address: most likely the code's
    timeout = read(tail(TIMEOUT))
    assert timeout is not None and error.key != timeout.key


def test_a_lost_peer_is_read_with_nccls_own_detail_line() -> None:
    error = read(tail(REMOTE_ERROR))
    assert error is not None and error.kind is Kind.PEER and error.infrastructure
    assert error.message == "NCCL error: remote process exited or there was a network error, NCCL version 2.27.5"
    python = of_tail(tail(REMOTE_ERROR_PYTHON))  # raised in Python: its traceback's exception line names it
    assert python is not None and python.kind is Kind.PEER
    assert python.message.startswith("torch.distributed.DistBackendError: NCCL error in: ")


@pytest.mark.parametrize("path", [TIMEOUT, ILLEGAL_ACCESS, REMOTE_ERROR])
def test_the_same_failure_another_time_has_the_same_key(path: Path) -> None:
    lines = tail(path)
    again = another_run(lines)
    assert again != lines
    first, second = read(lines), read(again)
    assert first is not None and second is not None and first.key == second.key


def test_what_differs_between_runs_is_blanked_and_what_names_the_failure_is_kept() -> None:
    other_op = [line.replace("OpType=ALLREDUCE", "OpType=BROADCAST") for line in tail(TIMEOUT)]
    other_size = [line.replace("NumelIn=8192, NumelOut=8192", "NumelIn=4, NumelOut=4") for line in tail(TIMEOUT)]
    keys = {error.key for error in map(read, (tail(TIMEOUT), other_op, other_size)) if error}
    assert len(keys) == 3
    assert recognise("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                     "[127.0.0.1]:14738")[0] is Kind.GLOO_PEER  # type: ignore[index]
    error = NativeError(Kind.PEER, "socketProgress: Connection closed by remote peer 10.0.0.3<52814>, pid 4242")
    assert error.key == "socketProgress: Connection closed by remote peer 10.0.0.3<?>, pid ?"


def test_without_the_terminate_line_the_last_logged_failure_is_read() -> None:
    logged = [line for line in tail(TIMEOUT) if "terminate called" not in line and "what():" not in line]
    error = read(logged)
    assert error is not None and error.kind is Kind.TIMEOUT and error.exception == ""
    assert read(["epoch 3", "loss 0.25"]) is None
    assert read(["terminate called without an active exception"]) == NativeError(
        Kind.CPP, "terminate called without an active exception")
    assert read(["terminate called after throwing an instance of 'std::runtime_error'", "  what():  bad state",
                 "frame #0: f() + 0x1 (0x7f00 in lib.so)"]) == NativeError(Kind.CPP, "bad state", "std::runtime_error")


def test_of_two_threads_terminating_the_one_that_said_what_is_read() -> None:
    lines = tail(TIMEOUT)
    at = next(i for i, line in enumerate(lines) if line.startswith("terminate called"))
    twice = [*lines[:at], lines[at], *lines[at:], lines[at]]  # printed once more as the process died
    error = read(twice)
    assert error is not None and error.kind is Kind.TIMEOUT and error == read(lines)


def test_a_hardware_cuda_error_counts_as_infrastructure() -> None:
    error = read(["terminate called after throwing an instance of 'c10::Error'",
                  "  what():  CUDA error: uncorrectable ECC error encountered"])
    assert error is not None and error.kind is Kind.CUDA and error.infrastructure


def test_the_explaining_lines_are_the_terminate_line_its_message_and_where_it_was_raised() -> None:
    lines = explaining_lines(tail(ILLEGAL_ACCESS))
    assert lines is not None
    assert lines[0] == "terminate called after throwing an instance of 'c10::DistBackendError'"
    assert lines[1].startswith("  what():  [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread "
                               "terminated with exception: CUDA error: an illegal memory access was encountered")
    assert lines[-1].startswith("Exception raised from c10_cuda_check_implementation at ")
    assert not any(line.startswith("frame #") for line in lines) and len(lines) == 7
    assert explaining_lines(tail(REMOTE_ERROR_PYTHON)) is None
    assert explaining_lines(["work done", "terminate called without an active exception"]) is None
