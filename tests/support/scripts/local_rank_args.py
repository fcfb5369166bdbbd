"""A deepspeed-style script: parses --local_rank as deepspeed's launcher passes it, and checks it against LOCAL_RANK."""

import argparse
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, required=True)
parser.add_argument("--epochs", type=int, required=True)
args = parser.parse_args()
if args.local_rank != int(os.environ["LOCAL_RANK"]):
    sys.exit(f"--local_rank={args.local_rank} but LOCAL_RANK={os.environ['LOCAL_RANK']}")
print(f"argv {' '.join(sys.argv[1:])} LOCAL_RANK={os.environ['LOCAL_RANK']} MASTER_ADDR={os.environ['MASTER_ADDR']}")
