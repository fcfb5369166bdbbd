"""A stop no harsher than torchrun's (rank/stopping.py): the rank's own process is asked first, so a
checkpoint-on-SIGTERM handler finishes while the processes it started (a DataLoader's workers) still
serve it; the default grace is torchrun's 30 s, yet a rank that ignores SIGTERM is SIGKILLed at once.
Under torchrun and horovod, the launcher's own SIGKILL of its ranks waits past detlaunch's grace.
Real jobs; nothing of them may be left (the `launcher` fixture's check)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from support.helpers import free_port, rank_lines, report_line
from support.jobs import SCRIPTS, Launcher

pytestmark = pytest.mark.timeout(180)
RANKS = str(SCRIPTS / "ranks.py")

# Rank 0 starts a stand-in for a DataLoader worker in its own process group (it answers over a pipe,
# and after its input ends it lingers, holding the rank's stderr). On SIGTERM rank 0 saves a checkpoint
# for STEPS/5 s, asking the worker for each piece, then dies of the signal as the default would.
CHECKPOINTS = """
import os, signal, subprocess, sys, time
rank = int(os.environ.get("HOROVOD_RANK") or os.environ["RANK"])
if rank == 0:
    worker = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\\nfor line in sys.stdin:\\n"
         "    print('alive', line.strip(), flush=True)\\ntime.sleep(300)\\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    def on_term(signum, frame):
        print("rank 0 saving", flush=True)
        path = os.environ["CHECKPOINT"]
        with open(path + ".part", "w") as f:
            for i in range(int(os.environ["STEPS"])):
                worker.stdin.write(f"{i}\\n")
                worker.stdin.flush()
                f.write(worker.stdout.readline())  # the worker must still be alive to answer
                time.sleep(0.2)
            f.write("complete\\n")
        os.rename(path + ".part", path)
        print(f"rank 0 saved; worker {worker.pid}", flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    signal.signal(signal.SIGTERM, on_term)
print(f"rank {rank} ready", flush=True)
if rank == 1 and os.environ.get("TRIGGER"):
    with open(os.environ["TRIGGER"], "rb") as fifo:
        fifo.read(1)
    sys.exit(3)
while True:
    time.sleep(0.1)
"""


def layer_args(layer: str) -> list[str]:
    return ["--layer", layer, "--nproc-per-node", "2", "--master-port", str(free_port())]


@pytest.mark.parametrize("ending", ["rank_fails", "sigterm"])
@pytest.mark.parametrize("layer", ["direct", "torchrun", "horovod"])
def test_a_checkpoint_handler_finishes_while_its_workers_still_answer(launcher: Launcher, tmp_path: Path,
                                                                     layer: str, ending: str) -> None:
    script, trigger, checkpoint = tmp_path / "checkpoints.py", tmp_path / "trigger", tmp_path / "ckpt"
    script.write_text(CHECKPOINTS)
    os.mkfifo(trigger)
    # Under horovod, longer than horovodrun's own 5 s between its SIGTERM and its SIGKILL (detlaunch_horovod/grace.py)
    steps = 35 if layer == "horovod" else 10
    env = {"CHECKPOINT": str(checkpoint), "STEPS": str(steps),
           **({"TRIGGER": str(trigger)} if ending == "rank_fails" else {})}
    job = launcher.start(*layer_args(layer), str(script), env=env)  # the default grace period: 30 s
    for rank in (0, 1):
        job.wait_for_output(f"[rank={rank}] rank {rank} ready")
    asked = time.monotonic()
    if ending == "rank_fails":
        trigger.write_bytes(b"x")
    else:
        job.send_signal(signal.SIGTERM)
    r = job.wait(90)
    took = time.monotonic() - asked
    assert r.returncode == (3 if ending == "rank_fails" else 143), r.output
    assert checkpoint.read_text() == "".join(f"alive {i}\n" for i in range(steps)) + "complete\n", r.output
    lines = rank_lines(r.stdout, 0)
    assert lines[:2] == ["rank 0 ready", "rank 0 saving"] and lines[2].startswith("rank 0 saved; worker "), r.output
    assert "rank 0 (node 0): killed by SIGTERM (stopped by detlaunch)" in r.stderr, r.stderr
    # The rank ended by itself, its worker of the SIGTERM after it (a pid the rank prints is its PID namespace's:
    # the fixture's leak check, by marker, finds the worker if it is left).
    assert "SIGKILLed" not in r.stderr and "by SIGKILL" not in r.stderr, r.stderr
    assert took < 25, (took, r.output)  # about the handler's 2 s (horovod: 7 s), not the 30 s grace period


def test_a_rank_that_ignores_sigterm_is_killed_at_once_not_after_the_grace_period(launcher: Launcher,
                                                                                  tmp_path: Path) -> None:
    trigger = tmp_path / "trigger"
    os.mkfifo(trigger)
    env = {"IGNORE_TERM": "1", "FAIL_RANK": "1", "TRIGGER": str(trigger), "SLEEP": "300"}
    job = launcher.start(*layer_args("torchrun"), RANKS, env=env)  # the default grace period: 30 s
    job.wait_for_output("[rank=0] rank 0 sleeping")
    job.wait_for_output("[rank=1] rank 1 waiting")
    asked = time.monotonic()
    trigger.write_bytes(b"x")
    r = job.wait(90)
    took = time.monotonic() - asked
    assert r.returncode == 3, r.output
    assert report_line(r.stderr) == "detlaunch: job failed: rank 1 on node 0 (127.0.0.1) exited with code 3"
    assert "[rank=0] detlaunch: it ignores SIGTERM: SIGKILLed now, not after the grace period" in r.stderr, r.stderr
    assert "rank 0 (node 0): killed by SIGKILL (stopped by detlaunch)" in r.stderr, r.stderr
    assert took < 10, (took, r.output)
