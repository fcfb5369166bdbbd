"""--spawn ssh for real: one command starts three nodes over a real sshd (127.0.0.2-4), as a throwaway user
with their own key and ssh config (tests/support/ssh_nodes.py). What a user sees: every node's output here,
the job's exit code and report, a script whose path and arguments hold spaces, quotes, `$` and unicode run
exactly as given; Ctrl-C and SIGKILL of the spawning command leave nothing on any node; a host ssh cannot
reach and one without detlaunch are one line each, with nothing left on the others."""

from __future__ import annotations

import pwd
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.helpers import free_port
from support.jobs import Launcher
from support.ssh_nodes import HOSTS, NO_DETLAUNCH, PYTHON, SshNodes, ssh_nodes

pytestmark = pytest.mark.timeout(120)

SCRIPT = """\
import os, sys, time
print("args", sys.argv[1:], os.getcwd(), os.environ.get("DL_SHARED"), flush=True)
if os.environ["RANK"] == "2":
    time.sleep(float(os.environ.get("DL_FAIL_AFTER", "0")))  # the others have printed by then
    sys.exit(7)
if os.environ.get("DL_HOLD"):
    time.sleep(300)
"""
TRICKY = "my dir/$x 'é\"q\".py"
ARGS = ["a b", "$HOME", "`id`; ls", "ünï"]


@pytest.fixture
def nodes(throwaway_user: pwd.struct_passwd) -> Iterator[SshNodes]:
    with ssh_nodes(throwaway_user) as found:
        (found.home / "my dir").mkdir()
        (found.home / TRICKY).write_text(SCRIPT)
        yield found


def spawn(launcher: Launcher, nodes: SshNodes, hosts: tuple[str, ...], *extra: str, hold: bool = False):  # type: ignore[no-untyped-def]
    env = {**nodes.env, "DL_SHARED": "it's $shared", "DL_HOLD": "1" if hold else "", "DL_FAIL_AFTER": "3"}
    return launcher.start("--layer", "direct", "--nproc-per-node", "1", "--spawn", "ssh",
                          "--hosts", ",".join(hosts), "--master-port", str(free_port()), "--grace-period", "5",
                          "--export", "PYTHONPATH,DETLAUNCH_CONTRACT_ID,DL_SHARED,DL_HOLD,DL_FAIL_AFTER",
                          *extra, TRICKY, *ARGS, env=env, cwd=nodes.home, command=(PYTHON, "-m", "detlaunch"),
                          prefix=nodes.as_user)


def test_three_nodes_from_one_command_a_failure_on_node_2(nodes: SshNodes, launcher: Launcher) -> None:
    done = spawn(launcher, nodes, HOSTS).wait(timeout=90)
    assert done.returncode == 7, done.output
    for rank in range(3):
        assert f"[rank={rank}] args {ARGS!r} {nodes.home} it's $shared" in done.stdout, done.output
    assert "detlaunch: [node 0 (127.0.0.2)] job failed: rank 2 on node 2 (127.0.0.4) exited with code 7" in \
        done.stderr.splitlines(), done.output  # the chief's report, its node named
    launcher.assert_no_leftovers(settle=10)
    nodes.no_processes_left()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_stopping_the_spawning_command_stops_every_node(nodes: SshNodes, launcher: Launcher, sig: int) -> None:
    job = spawn(launcher, nodes, HOSTS[:2], hold=True)
    for rank in range(2):
        job.wait_for_output(f"[rank={rank}] args", timeout=60)
    job.send_signal(sig)
    done = job.wait(timeout=60)
    assert done.returncode == (130 if sig == signal.SIGINT else -9), done.output
    launcher.assert_no_leftovers(settle=15)
    nodes.no_processes_left()


def test_an_unreachable_host_and_one_without_detlaunch_are_one_line_each(nodes: SshNodes, launcher: Launcher,
                                                                         tmp_path: Path) -> None:
    for bad, reason in (("127.0.0.5", "ssh failed: ssh: connect to host 127.0.0.5 port"),
                        (NO_DETLAUNCH, "detlaunch not found there: ")):
        done = spawn(launcher, nodes, (HOSTS[0], bad), hold=True).wait(timeout=60)
        lines = [line for line in done.stderr.splitlines() if f"node 1 ({bad})" in line]
        assert len(lines) == 1 and reason in lines[0], done.output
        assert done.returncode == 1, done.output
        launcher.assert_no_leftovers(settle=10)
        nodes.no_processes_left()
