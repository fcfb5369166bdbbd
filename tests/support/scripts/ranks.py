"""A configurable rank for tests, with no torch import (fast to start).

Environment knobs (all optional):
  FAIL_RANK=R FAIL_CODE=C   rank R prints "rank R failing", writes to stderr, exits C
  KILL_RANK=R               rank R SIGKILLs itself
  SLEEP=S                   the other ranks print "rank N sleeping" and sleep S seconds
  LINES=N                   every rank prints N numbered lines first
  TRIGGER=FIFO              FAIL_RANK/KILL_RANK first print "rank R waiting" and block until
                            the test writes to the FIFO (so every rank is up when the fault hits)
  SAME=N                    every rank prints the same N lines ("warning: the same on every rank, i")
  IGNORE_TERM=1             the ranks ignore SIGTERM (SIG_IGN: detlaunch SIGKILLs them at once)
  TRAP_TERM=1               the ranks catch SIGTERM and carry on (so a stopping job lasts its grace period)
  ESCAPE=1                  every rank first forks a daemon that escapes: its own session, out of every
                            process group, deaf to SIGTERM, asleep 10 minutes (detlaunch must still end it)
  SHOW_ENV=A,B              every rank prints "rank N env A=<repr of its value, None when unset>", each
"""

import os
import signal
import sys
import time

rank = int(os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
for i in range(int(os.environ.get("LINES", "0"))):
    print(f"line {i} of rank {rank}")
for i in range(int(os.environ.get("SAME", "0"))):
    print(f"warning: the same on every rank, {i}")
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.environ.get("TRAP_TERM"):
    signal.signal(signal.SIGTERM, lambda signum, frame: print(f"rank {rank} carries on", flush=True))
if os.environ.get("ESCAPE") and os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.closerange(0, 3)
        time.sleep(600)
    os._exit(0)
print(f"rank {rank} started pid={os.getpid()}", flush=True)
for name in filter(None, os.environ.get("SHOW_ENV", "").split(",")):
    print(f"rank {rank} env {name}={os.environ.get(name)!r}", flush=True)

def wait_for_trigger() -> None:
    if os.environ.get("TRIGGER"):
        print(f"rank {rank} waiting", flush=True)
        with open(os.environ["TRIGGER"], "rb") as fifo:
            fifo.read(1)


if os.environ.get("FAIL_RANK") == str(rank):
    wait_for_trigger()
    print(f"rank {rank} failing", flush=True)
    print(f"something broke in rank {rank}", file=sys.stderr, flush=True)
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
if os.environ.get("KILL_RANK") == str(rank):
    wait_for_trigger()
    print(f"rank {rank} killing itself", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

sleep = float(os.environ.get("SLEEP", "0"))
if sleep:
    print(f"rank {rank} sleeping", flush=True)
    try:
        time.sleep(sleep)
    except KeyboardInterrupt:
        print(f"rank {rank} interrupted", flush=True)
        sys.exit(130)
print(f"rank {rank} done", flush=True)
