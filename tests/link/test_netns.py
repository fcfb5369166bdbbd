"""A machine lost for real: the worker node in its own network namespace, joined to the chief by a
veth pair, and the link cut. No FIN, no RST reaches either side: only the job link's heartbeats
can tell, and both nodes must stop on their own."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator

import pytest
from support.helpers import free_port, ip, rank_lines, report_line
from support.jobs import SCRIPTS, Launcher

pytestmark = pytest.mark.timeout(240)
CHIEF, WORKER = "10.213.77.1", "10.213.77.2"


@pytest.fixture
def worker_namespace() -> Iterator[tuple[str, str]]:
    """A namespace holding one end of a veth pair: (namespace, the chief side's link name)."""
    if os.getuid() != 0:
        pytest.skip("needs root for network namespaces")
    tag = secrets.token_hex(3)
    ns, host_end, ns_end = f"dl-{tag}", f"dlh{tag}", f"dln{tag}"
    ip("netns", "add", ns)
    try:
        ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        ip("link", "set", ns_end, "netns", ns)
        ip("addr", "add", f"{CHIEF}/24", "dev", host_end)
        ip("link", "set", host_end, "up")
        ip("-n", ns, "addr", "add", f"{WORKER}/24", "dev", ns_end)
        ip("-n", ns, "link", "set", ns_end, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        yield ns, host_end
    finally:
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, timeout=30)
        ip("netns", "del", ns)


def test_a_lost_machine_stops_the_job_on_both_sides(launcher: Launcher, worker_namespace: tuple[str, str]) -> None:
    ns, host_end = worker_namespace
    common = ["--layer", "torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", CHIEF,
              "--master-port", str(free_port()), "--heartbeat", "0.5"]
    env = {"SLEEP": "300"}
    chief = launcher.start(*common, "--node-rank", "0", "--node-addr", CHIEF, str(SCRIPTS / "ranks.py"), env=env)
    worker = launcher.start(*common, "--node-rank", "1", "--node-addr", WORKER, str(SCRIPTS / "ranks.py"),
                            env=env, prefix=["ip", "netns", "exec", ns])
    chief.wait_for_output("[rank=0] rank 0 sleeping", timeout=180)
    worker.wait_for_output("[rank=1] rank 1 sleeping", timeout=180)
    ip("link", "set", host_end, "down")  # the cable is cut: nothing more crosses, not even a reset
    rc, rw = chief.wait(60), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (1, 1), rc.output + "\n----\n" + rw.output
    assert report_line(rc.stderr) == f"detlaunch: job failed: lost node 1 ({WORKER}): no heartbeat for 2.5 s"
    assert report_line(rw.stderr) == (f"detlaunch: job failed: lost the chief ({CHIEF}): "
                                      "no heartbeat from the chief for 2.5 s")
    assert rank_lines(rc.stdout, 0)[-1] == "rank 0 sleeping"
    assert rank_lines(rw.stdout, 1)[-1] == "rank 1 sleeping"
    assert rc.duration < 120
