"""Every rank's stack, asked of every node: the supervisor's side and the reader's side.

`collect_stacks` blocks for up to its budget, so a supervisor runs it on a thread of its own and
gets the result back through a socketpair its event loop watches (`StackCollector`): the loop
never waits for py-spy. A node answers the "stacks" question (control.py) with its live ranks'
stacks as JSON (`node_answer`); whoever asked (the `detlaunch stacks` client, or the chief when
the job hangs or before it stops the survivors of a failure) groups every node's answer into one
report (`report_of`).
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from detlaunch.rank.faultdump import stack_path
from detlaunch.rank.flightrec import Question, fifo_path
from detlaunch.rank.progress import progress_path, script_end
from detlaunch.system.eventloop import EventLoop, Priority

if TYPE_CHECKING:
    from detlaunch.stacks.groups import RankKey, StackReport
    from detlaunch.stacks.pyspy import StackResult

DEFAULT_BUDGET = 2.0  # seconds py-spy gets for every rank of a node (all at once)
NO_GIL = " (its main thread may hold the GIL in a C call that does not release it)"


class StackCollector:
    """collect_stacks on a thread; `done(results)` runs on the event loop when it is over."""

    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop
        self.pending: set[socket.socket] = set()
        self.loaded = False

    def load(self) -> None:
        """Import py-spy's driver (stacks.py, ~10 ms) once a node's ranks run, on a thread, before a
        failure needs it (every node answers a dump before kill): not at start-up, where it would delay
        the launcher, nor on the loop, where it would delay a rank's exit. An import the loop needs
        meanwhile waits for this one (the import lock). Not the grouping (groups.py): only the
        chief formats the stacks, once; every module imported after the fork costs the supervisor its
        own copy of the pages it touches (~1-2 MB for these two, bench direct)."""
        if not self.loaded:
            self.loaded = True
            threading.Thread(target=_import_stack_tools, name="stack-tools", daemon=True).start()

    def collect(self, pids: Sequence[int], budget: float, done: Callable[[dict[int, StackResult]], None],
                fallback: Mapping[int, str] | None = None, flight: FlightQuestion | None = None) -> None:
        """flight: also ask the ranks' Flight Recorders, while py-spy reads them (its answers are in it by `done`)."""
        if not pids:
            done({})
            return
        from detlaunch.stacks.pyspy import Unavailable, collect_stacks

        wake, signal_end = socket.socketpair()
        results: dict[int, StackResult] = {}

        def work() -> None:
            deadline = time.monotonic() + budget
            try:
                if flight is not None:
                    flight.send(deadline)
                results.update(collect_stacks(pids, budget, fallback=fallback))
            except Exception as e:  # noqa: BLE001 - any failure is each rank's reason, never the supervisor's crash
                results.update({p: Unavailable(p, "error", f"collecting stacks failed: {e!r}") for p in pids})
            finally:
                if flight is not None:
                    flight.receive(deadline)
                try:
                    signal_end.send(b"x")
                except OSError:
                    pass  # the supervisor closed it: nobody is waiting any more
                signal_end.close()

        def finished() -> None:
            self._forget(wake)
            done(results)

        self.pending.add(wake)
        self.loop.add_reader(wake, Priority.CHILD_OUTPUT, finished)
        threading.Thread(target=work, name="stacks", daemon=True).start()

    def _forget(self, wake: socket.socket) -> None:
        self.pending.discard(wake)
        self.loop.remove(wake)
        wake.close()

    def close(self) -> None:
        for wake in list(self.pending):
            self._forget(wake)


def _import_stack_tools() -> None:
    from detlaunch.stacks import pyspy  # noqa: F401


