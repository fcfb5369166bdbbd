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
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from detlaunch.rank.faultdump import stack_path
from detlaunch.rank.progress import progress_path, script_end
from detlaunch.system.eventloop import EventLoop, Priority

if TYPE_CHECKING:
    from detlaunch.stacks.groups import RankKey, StackReport
    from detlaunch.stacks.pyspy import StackResult

DEFAULT_BUDGET = 2.0  # seconds py-spy gets for every rank of a node (all at once)


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
                fallback: Mapping[int, str] | None = None) -> None:
        if not pids:
            done({})
            return
        from detlaunch.stacks.pyspy import Unavailable, collect_stacks

        wake, signal_end = socket.socketpair()
        results: dict[int, StackResult] = {}

        def work() -> None:
            try:
                results.update(collect_stacks(pids, budget, fallback=fallback))
            except Exception as e:  # noqa: BLE001 - any failure is each rank's reason, never the supervisor's crash
                results.update({p: Unavailable(p, "error", f"collecting stacks failed: {e!r}") for p in pids})
            finally:
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
                done: Callable[[dict[str, Any]], None], run_dir: str | None = None) -> None:
    """This node's answer to "stacks": [(rank, pid)] of its live ranks, each with its stack or why not.
    run_dir: where the ranks' faulthandler files are (for those py-spy cannot read)."""

    from detlaunch.stacks.pyspy import Unavailable, to_json

    def collected(results: dict[int, StackResult]) -> None:
        done({"host": host, "ranks": [
            {"rank": rank, "pid": pid,
             "stack": to_json(with_end(results.get(pid) or Unavailable(pid, "error", "no answer from the collector"),
                                       rank, run_dir))}
            for rank, pid in ranks]})

    fallback = {pid: stack_path(run_dir, rank) for rank, pid in ranks} if run_dir else None
    collector.collect([pid for _, pid in ranks], budget, collected, fallback)


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


def report_of(answer: Mapping[str, Any], last_progress: Mapping[int, float] | None = None) -> StackReport:
    from detlaunch.stacks.groups import group_stacks

    return group_stacks(results_of(answer), last_progress)
