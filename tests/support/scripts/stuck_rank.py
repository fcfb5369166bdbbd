"""Attempt 1: rank 0 is left a zombie leader whose thread is stuck in a driver (a read of a FUSE file that
is answered late, tests/support/stuck_fs.py: SIGKILL cannot end it); rank 1 says what /proc shows of it,
then fails (exit 3). Attempt 2: each rank says when it started.

    stuck_rank.py STUCK_FILE ARRIVED_FILE PID_FILE
"""

import ctypes
import os
import platform
import sys
import threading
import time

stuck, arrived, pidfile = sys.argv[1:4]
rank, attempt = int(os.environ["RANK"]), int(os.environ["DETLAUNCH_RESTART_COUNT"]) + 1
if attempt > 1:
    print(f"rank {rank} attempt {attempt} starts at {time.time():.6f}", flush=True)
elif rank == 0:
    threading.Thread(target=lambda: open(stuck, "rb").read(), daemon=True).start()
    while not os.path.exists(arrived):  # the read is in: the thread waits inside the file system
        time.sleep(0.01)
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    # The raw exit system call ends this thread only (os._exit would end them all): a zombie leader.
    ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)
else:
    while not os.path.exists(pidfile):
        time.sleep(0.01)
    with open(pidfile) as f:
        pid = int(f.read())
    deadline = time.monotonic() + 10
    while True:
        states = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states[int(tid)] = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
        if states.get(pid) == "Z" or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    others = " ".join(sorted(state for tid, state in states.items() if tid != pid))
    print(f"rank 0's leader: {states.get(pid)}; its other task(s): {others}", flush=True)
    sys.exit(3)
