"""How long a node's sweep lets the leftovers of an ended attempt end on their own (shutdown.Shutdown._sweep_wait).

After a clean end, a worker node's sshd sessions are the chief's launcher reaching this node, its remote part
(deepspeed's launch.py, an mpirun orted) reporting the ranks' exit 0: killed after 5 s on a loaded machine, the
chief's ssh exited 255 and a job whose every rank succeeded failed. Those get the grace period; anything else,
and anything after a failure, at most LEFTOVER_WAIT."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from detlaunch.node.shutdown import Shutdown
from detlaunch.rank.protocol import LEFTOVER_WAIT


def wait(*, daemon: bool, stopping: bool, grace: float = 30.0) -> float:
    commands = [SimpleNamespace(daemon=False), SimpleNamespace(daemon=daemon)]
    host = SimpleNamespace(plan=SimpleNamespace(stage=SimpleNamespace(commands=commands), grace_period=grace),
                           verdict=SimpleNamespace(stopping=stopping))
    return Shutdown(host)._sweep_wait()  # type: ignore[arg-type]


@pytest.mark.parametrize(("daemon", "stopping", "grace", "expected"), [
    (True, False, 30.0, 30.0),  # a clean end with sshd sessions: the whole grace period
    (True, True, 30.0, LEFTOVER_WAIT),  # after a failure: nothing is delivering a success
    (False, False, 30.0, LEFTOVER_WAIT),  # no daemon: what a rank left behind
    (True, False, 0.0, 1.0),  # --grace-period 0: still a second
    (False, False, 2.0, 2.0),
])
def test_the_sweep_waits_for_sessions_delivering_a_success_and_not_for_anything_else(
        daemon: bool, stopping: bool, grace: float, expected: float) -> None:
    assert wait(daemon=daemon, stopping=stopping, grace=grace) == expected
