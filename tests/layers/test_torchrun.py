"""The torchrun layer, for real: torchrun, gloo, CPU ranks, one and two nodes on loopback."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from support.helpers import free_port, rank_lines, report_line
from support.jobs import EXAMPLES, SCRIPTS, Launcher

pytestmark = pytest.mark.timeout(180)
ALLREDUCE = str(EXAMPLES / "allreduce.py")
RANKS = str(SCRIPTS / "ranks.py")


def torchrun(*args: str) -> list[str]:
    return ["--layer", "torchrun", "--master-port", str(free_port()), *args]


def test_single_node_two_ranks_all_reduce(launcher: Launcher) -> None:
    r = launcher.run(*torchrun("--nproc-per-node", "2", ALLREDUCE))
    assert r.returncode == 0, r.output
    for rank in (0, 1):
        assert rank_lines(r.stdout, rank) == [f"rank {rank} of 2: all_reduce sum = 1 (chief 127.0.0.1)"]
    assert "job finished: 2 rank(s)" in r.stderr


def test_two_nodes_on_two_loopback_addresses(launcher: Launcher) -> None:
    port = str(free_port())
    common = ["--layer", "torchrun", "--nnodes", "2", "--nproc-per-node", "2",
              "--master-addr", "127.0.0.1", "--master-port", port]
    chief = launcher.start(*common, "--node-rank", "0", "--node-addr", "127.0.0.1", ALLREDUCE)
    worker = launcher.start(*common, "--node-rank", "1", "--node-addr", "127.0.0.2", ALLREDUCE)
    rc, rw = chief.wait(), worker.wait()
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    expected = "of 4: all_reduce sum = 6 (chief 127.0.0.1)"
    assert [rank_lines(rc.stdout, r) for r in (0, 1)] == [[f"rank {r} {expected}"] for r in (0, 1)]
    assert [rank_lines(rw.stdout, r) for r in (2, 3)] == [[f"rank {r} {expected}"] for r in (2, 3)]


def test_a_failing_rank_stops_the_job_with_its_own_exit_code(launcher: Launcher, tmp_path: Path) -> None:
    trigger = tmp_path / "trigger"
    os.mkfifo(trigger)
    job = launcher.start(*torchrun("--nproc-per-node", "2", RANKS),
                         env={"FAIL_RANK": "1", "FAIL_CODE": "3", "SLEEP": "120", "TRIGGER": str(trigger)})
    job.wait_for_output("[rank=0] rank 0 sleeping")
    job.wait_for_output("[rank=1] rank 1 waiting")
    trigger.write_bytes(b"x")
    r = job.wait(60)
    assert r.returncode == 3, r.output
    assert report_line(r.stderr) == "detlaunch: job failed: rank 1 on node 0 (127.0.0.1) exited with code 3"
    assert "detlaunch:   | something broke in rank 1" in r.stderr
    assert "rank 0 (node 0): killed by SIGTERM (stopped by detlaunch)" in r.stderr
    assert rank_lines(r.stdout, 0)[-1] == "rank 0 sleeping"
    assert r.duration < 60  # the survivor would sleep 120 s


def test_a_rank_killed_by_sigkill_exits_137(launcher: Launcher, tmp_path: Path) -> None:
    trigger = tmp_path / "trigger"
    os.mkfifo(trigger)
    job = launcher.start(*torchrun("--nproc-per-node", "2", RANKS),
                         env={"KILL_RANK": "0", "SLEEP": "120", "TRIGGER": str(trigger)})
    job.wait_for_output("[rank=0] rank 0 waiting")
    job.wait_for_output("[rank=1] rank 1 sleeping")
    trigger.write_bytes(b"x")
    r = job.wait(60)
    assert r.returncode == 137, r.output
    assert report_line(r.stderr) == "detlaunch: job failed: rank 0 on node 0 (127.0.0.1) killed by SIGKILL"
    assert "rank 1 (node 0): killed by SIGTERM (stopped by detlaunch)" in r.stderr, r.stderr
    assert [rank_lines(r.stdout, rank)[-1] for rank in (0, 1)] == ["rank 0 killing itself", "rank 1 sleeping"]
    assert r.duration < 60  # the survivor would sleep 120 s


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_detlaunch_reaches_every_rank(launcher: Launcher, sig: signal.Signals) -> None:
    job = launcher.start(*torchrun("--nproc-per-node", "2", RANKS), env={"SLEEP": "120"})
    job.wait_for_output("rank 0 sleeping")
    job.wait_for_output("rank 1 sleeping")
    job.send_signal(sig)
    r = job.wait(60)
    assert r.returncode == 128 + sig, r.output
    assert f"job interrupted by {sig.name}" in r.stderr
    for rank in (0, 1):  # each rank got the signal itself (a SIGINT as a KeyboardInterrupt, not a kill)
        last = "interrupted" if sig == signal.SIGINT else "sleeping"
        assert rank_lines(r.stdout, rank)[-1] == f"rank {rank} {last}", r.output
        stopped = rf"^detlaunch:   rank {rank} \(node 0\): .*\(stopped by detlaunch\)$"
        assert re.search(stopped, r.stderr, re.M), r.stderr
        if sig != signal.SIGINT:
            assert f"rank {rank} (node 0): killed by {sig.name} (stopped by detlaunch)" in r.stderr, r.stderr
    assert r.duration < 60  # the ranks would sleep 120 s


def test_a_second_ctrl_c_kills_at_once(launcher: Launcher, tmp_path) -> None:
    stubborn = tmp_path / "stubborn.py"
    # It catches the signals and carries on: it gets the grace period (one that ignores them would be
    # SIGKILLed at once, with no grace to cut short).
    stubborn.write_text("import signal, time\nsignal.signal(signal.SIGINT, lambda *a: None)\n"
                        "signal.signal(signal.SIGTERM, lambda *a: None)\nprint('ignoring', flush=True)\n"
                        "while True:\n    time.sleep(1)\n")
    job = launcher.start(*torchrun("--nproc-per-node", "2", "--grace-period", "100", str(stubborn)))
    job.wait_for_output("[rank=1] ignoring")
    job.wait_for_output("[rank=0] ignoring")
    job.send_signal(signal.SIGINT)
    job.wait_for_output("stopping the job")
    job.send_signal(signal.SIGINT)
    r = job.wait(30)  # the grace period (100 s) was not waited out
    assert r.returncode == 130, r.output
    assert "killing every process of the job now" in r.stderr


def test_sigkill_to_detlaunch_leaves_no_rank_behind(launcher: Launcher) -> None:
    job = launcher.start(*torchrun("--nproc-per-node", "2", RANKS), env={"SLEEP": "300"})
    job.wait_for_output("rank 0 sleeping")
    job.wait_for_output("rank 1 sleeping")
    job.send_signal(signal.SIGKILL)
    job.proc.wait()
    assert launcher.leftovers(settle=10) == []


def test_every_rank_output_arrives_whole_prefixed_and_in_order(launcher: Launcher) -> None:
    r = launcher.run(*torchrun("--nproc-per-node", "3", RANKS), env={"LINES": "3000"})
    assert r.returncode == 0, r.output
    for rank in range(3):
        lines = rank_lines(r.stdout, rank)
        assert lines[:3000] == [f"line {i} of rank {rank}" for i in range(3000)]
        assert re.fullmatch(rf"rank {rank} started pid=\d+", lines[3000]), lines[3000:]
        assert lines[3001:] == [f"rank {rank} done"]
    assert all(line.startswith("[rank=") for line in r.stdout.splitlines())


def test_a_process_that_leaves_the_ranks_group_with_its_output_does_not_fail_the_job(
        launcher: Launcher, tmp_path: Path) -> None:
    # Rank 0 exits 0, but a child it started in a session of its own still holds its stdout: the
    # wrapper stops waiting for that output after the grace period, reports the rank's own 0, and
    # detlaunch stops the straggler (the leak check below the test proves it is gone).
    script = tmp_path / "escape.py"
    script.write_text("import os, subprocess\n"
                      "if os.environ['RANK'] == '0':\n"
                      "    subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
                      "print('spawned', flush=True)\n")
    r = launcher.run(*torchrun("--nproc-per-node", "2", "--grace-period", "1", str(script)), timeout=60)
    assert r.returncode == 0, r.output
    assert [rank_lines(r.stdout, rank) for rank in (0, 1)] == [["spawned"], ["spawned"]], r.output
    assert "detlaunch: killing process(es) that outlived the job: [" in r.stderr, r.output
    assert "job finished: 2 rank(s) exited 0" in r.stderr, r.output
    assert r.duration < 45, r.output
