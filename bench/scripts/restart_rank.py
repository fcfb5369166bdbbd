"""A rank for bench/restarts.py: stamps when it started and when its process group was up, and fails
on the first attempts.

    BENCH_OUT=DIR BENCH_FAILURES=N [BENCH_HOW=kill|exit] restart_rank.py

Writes DIR/a<attempt>-r<rank> = "<process start> <after init + barrier> <after import torch>"
(CLOCK_MONOTONIC, the clock the bench reads). On attempts 0..N-1 the last rank writes DIR/fail<attempt>
(the time) and fails: SIGKILL (kill), or exit 10+attempt (exit: a different failure each attempt, so no
crash-loop breaker stops it).
The attempt comes from DETLAUNCH_RESTART_COUNT, else TORCHELASTIC_RESTART_COUNT (bare torchrun).
Under --layer horovod (HOROVOD_RANK, no MASTER_ADDR) the process group is horovod's, the barrier an allreduce.
"""

import os
import signal
import sys
import time

started = time.monotonic()
out = os.environ["BENCH_OUT"]
attempt = int(os.environ.get("DETLAUNCH_RESTART_COUNT") or os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)

if "HOROVOD_RANK" in os.environ and "MASTER_ADDR" not in os.environ:  # --layer horovod: horovod's own collective
    import horovod.torch as hvd  # noqa: E402
    import torch  # noqa: E402

    imported = time.monotonic()
    hvd.init()
    rank, world = hvd.rank(), hvd.size()

    def barrier() -> None:
        hvd.allreduce(torch.zeros(1), name="barrier")

    def leave() -> None:
        hvd.shutdown()
else:
    import torch.distributed as dist  # noqa: E402  (the start stamp comes before the import)

    imported = time.monotonic()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    barrier, leave = dist.barrier, dist.destroy_process_group
barrier()
with open(os.path.join(out, f"a{attempt}-r{rank}"), "w") as f:
    f.write(f"{started} {time.monotonic()} {imported}\n")
if attempt < int(os.environ.get("BENCH_FAILURES", "1")) and rank == world - 1:
    with open(os.path.join(out, f"fail{attempt}"), "w") as f:
        f.write(f"{time.monotonic()}\n")
    if os.environ.get("BENCH_HOW", "kill") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(10 + attempt)
barrier()  # the survivors of a failing attempt wait here until they are stopped
leave()
sys.exit(0)
