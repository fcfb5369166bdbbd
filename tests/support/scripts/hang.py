"""A rank for the hang tests: every rank runs STEPS gloo all_reduces, printing each, then HANG_RANK hangs.

HANG (what HANG_RANK does after its steps, while the others wait in the next all_reduce):
  sleep    sleeps 300 s before the collective
  stop     SIGSTOPs itself
  raise    raises, and hangs in an atexit handler (linger: sleeps 300 s)
  exit     exits 3 (the others wait in the collective: dump before kill)
  loop     (every rank) all_reduces forever, printing each step: a test SIGSTOPs one from outside
  beat     rank 0 calls detlaunch.progress() every 0.2 s for BEAT_FOR s, then prints a line every
           0.2 s without beating; the other ranks wait in the collective, silent
  sync     the others enter the next all_reduce asynchronously (a NCCL collective returns at once on a
           GPU) and block at their next sync point (`sync_point`: a sleep, where `.item()` would wait
           on the GPU); HANG_RANK sleeps in `load_batch` before it: no stack is in a collective
  (none)   every rank does one more all_reduce and prints "rank N done"
BEAT=1: every step also calls detlaunch.progress(step) on rank 0 only, and only rank 0 prints.
HANG_UNTIL=FIFO: `sleep` waits until a byte comes through FIFO instead (then the job ends normally).
UNDUMPABLE=0,2: those ranks make themselves undumpable (prctl PR_SET_DUMPABLE 0: no ptrace, no py-spy);
NO_FAULTHANDLER=2: those ranks take detlaunch's faulthandler off signal 41 again.
"""

import atexit
import os
import signal
import sys
import time
from datetime import timedelta

print(f"rank {os.environ.get('RANK')} importing torch", flush=True)  # seconds of silence follow

import detlaunch  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def linger() -> None:
    time.sleep(300)  # an atexit handler that never returns (destroy_process_group, a thread's join)


def load_batch() -> None:
    time.sleep(300)


def sync_point() -> None:
    time.sleep(300)


dist.init_process_group("gloo", timeout=timedelta(seconds=600))
rank = dist.get_rank()
if str(rank) in os.environ.get("UNDUMPABLE", "").split(","):
    import ctypes

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
if str(rank) in os.environ.get("NO_FAULTHANDLER", "").split(","):
    import faulthandler

    faulthandler.unregister(41)
print(f"rank {rank} initialized", flush=True)
mode = os.environ.get("HANG", "")
who = int(os.environ.get("HANG_RANK", "1"))
quiet = os.environ.get("BEAT") == "1"
step = 0
while mode == "loop" or step < int(os.environ.get("STEPS", "10")):
    dist.all_reduce(torch.ones(1))
    if quiet:
        if rank == 0:
            detlaunch.progress(step)
    else:
        print(f"rank {rank} step {step}", flush=True)
    time.sleep(float(os.environ.get("STEP_SLEEP", "0.05")))
    step += 1
if not quiet:
    print(f"rank {rank} steady pid={os.getpid()}", flush=True)
if mode == "beat" and rank == 0:
    deadline = time.monotonic() + float(os.environ.get("BEAT_FOR", "3"))
    while time.monotonic() < deadline:
        detlaunch.progress()
        time.sleep(0.2)
    print("rank 0 stops beating", flush=True)
    while True:
        print("rank 0 still printing", flush=True)
        time.sleep(0.2)
if mode == "sync":
    print(f"rank {rank} at the sync point", flush=True)
    if rank == who:
        load_batch()
    work = dist.all_reduce(torch.ones(1), async_op=True)
    sync_point()
if rank == who:
    if mode == "sleep" and os.environ.get("HANG_UNTIL"):
        print(f"rank {rank} waiting for the trigger", flush=True)
        with open(os.environ["HANG_UNTIL"], "rb") as trigger:
            trigger.read(1)
    elif mode == "sleep":
        time.sleep(300)
    elif mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif mode == "raise":
        atexit.register(linger)
        raise RuntimeError(f"rank {rank} broke")
    elif mode == "exit":
        print(f"rank {rank} failing", file=sys.stderr, flush=True)
        sys.exit(3)
dist.all_reduce(torch.ones(1))
if not quiet or rank == 0:
    print(f"rank {rank} done", flush=True)
# Without it, torch's exit can abort ("terminate called without an active exception", SIGABRT) while
# a process-group thread is still joinable (zero2_train.py too).
dist.destroy_process_group()
sys.exit(0)
