"""The straggler judge (observe/stragglers.py) on synthetic figures: who is named, when, and who never is."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import pytest
from detlaunch.observe.stragglers import CPU_WINDOWS, Finding, StragglerDetector, marks
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(30)


def run(ranks: int, steps: int, took: Callable[[int, int], float], *, every: int = 1,
        detector: StragglerDetector | None = None) -> list[tuple[int, Finding]]:
    """`steps` synchronous steps: rank r's section "step" takes took(r, step); the chief reads every `every` steps."""
    judge = detector or StragglerDetector()
    totals = [0.0] * ranks
    found = []
    for step in range(steps):
        for r in range(ranks):
            totals[r] += took(r, step)
        if step % every == every - 1:
            figures = {(r, r // 2): {"step": (step + 1, totals[r])} for r in range(ranks)}
            found += [(step, f) for f in judge.update(figures, {})]
    return found


@pytest.mark.parametrize("ranks", [2, 4, 16])
def test_a_balanced_job_with_noise_names_nobody_in_1000_steps(ranks: int) -> None:
    rng = random.Random(ranks)
    assert run(ranks, 1000, lambda r, s: 0.1 * rng.uniform(0.8, 1.2)) == []
    assert run(ranks, 1000, lambda r, s: 0.1 * rng.lognormvariate(0, 0.08), every=5) == []


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), st.lists(st.floats(0.87, 1.15), min_size=8, max_size=64))
def test_a_rank_within_15_percent_of_the_others_is_never_named(ranks: int, noise: list[float]) -> None:
    # any noise at all, even the worst a adversary can pick, in that band: 1.15 / 0.87 is under 1 / 0.7
    assert run(ranks, 300, lambda r, s: noise[(r * 7 + s) % len(noise)]) == []


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_rank_twice_as_slow_is_named_after_three_windows_once(ranks: int) -> None:
    found = run(ranks, 200, lambda r, s: 0.2 if r == 1 and s >= 50 else 0.1)
    assert [(step, f.rank, f.node, f.basis, f.section) for step, f in found] == [(52, 1, 0, "sections", "step")]
    assert found[0][1].speed == pytest.approx(0.5)
    assert "rank 1 (node 0) is slow: its section 'step' takes 2.0x" in found[0][1].describe()
    assert found[0][1].mark() == "0.50x (step)"


def test_a_window_waits_until_every_rank_made_a_call() -> None:
    judge = StragglerDetector(windows=1)
    assert judge.update({(0, 0): {"s": (1, 1.0)}, (1, 0): {}}, {}) == []  # rank 1 has made no call yet
    assert judge.update({(0, 0): {"s": (2, 2.0)}, (1, 0): {}}, {}) == []  # ... nor now: the window goes on
    found = judge.update({(0, 0): {"s": (3, 3.0)}, (1, 0): {"s": (1, 2.0)}}, {})  # counted from its first call
    assert [f.rank for f in found] == [1] and found[0].speed == pytest.approx(0.5)
    assert judge.update({(0, 0): {"s": (4, 4.0)}, (1, 0): {"s": (1, 2.0)}}, {}) == []


def test_a_slow_but_tiny_section_is_not_judged_and_a_recovery_ends_the_run() -> None:
    judge = StragglerDetector()
    calls, slow_rank_log = 0, 0.0
    for _ in range(1, 50):
        calls += 1
        slow_rank_log += 0.003  # three times as long as the others', but 1% of the work
        figures = {(r, 0): {"step": (calls, 0.1 * calls), "log": (calls, slow_rank_log if r == 2 else 0.001 * calls)}
                   for r in range(4)}
        assert judge.update(figures, {}) == []
    judge = StragglerDetector()
    assert run(4, 300, lambda r, s: 0.2 if r == 3 and s % 3 == 0 else 0.1, detector=judge) == []  # never 3 in a row


def test_the_cpu_suspect_is_the_rank_the_others_wait_for_with_a_confidence_word() -> None:
    judge = StragglerDetector()
    cpu = {(0, 0): 12.0, (1, 0): 99.0, (2, 1): 10.0, (3, 1): 11.0}
    found = [f for _ in range(CPU_WINDOWS) for f in judge.update({}, cpu)]
    assert [(f.rank, f.node, f.basis, f.confidence) for f in found] == [(1, 0, "cpu", "likely")]
    assert "straggler suspect (likely, from CPU time" in found[0].describe()
    judge = StragglerDetector()
    pair = {(0, 0): 40.0, (1, 0): 99.0}
    assert [f.confidence for _ in range(CPU_WINDOWS) for f in judge.update({}, pair)] == ["possible"]


