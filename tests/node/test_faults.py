"""The fault matrix: two nodes on loopback (127.0.0.1 chief, 127.0.0.2 worker), one fault per cell.

Each cell asserts what a user sees: both nodes' exit codes, the root-cause line, that the last
line every rank wrote before the fault reached its log, and (the fixture) that no process of the
job is left on any node, not even the daemon each rank forked to escape (its own session, deaf to SIGTERM:
ranks.py's ESCAPE; tests/node/test_escape.py has the rest of that matrix). Timing bounds are generous;
the real latencies are measured in bench/.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import psutil
import pytest
from support.helpers import free_port, report_line
from support.jobs import SCRIPTS, Job, Launcher

pytestmark = pytest.mark.timeout(300)
RANKS = str(SCRIPTS / "ranks.py")
COLLECTIVE = {"torchrun": str(SCRIPTS / "collective.py"), "horovod": str(SCRIPTS / "hvd_collective.py"),
              "deepspeed": str(SCRIPTS / "collective.py"), "direct": str(SCRIPTS / "collective.py")}
FAULTY = 3  # the worker node's second rank
WORKER = "rank 3 on node 1 (127.0.0.2)"


class TwoNodes:
    """A 2x2 job of `layer`, both nodes started by the test, a FIFO to trigger rank 3's fault."""

    def __init__(self, launcher: Launcher, tmp_path: Path, layer: str, script: str, env: dict[str, str]):
        self.fifo = tmp_path / "trigger"
        os.mkfifo(self.fifo)
        self.logs = [tmp_path / "logs0", tmp_path / "logs1"]
        env = {"SLEEP": "300", "TRIGGER": str(self.fifo), "ESCAPE": "1", **env}  # and every rank's daemon
        # escapes (ranks.py): nothing of it may outlive the job either (the `launcher` fixture's check)
        master = str(free_port())
        if layer in ("torchrun", "direct"):  # the same flags: a script cannot tell them apart
            common = ["--layer", layer, "--nnodes", "2", "--nproc-per-node", "2",
                      "--master-addr", "127.0.0.1", "--master-port", master]
            per_node = [["--node-rank", "0", "--node-addr", "127.0.0.1"],
                        ["--node-rank", "1", "--node-addr", "127.0.0.2"]]
        else:
            common = ["--layer", layer, "--hosts", "127.0.0.1:2,127.0.0.2:2", "--master-port", master,
                      "--ssh-port", str(free_port("127.0.0.2"))]
            per_node = [["--node-rank", "0"], ["--node-rank", "1"]]
        self.triggered = "FAIL_RANK" in env
        self.launcher = launcher
        self.worker = launcher.start(*common, *per_node[1], "--log-dir", str(self.logs[1]), script, env=env)
        self.chief = launcher.start(*common, *per_node[0], "--log-dir", str(self.logs[0]), script, env=env)

    def node_of(self, rank: int) -> Job:
        return self.chief if rank < 2 else self.worker

    def wait_until_every_rank_is_up(self) -> None:
        for rank in range(4):
            self.node_of(rank).wait_for_output(f"[rank={rank}] rank {rank} {self.last_words(rank)}", timeout=180)

    def last_words(self, rank: int) -> str:
        """The last line `rank` writes before the fault: rank 3 waits for the trigger when it has one."""
        return "waiting" if rank == FAULTY and self.triggered else "sleeping"

    def pid_of(self, rank: int) -> int:
        """The rank's pid as this test sees it: the rank prints its pid inside its node's PID namespace."""
        m = re.search(rf"\[rank={rank}\] rank {rank} started pid=(\d+)", self.node_of(rank).read())
        assert m, self.node_of(rank).read()
        return self.node_of(rank).host_pid(int(m.group(1)))  # the rank printed its PID namespace's

    def trigger(self) -> None:
        with open(self.fifo, "wb") as f:
            f.write(b"x")

    def assert_last_lines_logged(self) -> None:
        for rank in range(4):
            log = (self.logs[rank // 2] / f"rank-{rank}.log").read_text()
            assert f"[rank={rank}] rank {rank} {self.last_words(rank)}" in log, (rank, log)


def wrapper_of(job: TwoNodes, rank: int) -> int:
    """The rank's wrapper, found among the processes of its node's detlaunch only (other tests run beside this
    one, with wrappers of their own rank 3): the rank's parent, or, for a warm rank (forked from the rank
    template, a child of its node's supervisor: docs/RESTARTS.md), the wrapper in front of that rank (it names
    the rank in RANK, or horovodrun's HOROVOD_RANK)."""
    rank_pid = job.pid_of(rank)
    parent = psutil.Process(rank_pid).ppid()
    for proc in psutil.Process(job.node_of(rank).proc.pid).children(recursive=True):
        try:
            named = (proc.environ().get("RANK"), proc.environ().get("HOROVOD_RANK"))
            if any(a.endswith("run_wrapper.py") for a in proc.cmdline()) and (proc.pid == parent or str(rank) in named):
                return proc.pid
        except psutil.Error:
            continue
    raise AssertionError(f"no wrapper of rank {rank} (pid {rank_pid}) under its node's detlaunch")


CELLS = {
    # fault: (env, how to inject, chief exit, worker exit, chief's report line, worker's report line);
    # a node that was SIGKILLed itself reports nothing (None)
    "rank_exits_3": ({"FAIL_RANK": "3", "FAIL_CODE": "3"}, "trigger", 3, 3,
                     f"job failed: {WORKER} exited with code 3", f"job failed: {WORKER} exited with code 3"),
    "rank_sigkill": ({}, "kill_rank", 137, 137,
                     f"job failed: {WORKER} killed by SIGKILL", f"job failed: {WORKER} killed by SIGKILL"),
    "wrapper_sigkill": ({}, "kill_wrapper", 137, 137,
                        f"job failed: {WORKER} its wrapper was killed before it could report (counted as SIGKILL)",
                        f"job failed: {WORKER} its wrapper was killed before it could report (counted as SIGKILL)"),
    "worker_supervisor_sigkill": ({}, "kill_worker", 1, -9,
                                  "job failed: lost node 1 (127.0.0.2): its detlaunch closed the connection "
                                  "without saying goodbye", None),
    "chief_sigint": ({}, "sigint_chief", 130, 130,
                     "job interrupted by SIGINT", "job failed: node 0 was interrupted by SIGINT"),
    "chief_sigterm": ({}, "sigterm_chief", 143, 143,
                      "job interrupted by SIGTERM", "job failed: node 0 was interrupted by SIGTERM"),
    "chief_sigkill": ({}, "kill_chief", -9, 1, None,
                      "job failed: lost the chief (127.0.0.1): the chief's detlaunch closed the connection"),
}


def assert_reported(stderr: str, line: str | None) -> None:
    """`line` is the node's report ("detlaunch: job ..."); None: the node was SIGKILLed and said nothing."""
    reports = re.findall(r"^detlaunch: job (?:failed|interrupted|finished).*$", stderr, re.M)
    assert reports[:1] == ([f"detlaunch: {line}"] if line else []), stderr


# SIGINT and SIGTERM to the chief take the same path but for the signal the ranks get: SIGINT on the layers that
# start the ranks themselves or through torchrun; SIGTERM on all (tests/node/test_escape.py has both on every layer).
FAULTS = [(layer, fault) for fault in CELLS for layer in ("torchrun", "horovod", "deepspeed", "direct")
          if not (fault == "chief_sigint" and layer in ("horovod", "deepspeed"))]


@pytest.mark.parametrize(("layer", "fault"), FAULTS)
def test_fault_outside_a_collective(launcher: Launcher, tmp_path: Path, layer: str, fault: str) -> None:
    env, how, chief_code, worker_code, chief_cause, worker_cause = CELLS[fault]
    job = TwoNodes(launcher, tmp_path, layer, RANKS, env)
    job.wait_until_every_rank_is_up()
    inject(job, how)
    rc, rw = job.chief.wait(120), job.worker.wait(120)
    assert (rc.returncode, rw.returncode) == (chief_code, worker_code), rc.output + "\n-----\n" + rw.output
    assert_reported(rc.stderr, chief_cause)
    assert_reported(rw.stderr, worker_cause)
    if fault == "rank_exits_3":  # the chief's report knows which ranks, on either node, were consequences:
        # stopped by detlaunch; or by a launcher that stops its other ranks itself, which may be first (torchrun,
        # deepspeed: each node's; horovodrun here leaves them to detlaunch: detlaunch_horovod/horovodrun.py)
        strict = layer in ("direct", "horovod")
        note = r"\(stopped by detlaunch\)" if strict else r"\((stopped by detlaunch|after the root cause)\)"
        for rank in (0, 1, 2):
            assert re.search(rf"^detlaunch:   rank {rank} \(node {rank // 2}\): .* {note}$", rc.stderr, re.M), \
                rc.stderr
    job.assert_last_lines_logged()
    assert launcher.leftovers(settle=15) == []


def inject(job: TwoNodes, how: str) -> None:
    if how == "trigger":
        job.trigger()
    elif how == "kill_rank":
        os.kill(job.pid_of(FAULTY), signal.SIGKILL)
    elif how == "kill_wrapper":
        os.kill(wrapper_of(job, FAULTY), signal.SIGKILL)
    elif how == "kill_worker":
        job.worker.send_signal(signal.SIGKILL)
    elif how == "sigint_chief":
        job.chief.send_signal(signal.SIGINT)
    elif how == "sigterm_chief":
        job.chief.send_signal(signal.SIGTERM)
    elif how == "kill_chief":
        job.chief.send_signal(signal.SIGKILL)
    else:
        raise ValueError(f"no such fault: {how}")


@pytest.mark.parametrize("layer", ["torchrun", "horovod", "deepspeed", "direct"])
def test_fault_while_the_survivors_are_inside_a_collective(launcher: Launcher, tmp_path: Path, layer: str) -> None:
    job = TwoNodes(launcher, tmp_path, layer, COLLECTIVE[layer], {"FAIL_RANK": "3", "FAIL_CODE": "3"})
    job.wait_until_every_rank_is_up()
    job.trigger()
    rc, rw = job.chief.wait(120), job.worker.wait(120)
    assert (rc.returncode, rw.returncode) == (3, 3), rc.output + "\n-----\n" + rw.output
    assert report_line(rc.stderr) == f"detlaunch: job failed: {WORKER} exited with code 3"
    assert report_line(rw.stderr) == report_line(rc.stderr)  # the worker names the same root cause
    assert "detlaunch:   | something broke in rank 3" in rc.stderr
    job.assert_last_lines_logged()
    assert launcher.leftovers(settle=15) == []


@pytest.mark.parametrize("layer", ["horovod", "deepspeed"])
def test_peer_sshd_not_reachable(launcher: Launcher, layer: str) -> None:
    """The worker's detlaunch is up, but its sshd is not where the chief looks: the chief gives up in time."""
    port = free_port("127.0.0.2")
    common = ["--layer", layer, "--hosts", "127.0.0.1:2,127.0.0.2:2", "--master-port", str(free_port()),
              "--start-timeout", "8"]
    worker = launcher.start(*common, "--ssh-port", str(free_port("127.0.0.2")), "--node-rank", "1", RANKS)
    chief = launcher.start(*common, "--ssh-port", str(port), "--node-rank", "0", RANKS)
    rc, rw = chief.wait(90), worker.wait(90)
    assert (rc.returncode, rw.returncode) == (1, 1), rc.output + rw.output
    assert report_line(rc.stderr) == (f"detlaunch: job failed: sshd on 127.0.0.2:{port} did not answer within 8 s "
                                      "(is detlaunch running on that node, with the same --ssh-port?)")
    assert report_line(rw.stderr) == report_line(rc.stderr)  # the chief's verdict is every node's
    assert rc.duration < 60


def test_a_rank_that_aborts_in_its_atexit_handler_fails_and_is_reported_as_such(launcher: Launcher,
                                                                                 tmp_path: Path) -> None:
    """An atexit handler of the script's own aborts (a final save that crashed): unlike a crash once Python
    finalizes (tests/layers/test_teardown_crash_job.py), the rank's work was not all done, so it fails. The
    report says plainly how far it had come."""
    script = tmp_path / "abort_at_exit.py"
    script.write_text("import atexit, os\natexit.register(os.abort)\nprint('work done', flush=True)\n")
    r = launcher.run("--layer", "torchrun", "--nproc-per-node", "1", "--master-port", str(free_port()), str(script))
    assert r.returncode == 134 and "[rank=0] work done" in r.stdout, r.output
    after = "after its script had finished (Python was running its atexit handlers)"
    assert report_line(r.stderr) == f"detlaunch: job failed: rank 0 on node 0 (127.0.0.1) killed by SIGABRT {after}"
    assert f"detlaunch:   rank 0 (node 0): killed by SIGABRT {after} (root cause)" in r.stderr.splitlines(), r.stderr
