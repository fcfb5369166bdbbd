"""A rank that crashes while Python finalizes, after its script and its atexit handlers have finished, is counted
as finished (exit 0, a line saying so), unless --strict-teardown: the real wrapper (python -S, as the supervisor
starts it) runs a real Python rank whose exit handler aborts, and reports to a rank registry served here. torch's
gloo threads do this for real, about 1 run in 6 (docs/RESTARTS.md, "A crash in Python's teardown")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from detlaunch.outcome import RankStatus
from detlaunch.rank.wrapper import __file__ as WRAPPER
from support.registry_node import Node

pytestmark = pytest.mark.timeout(30)

# The C library's exit handlers (on_exit(3)) run once Python has finalized: a crash there, deterministically.
ABORT_IN_TEARDOWN = "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.on_exit(libc.abort, None)\n"
SIGNAL_IN_TEARDOWN = ("import ctypes\nlibc = ctypes.CDLL(None)\n"  # raise(N) as a C++ exit handler (__cxa_atexit)
                      'libc.__cxa_atexit(getattr(libc, "raise"), ctypes.c_void_p({}), None)\n')
FORGIVEN = ("[rank=2] detlaunch: rank 2 killed by {} while Python finalized, after its script and its atexit "
            "handlers had finished: counted as finished, exit 0 (--strict-teardown counts it as failed)")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    made: list[Node] = []
    yield made
    for node in made:
        node.close()


def wrap(nodes: list[Node], tmp_path: Path, code: str, strict: bool = False) -> tuple[int, RankStatus, str]:
    """Run `code` as rank 2 under the real wrapper: (the wrapper's exit code, its report, its rank's log)."""
    welcome = {"log_dir": str(tmp_path), **({"strict_teardown": True} if strict else {})}
    node = Node(tmp_path / "s.sock", welcome)
    nodes.append(node)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    wrapper = subprocess.Popen([sys.executable, "-S", WRAPPER, "--rank", "2", "--job", "job-1", "--",
                                sys.executable, "-c", code], env={**env, "DETLAUNCH_SUPERVISOR": node.path})
    try:
        node.serve_until(lambda: node.exits)
        wrapper.wait(timeout=20)
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
    (status,) = node.exits
    return wrapper.returncode, status, (tmp_path / "rank-2.log").read_text()


@pytest.mark.parametrize(("crash", "signum"), [(ABORT_IN_TEARDOWN, signal.SIGABRT),
                                               (SIGNAL_IN_TEARDOWN.format(11), signal.SIGSEGV)])
def test_a_crash_in_teardown_after_the_work_is_done_counts_as_finished(real_processes: None, nodes: list[Node],
                                                                       tmp_path: Path, crash: str,
                                                                       signum: signal.Signals) -> None:
    code, status, log = wrap(nodes, tmp_path, crash + "print('work done')")
    assert (code, status.exit_code, status.signal, status.teardown_signal) == (0, 0, None, signum), log
    assert status.ended == "finalizing" and not status.failed
    assert log.splitlines() == ["[rank=2] work done", FORGIVEN.format(signum.name)]


def test_strict_teardown_counts_it_as_failed(real_processes: None, nodes: list[Node], tmp_path: Path) -> None:
    code, status, log = wrap(nodes, tmp_path, ABORT_IN_TEARDOWN + "print('work done')", strict=True)
    assert (code, status.exit_code, status.signal, status.teardown_signal) == (134, 134, 6, None), log
    assert status.describe() == ("killed by SIGABRT after its script and its atexit handlers had finished (its work "
                                 "was done: Python was finalizing)")
    assert "counted as finished" not in log


@pytest.mark.parametrize(("script", "ended"), [
    ("import sys\nsys.exit(3)", "exit 3"),  # the script asked for a failure: a crash after it does not hide it
    ("raise ValueError('boom')", "raised"),
    ("import atexit, os\natexit.register(os.abort)", "finished"),  # an atexit handler of its own crashed: not done
    ("import os\nos.abort()", ""),  # in the middle of its script
])
def test_a_crash_after_a_failure_or_before_the_work_is_done_still_fails(real_processes: None, nodes: list[Node],
                                                                        tmp_path: Path, script: str,
                                                                        ended: str) -> None:
    code, status, log = wrap(nodes, tmp_path, ABORT_IN_TEARDOWN + script)
    assert (code, status.exit_code, status.signal, status.teardown_signal) == (134, 134, 6, None), log
    assert status.ended == ended and "counted as finished" not in log


def test_a_signal_from_outside_in_teardown_still_fails(real_processes: None, nodes: list[Node],
                                                       tmp_path: Path) -> None:
    """Only the signals a process raises on itself when it crashes: SIGKILL (the OOM killer) is never forgiven."""
    code, status, _ = wrap(nodes, tmp_path, SIGNAL_IN_TEARDOWN.format(9) + "print('work done')")
    assert (code, status.signal, status.teardown_signal, status.ended) == (137, 9, None, "finalizing")