def test_no_cpu_guess_once_sections_are_seen_nor_with_a_rank_unsampled_or_all_idle() -> None:
    judge = StragglerDetector()
    judge.update({(0, 0): {"s": (1, 1.0)}, (1, 0): {"s": (1, 1.0)}}, {})
    busy = {(0, 0): 99.0, (1, 0): 5.0}
    assert [f for _ in range(3 * CPU_WINDOWS) for f in judge.update({}, busy)] == []
    judge = StragglerDetector()
    assert [f for _ in range(3 * CPU_WINDOWS) for f in judge.update({}, {(0, 0): 99.0, (1, 0): None})] == []
    assert [f for _ in range(3 * CPU_WINDOWS) for f in judge.update({}, {(0, 0): 8.0, (1, 0): 1.0})] == []


def test_marks_read_the_chiefs_answer() -> None:
    assert marks({"3": "0.50x (step)", "x": "?", "4": 1}) == {3: "0.50x (step)", 4: "1"}


def test_status_shows_a_straggler_column_once_one_is_named_and_the_learned_hang_timeout() -> None:
    from detlaunch.cli.control import format_status, job_facts

    rows = [{"rank": r, "node": 0, "host": "127.0.0.1", "state": "running", "restarts": 0} for r in (0, 1)]
    chief = {"node": 0, "phase": "running", "taken_at": 1.0, "ranks": rows, "stragglers": {"1": "0.50x (step)"},
             "hang_timeout": "auto: 60 s learned"}
    data = job_facts({"job": "j", "nodes": [chief]})
    assert [r["straggler"] for r in data["nodes"][0]["ranks"]] == [None, "0.50x (step)"]
    text = format_status(data).splitlines()
    assert text[1] == "hang timeout: auto: 60 s learned"
    assert text[2].endswith("RESTARTS  STRAGGLER") and text[3].endswith(" -") and text[4].endswith("0.50x (step)")
    quiet = job_facts({"job": "j", "nodes": [{"node": 0, "phase": "running", "taken_at": 1.0, "ranks": rows,
                                              "stragglers": {}}]})
    assert "STRAGGLER" not in format_status(quiet)  # no column until the chief names one


@pytest.mark.timeout(10)
def test_the_watch_asks_every_node_names_the_straggler_once_and_replace_without_spares_warns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from detlaunch.node import straggler_watch
    from detlaunch.node.straggler_watch import StragglerWatch
    from detlaunch.observe.events import EventKind
    from detlaunch.system.eventloop import EventLoop

    monkeypatch.setattr(straggler_watch, "POLL_EVERY", 0.01)
    loop, said, events, asked = EventLoop(), [], [], []  # type: ignore[var-annotated]
    calls = [0]

    def ask_job(what: str, args: object, answer: Callable[[dict[str, object]], None]) -> None:
        asked.append(what)
        calls[0] += 1
        n = calls[0]
        answer({"nodes": [{"node": 0, "ranks": [[0, {"step": [n, 0.1 * n]}, 90.0]]},
                          {"node": 1, "ranks": [[1, {"step": [n, 0.3 * n]}, 99.0], "junk"]}]})

    watch = StragglerWatch(loop, is_chief=True, run_dir="/nonexistent", threshold=0.7, action="replace",
                           ask_job=ask_job, emit=lambda kind, rank, **d: events.append((kind, rank, d)),
                           say=said.append, live_ranks=lambda: [], usage=dict, active=lambda: True)
    watch.registered()
    loop.run_until(lambda: calls[0] >= 10, 5, "ten questions")
    assert set(asked) == {"sections"}
    assert said[0] == ("--straggler-action replace needs --spares (a node to take the straggler's place): "
                       "warning only")
    assert said[1].startswith("straggler: rank 1 (node 1) is slow: its section 'step' takes 3.0x") and len(said) == 2
    ((kind, rank, details),) = events
    assert (kind, rank, details["node"], details["action"], details["basis"]) == (EventKind.STRAGGLER, 1, 1, "warn",
                                                                                 "sections")
    assert watch.marks() == {"1": "0.33x (step)"}
    watch.new_attempt()
    assert watch.marks() == {} and watch.timer is None
    watch.close()
    loop.close()


def test_detlaunch_stacks_marks_a_rank_already_named_a_straggler() -> None:
    from detlaunch.cli.control import format_stacks, job_facts

    stack = {"pid": 10, "stopped": False, "threads": [{"name": "MainThread", "thread_id": 1, "active": False,
             "owns_gil": False, "os_thread_id": 1, "frames": [{"function": "wait", "file": "t.py", "line": 3}]}]}
    data = job_facts({"job": "j", "missing": [], "nodes": [
        {"node": 0, "ranks": [{"rank": 0, "pid": 10, "stack": stack}], "stragglers": {"0": "cpu, likely"}}]})
    assert "rank 0: named a straggler (cpu, likely)" in format_stacks(data, False).splitlines()
    assert json.loads(format_stacks(data, True))["stragglers"] == {"0": "cpu, likely"}
