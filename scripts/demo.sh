#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the demo job: two ranks, a real gloo all_reduce.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "${DETLAUNCH_VENV:-$ROOT/.venv}/bin/detlaunch" --layer torchrun --nproc-per-node 2 examples/allreduce.py
