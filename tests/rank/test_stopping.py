"""The stop rule's reader (rank/stopping.py): a process's signal disposition and state, from its /proc status.

The unit tests read this test's own process (its dispositions changed for SIGUSR2, put back after);
the job tests make the processes the rule is for: one that ignores SIGTERM, one stopped, one a tracer holds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from detlaunch.rank import stopping

pytestmark = pytest.mark.timeout(60)
SIG = signal.SIGUSR2  # a signal nothing in the test process uses


@pytest.fixture
def usr2() -> Iterator[None]:
    """SIGUSR2's disposition and mask as they were, after the test."""
    handler = signal.getsignal(SIG)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    signal.signal(SIG, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def own_disposition() -> str:
    status = stopping.read_status("thread-self")  # SigBlk is per thread: this one's
    assert status is not None
    return stopping.disposition(status, SIG)


def test_the_reader_tells_ignored_caught_blocked_and_default_apart(usr2: None) -> None:
    signal.signal(SIG, signal.SIG_DFL)
    assert own_disposition() == stopping.DEFAULT
    signal.signal(SIG, signal.SIG_IGN)
    assert own_disposition() == stopping.IGNORED
    signal.signal(SIG, lambda signum, frame: None)
    assert own_disposition() == stopping.CAUGHT
    signal.signal(SIG, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK, [SIG])
    assert own_disposition() == stopping.BLOCKED


def test_the_masks_are_read_bit_by_signal_number() -> None:
    status = {"SigIgn": "0000000000004000", "SigCgt": "0000000000000002", "SigBlk": "zz"}  # 15 ignored, 2 caught
    assert stopping.disposition(status, signal.SIGTERM) == stopping.IGNORED
    assert stopping.disposition(status, signal.SIGINT) == stopping.CAUGHT
    assert stopping.disposition(status, signal.SIGHUP) == stopping.DEFAULT  # an unreadable mask counts for nothing
    assert stopping.read_status("no-such-process") is None


def test_only_the_stop_signals_are_stop_signals_and_only_sigint_goes_to_the_group() -> None:
    assert stopping.STOP_SIGNALS == {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    assert stopping.GROUP_SIGNALS == {signal.SIGINT}
    assert {n: stopping.NAMES[n] for n in stopping.STOP_SIGNALS} == {s: signal.Signals(s).name
                                                                     for s in stopping.STOP_SIGNALS}


def child(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def state_of(pid: int, wanted: str) -> str:
    deadline = time.monotonic() + 10
    while True:  # a signal's effect is asynchronous: look until it shows
        state = (stopping.read_status(pid) or {}).get("State", "gone")[:1]
        if state == wanted or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


WAITS = "import signal, sys, time\n{setup}\nprint('ready', flush=True)\ntime.sleep(60)\n"


def test_a_rank_that_ignores_the_signal_is_killed_now_one_that_catches_it_or_dies_of_it_is_not(
        real_processes: None) -> None:
    for setup, why in (("signal.signal(signal.SIGTERM, signal.SIG_IGN)", "it ignores SIGTERM"),
                       ("signal.signal(signal.SIGTERM, lambda *a: None)", ""),
                       ("", "")):
        proc = child(WAITS.format(setup=setup))
        try:
            assert stopping.why_kill_now(proc.pid, signal.SIGTERM) == why, setup
        finally:
            proc.kill()
            proc.wait()
    assert stopping.why_kill_now(proc.pid, signal.SIGTERM) == ""  # reaped: its end is already known


def test_a_stopped_rank_is_killed_now_only_when_sigcont_cannot_wake_it(real_processes: None) -> None:
    proc = child(WAITS.format(setup="signal.signal(signal.SIGTERM, lambda *a: None)"))
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        assert state_of(proc.pid, "T") == "T"
        assert "it is stopped" in stopping.why_kill_now(proc.pid, signal.SIGTERM)
        os.kill(proc.pid, signal.SIGCONT)  # what the wrapper sends with the stop signal: it wakes
        assert stopping.why_kill_now(proc.pid, signal.SIGTERM) == ""
    finally:
        proc.kill()
        proc.wait()


def test_a_rank_a_tracer_holds_is_killed_now(real_processes: None) -> None:
    """PTRACE_TRACEME, then SIGSTOP: a tracing stop (state t), which only the tracer (this test) can end."""
    code = ("import ctypes, os, signal\nprint('ready', flush=True)\n"
            "ctypes.CDLL(None, use_errno=True).ptrace(0, 0, None, None)\nos.kill(os.getpid(), signal.SIGSTOP)\n")
    proc = child(code)
    try:
        assert state_of(proc.pid, "t") == "t"
        os.kill(proc.pid, signal.SIGCONT)
        assert state_of(proc.pid, "t") == "t"
        assert "a tracer (debugger) holds it stopped" in stopping.why_kill_now(proc.pid, signal.SIGTERM)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        while True:  # reaped here, past the stop reports a tracer gets: Popen must not wait for it
            status = os.waitpid(proc.pid, 0)[1]
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                break
        proc.returncode = -signal.SIGKILL
