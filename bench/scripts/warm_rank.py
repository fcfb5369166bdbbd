"""A rank for bench/warm.py: imports torch.distributed, joins the process group and a barrier, stamps,
and reports its memory (PSS) while every rank of the job is alive.

    BENCH_OUT=DIR warm_rank.py

Writes DIR/a0-r<rank> = "<process start> <after init + barrier> <after import torch>" (CLOCK_MONOTONIC, as
restart_rank.py) and DIR/pss-r<rank> = its PSS in kB, read between two barriers (so every rank is alive);
rank 0 adds the rank template's (the oldest process whose command line ends in rank/template.py: its forked
ranks show the same command line), when there is one.
"""

import os
import sys
import time

started = time.monotonic()
import torch.distributed as dist  # noqa: E402  (the start stamp comes before the import)

imported = time.monotonic()
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
ready = time.monotonic()
out = os.environ["BENCH_OUT"]
with open(os.path.join(out, f"a0-r{rank}"), "w") as f:
    f.write(f"{started} {ready} {imported}\n")


def pss_kb(pid: str) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))


dist.barrier()
pss = pss_kb("self")
if rank == 0:  # the template: the oldest process with its command line (its forked ranks keep that command line)
    started = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if any(a.endswith(b"rank/template.py") for a in f.read().split(b"\0")):
                    with open(f"/proc/{pid}/stat") as f:
                        started[pid] = int(f.read().rsplit(")", 1)[1].split()[19])
        except OSError:
            continue
    if started:
        pss += pss_kb(min(started, key=started.__getitem__))
with open(os.path.join(out, f"pss-r{rank}"), "w") as f:
    f.write(f"{pss}\n")
dist.barrier()
dist.destroy_process_group()
sys.exit(0)
