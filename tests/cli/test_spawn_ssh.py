"""--spawn ssh for real: one command starts three nodes over a real sshd (127.0.0.2-4), as a throwaway user
with their own key and ssh config (tests/support/ssh_nodes.py). What a user sees: every node's output here,
the job's exit code and report, a script whose path and arguments hold spaces, quotes, `$` and unicode run
exactly as given; Ctrl-C (a second one too), SIGTERM, SIGHUP and SIGKILL of the spawning command leave nothing
on any node; node 0 runs here, without ssh, when it is this host; a host ssh cannot reach, one that refuses the
login, one without detlaunch and one with another detlaunch version are one line each, with nothing left on
the others."""

from __future__ import annotations

import pwd
import signal
import time
from collections.abc import Iterator

import detlaunch
import psutil
import pytest
from support.helpers import free_port
from support.jobs import Launcher
from support.ssh_nodes import HOSTS, NO_DETLAUNCH, OTHER, OTHER_VERSION, PYTHON, REFUSED, SshNodes, ssh_nodes

pytestmark = pytest.mark.timeout(120)

SCRIPT = """\
import os, signal, sys, time
print("args", sys.argv[1:], os.getcwd(), os.environ.get("DL_SHARED"), flush=True)
if os.environ.get("DL_HOLD") == "stubborn":  # caught, not ignored: its stop takes the whole grace period
    signal.signal(signal.SIGHUP, lambda *a: None)
    signal.signal(signal.SIGTERM, lambda *a: None)
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


def spawn(launcher: Launcher, nodes: SshNodes, hosts: tuple[str, ...], *extra: str, hold: bool = False,  # type: ignore[no-untyped-def]
          stubborn: bool = False):
    env = {**nodes.env, "DL_SHARED": "it's $shared", "DL_HOLD": "stubborn" if stubborn else "1" if hold else "",
           "DL_FAIL_AFTER": "3"}
    # No shared job directory: node 0 run here has its XDG_CACHE_HOME (nodes.env), the nodes an ssh login starts
    # the user's ~/.cache; the job secret reaches them from the spawning command (their stdin's first line)
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


def node_detlaunch(nodes: SshNodes, rank: int) -> psutil.Process:
    """Node `rank`'s detlaunch (the first of its processes: not a child of its own)."""
    words = ["--spawned", f"{detlaunch.__version__},stdin", "--node-rank", str(rank)]
    mine = {p.pid: p for p in psutil.process_iter(["uids", "cmdline"])
            if p.info["uids"] and p.info["uids"].real == nodes.user.pw_uid and (p.info["cmdline"] or [])[3:7] == words}
    [top] = [p for p in mine.values() if p.ppid() not in mine]
    return top


@pytest.mark.parametrize(("sig", "code", "here"), [
    (signal.SIGINT, 130, False), (signal.SIGKILL, -9, False), (signal.SIGTERM, 143, True), (signal.SIGHUP, 129, True),
], ids=["ctrl-c", "kill", "term", "hup"])
def test_stopping_the_spawning_command_stops_every_node(nodes: SshNodes, launcher: Launcher, sig: int, code: int,
                                                        here: bool) -> None:
    """`here`: node 0 is this host (127.0.0.1), run by the spawning command itself; node 1 by an sshd. Every
    node stops as on its own SIGHUP, its ranks given their grace period (none is SIGKILLed: they stop when
    asked), even a worker that hears of the chief's stop before its own stdin ends."""
    job = spawn(launcher, nodes, ("127.0.0.1" if here else HOSTS[0], HOSTS[1]), hold=True)
    for rank in range(2):
        job.wait_for_output(f"[rank={rank}] args", timeout=60)
    if here:
        assert node_detlaunch(nodes, 0).ppid() == job.proc.pid
        assert node_detlaunch(nodes, 1).parent().name() == "sshd"
    # Security round 2, item 7: an exported value (a token) is on no command line of the machine (ps shows them
    # to every local user), though every rank has it; PYTHONPATH, which the nodes' interpreters need, may be.
    shown = [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"])
             if any("$shared" in word for word in p.info["cmdline"] or ())]
    assert shown == [], shown
    job.send_signal(sig)
    done = job.wait(timeout=60)
    assert done.returncode == code, done.output
    assert "Traceback" not in done.output and "SIGKILLed" not in done.stderr, done.output
    launcher.assert_no_leftovers(settle=15)
    nodes.no_processes_left()


def test_a_second_ctrl_c_while_the_first_is_handled_stops_every_node_at_once(nodes: SshNodes,
                                                                             launcher: Launcher) -> None:
    """The ranks carry on after the first stop: the second Ctrl-C has every node kill its job at once (node 0
    here, node 1 over ssh, each saying so), not at the end of the 30 s grace period."""
    job = spawn(launcher, nodes, ("127.0.0.1", HOSTS[1]), "--grace-period", "30", stubborn=True)
    for rank in range(2):
        job.wait_for_output(f"[rank={rank}] args", timeout=60)
    job.send_signal(signal.SIGINT)
    job.wait_for_output("SIGHUP received: ", timeout=30)  # a node has it (the other hears of it too)
    second = time.monotonic()
    job.send_signal(signal.SIGINT)
    done = job.wait(timeout=60)
    assert done.returncode == 130 and time.monotonic() - second < 20, done.output
    assert "Traceback" not in done.output, done.output
    for node, host in enumerate(("127.0.0.1", HOSTS[1])):
        assert f"[node {node} ({host})] SIGHUP again: killing every process of the job now" in done.stderr, \
            done.output
    launcher.assert_no_leftovers(settle=15)
    nodes.no_processes_left()


def test_hosts_that_cannot_run_a_node_are_one_line_each(nodes: SshNodes, launcher: Launcher) -> None:
    """Unreachable, login refused, no detlaunch: ssh or the shell says why before any detlaunch starts (exit 1).
    Another version: that node's detlaunch says so, and its exit code (2, bad input) is the job's."""
    refused = f"ssh failed: {nodes.user.pw_name}@{REFUSED}: Permission denied (publickey)"
    version = f"runs detlaunch {OTHER}, the spawning command {detlaunch.__version__}: install the same detlaunch"
    for bad, reasons, code in (
            (("127.0.0.5", REFUSED, NO_DETLAUNCH), ("ssh failed: ssh: connect to host 127.0.0.5 port", refused,
                                                    "detlaunch not found there: "), 1),
            ((OTHER_VERSION,), (version,), 2)):
        done = spawn(launcher, nodes, (HOSTS[0], *bad), hold=True).wait(timeout=60)
        for node, (host, reason) in enumerate(zip(bad, reasons, strict=True), 1):
            lines = [line for line in done.stderr.splitlines() if f"node {node} ({host})" in line]
            assert len(lines) == 1 and reason in lines[0], done.output
        assert done.returncode == code, done.output
        launcher.assert_no_leftovers(settle=10)
        nodes.no_processes_left()
