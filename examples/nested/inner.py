"""A rank of the inner job: says who it is, and where its chief came from.

With --allreduce it also joins a torch.distributed gloo group (env://, as torchrun set it up) and
sums the ranks, proving that the inner nodes really formed one job.
INNER_FAIL_RANK=R INNER_FAIL_CODE=C makes rank R exit with C (the exit code travels out through
both detlaunch layers unchanged).
"""

import os
import sys

env = os.environ
print(f"inner rank={env['RANK']} of {env['WORLD_SIZE']} node={env['GROUP_RANK']} "
      f"master={env['MASTER_ADDR']}:{env['MASTER_PORT']} DET_CHIEF_IP={env['DET_CHIEF_IP']}", flush=True)
if env.get("INNER_FAIL_RANK") == env["RANK"]:
    print(f"inner rank {env['RANK']} fails on purpose", file=sys.stderr, flush=True)
    sys.exit(int(env.get("INNER_FAIL_CODE", "1")))
if "--allreduce" in sys.argv[1:]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    print(f"allreduce sum={total.item():g}", flush=True)
    dist.destroy_process_group()
