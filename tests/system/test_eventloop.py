"""The event loop: priorities within a batch, timers, signals through the self-pipe (milliseconds)."""

from __future__ import annotations

import os
import signal
import socket

import pytest
from detlaunch.system.eventloop import EventLoop, Priority


def test_a_batch_runs_in_priority_order_whatever_the_registration_order() -> None:
    loop = EventLoop()
    order: list[str] = []
    pairs = [socket.socketpair() for _ in Priority]
    for (r, w), priority in zip(pairs, reversed(list(Priority)), strict=True):
        loop.add_reader(r, priority, lambda p=priority, r=r: (order.append(p.name), r.recv(1)))
        w.send(b"x")
    loop.run_once(timeout=1)
    assert order == ["RANK_REPORT", "CHILD_OUTPUT", "PROBE", "SIGNAL"]
    for r, w in pairs:
        r.close()
        w.close()
    loop.close()


def test_a_file_closed_by_an_earlier_callback_of_the_batch_is_skipped() -> None:
    loop = EventLoop()
    (a_r, a_w), (b_r, b_w) = socket.socketpair(), socket.socketpair()
    seen: list[str] = []

    def first() -> None:
        seen.append("a")
        loop.remove(b_r)
        b_r.close()

    loop.add_reader(a_r, Priority.RANK_REPORT, first)
    loop.add_reader(b_r, Priority.SIGNAL, lambda: seen.append("b"))
    a_w.send(b"x")
    b_w.send(b"x")
    loop.run_once(timeout=1)
    assert seen == ["a"]
    loop.close()


def test_timers_fire_in_time_order_and_a_cancelled_one_never() -> None:
    now = [100.0]
    loop = EventLoop(clock=lambda: now[0])
    fired: list[int] = []
    loop.call_at(103, lambda: fired.append(3))
    loop.call_at(101, lambda: fired.append(1))
    loop.call_later(2, lambda: fired.append(2)).cancel()
    assert loop.next_timeout() == 1.0
    now[0] = 104.0
    loop.run_once()
    assert fired == [1, 3] and loop.next_timeout() is None
    loop.close()


def test_a_signal_reaches_the_callback_inside_the_loop() -> None:
    loop = EventLoop()
    got: list[int] = []
    loop.catch_signals([signal.SIGUSR1], got.append)
    os.kill(os.getpid(), signal.SIGUSR1)
    loop.run_once(timeout=5)
    assert got == [signal.SIGUSR1]
    loop.close()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_run_stops_when_done_and_runs_after_each_batch() -> None:
    loop = EventLoop()
    batches: list[int] = []
    loop.call_later(0, lambda: None)
    loop.call_later(0.01, lambda: None)
    loop.run(done=lambda: len(batches) >= 2, after_each=lambda: batches.append(1))
    assert batches == [1, 1]
    loop.close()


def test_run_until_sleeps_until_the_event_and_fails_at_its_deadline_naming_what() -> None:
    loop = EventLoop()
    fired: list[bool] = []
    loop.call_later(0.02, lambda: fired.append(True))
    loop.run_until(lambda: fired, 5, "the timer")  # returns as soon as the timer's callback ran
    assert fired == [True]
    with pytest.raises(TimeoutError, match=r"^a thing that never comes did not happen within 0.05 s$"):
        loop.run_until(lambda: False, 0.05, "a thing that never comes")
    loop.close()
