"""A gloo all_reduce that reports the MASTER_ADDR its rank was given (the rendezvous went through it)."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()}: all_reduce sum = {t.item():g} MASTER_ADDR={os.environ['MASTER_ADDR']}"
      + (f" GLOO_SOCKET_IFNAME={os.environ['GLOO_SOCKET_IFNAME']}" if "GLOO_SOCKET_IFNAME" in os.environ else ""))
dist.destroy_process_group()
