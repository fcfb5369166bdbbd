"""One check for a machine with a GPU (issue 24, item 2; for scripts/gpu_check.sh): a restart after a rank
that held 95% of device memory and was SIGKILLed while a kernel ran waits until the memory is free.

Needs torch with CUDA and nvidia-smi; runs detlaunch from this checkout's Python. Prints one line:

    restart waits for GPU memory: ok (attempt 2 allocated 131.2 GiB; detlaunch waited: yes; 14.2 s in all)

and exits 0, or prints "... FAILED: why" and the job's output, and exits 1. Never part of the test suite.
Not yet run on a GPU (written where none was at hand).

    python scripts/gpu_check_restart.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

RANK = r'''
import os, signal, sys
import torch
attempt, size_file = int(os.environ["DETLAUNCH_RESTART_COUNT"]) + 1, sys.argv[1]
free, total = torch.cuda.mem_get_info()
if attempt == 1:
    x = torch.empty(int(free * 0.95), dtype=torch.uint8, device="cuda")
    with open(size_file, "w") as f:
        f.write(str(x.numel()))
    torch.cuda._sleep(int(2e10))  # a kernel that spins for seconds
    print(f"attempt 1 holds {x.numel() / 2**30:.1f} GiB; SIGKILLed while a kernel runs", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
with open(size_file) as f:
    x = torch.empty(int(f.read()), dtype=torch.uint8, device="cuda")  # as much as attempt 1 held
torch.cuda.synchronize()
print(f"attempt 2 allocated {x.numel() / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free at its start)", flush=True)
'''
NAME = "restart waits for GPU memory"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "rank.py")
        with open(script, "w") as f:
            f.write(RANK)
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "detlaunch", "--layer", "direct", "--nproc-per-node", "1",
                               "--max-restarts", "1", "--restart-backoff", "0", script, os.path.join(tmp, "size")],
                              capture_output=True, text=True, timeout=240, check=False)
        took = time.monotonic() - started
    output = done.stdout + done.stderr
    allocated = re.search(r"attempt 2 allocated ([\d.]+) GiB", output)
    if done.returncode != 0 or not allocated:
        print(f"{NAME}: FAILED: exit {done.returncode} after {took:.1f} s, attempt 2 did not allocate 95%")
        print(output)
        return 1
    waited = "yes" if "waiting for GPU memory" in output or "waiting for every thread" in output else "no"
    print(f"{NAME}: ok (attempt 2 allocated {allocated.group(1)} GiB; detlaunch waited: {waited}; "
          f"{took:.1f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