def node_answer(collector: StackCollector, host: str, ranks: Sequence[tuple[int, int]], budget: float,
                done: Callable[[dict[str, Any]], None], run_dir: str | None = None, flight: bool = False) -> None:
    """This node's answer to "stacks": [(rank, pid)] of its live ranks, each with its stack or why not.
    run_dir: where the ranks' faulthandler files and flight recorder FIFOs are (for those py-spy cannot read).
    flight: each rank's Flight Recorder too, summarized (flight.py), under "flight"."""

    from detlaunch.stacks.pyspy import Unavailable, to_json

    question = FlightQuestion({pid: fifo_path(run_dir, rank) for rank, pid in ranks}) if flight and run_dir else None

    def collected(results: dict[int, StackResult]) -> None:
        done({"host": host, "ranks": [
            {"rank": rank, "pid": pid,
             "stack": to_json(with_end(results.get(pid) or Unavailable(pid, "error", "no answer from the collector"),
                                       rank, run_dir)),
             **({"flight": question.summaries.get(pid) or {"error": "no answer"}} if question else {})}
            for rank, pid in ranks]})

    fallback = {pid: stack_path(run_dir, rank) for rank, pid in ranks} if run_dir else None
    collector.collect([pid for _, pid in ranks], budget, collected, fallback, question)


class FlightQuestion:
    """The ranks' Flight Recorders, asked (rank/flightrec.Question) and summarized on the collector's thread:
    a rank's dump is about 1 MB of JSON, its summary a few fields (flight.summarize)."""

    def __init__(self, fifos: dict[int, str]) -> None:
        self.question = Question(fifos)
        self.summaries: dict[int, dict[str, Any]] = {}

    def send(self, deadline: float) -> None:
        try:
            self.question.send(deadline)
        except Exception as e:  # noqa: BLE001 - each rank's reason, never the collector's failure
            self.question.close()
            self.summaries = {pid: {"error": f"asking failed: {e!r}"} for pid in self.question.fifos}

    def receive(self, deadline: float) -> None:
        from detlaunch.stacks.flight import summarize

        if self.summaries:
            return  # sending failed
        try:
            answers = self.question.receive(deadline, NO_GIL)
            self.summaries = {pid: summarize(raw) if raw is not None else {"error": why}
                              for pid, (raw, why) in answers.items()}
        except Exception as e:  # noqa: BLE001
            self.question.close()
            self.summaries = {pid: {"error": f"reading its answer failed: {e!r}"} for pid in self.question.fifos}


def with_end(result: StackResult, rank: int, run_dir: str | None) -> StackResult:
    """The stack, marked when the rank's script had ended (its progress file says so): a rank whose
    Python shuts down (gloo failed its collective, it raised) has no Python frames left, and says why."""
    from detlaunch.stacks.pyspy import ProcessStack

    if run_dir is None or not isinstance(result, ProcessStack):
        return result
    ended = script_end(progress_path(run_dir, rank))
    return dataclasses.replace(result, ended=ended) if ended else result


def results_of(answer: Mapping[str, Any]) -> dict[RankKey, StackResult]:
    """{(rank, node): stack} from the whole job's answer (control.py's gathered form)."""
    from detlaunch.stacks.pyspy import from_json

    results: dict[RankKey, StackResult] = {}
    for node in answer.get("nodes") or []:
        for r in node.get("ranks") or []:
            try:
                results[(int(r["rank"]), int(node["node"]))] = from_json(r["stack"])
            except (KeyError, TypeError, ValueError):
                continue
    return results


def flights_of(answer: Mapping[str, Any]) -> dict[RankKey, dict[str, Any]]:
    """{(rank, node): its Flight Recorder's summary} from the whole job's answer, for the ranks that have one."""
    flights: dict[RankKey, dict[str, Any]] = {}
    for node in answer.get("nodes") or []:
        for r in node.get("ranks") or []:
            try:
                if isinstance(r.get("flight"), dict):
                    flights[(int(r["rank"]), int(node["node"]))] = r["flight"]
            except (AttributeError, KeyError, TypeError, ValueError):
                continue
    return flights


def report_of(answer: Mapping[str, Any], last_progress: Mapping[int, float] | None = None) -> StackReport:
    """The stacks grouped, with the Flight Recorder's verdict when the nodes asked for it: its suspects win."""
    from detlaunch.stacks.flight import verdict
    from detlaunch.stacks.groups import group_stacks

    flights = flights_of(answer)
    told = verdict(flights) if flights else None
    report = group_stacks(results_of(answer), last_progress, named=told.suspects if told else None)
    return dataclasses.replace(report, flight=told.lines) if told else report
