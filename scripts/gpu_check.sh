#!/usr/bin/env bash
# The GPU paths, checked on a real GPU machine in one short run (under 5 minutes on one GPU; more
# checks with two or more). One line per check: "ok <check>" or "FAILED <check>: <why>".
# Never part of the suite (CI has no GPU): run it by hand where a GPU is at hand, after scripts/setup.sh
# (or with DETLAUNCH_VENV pointing at a venv with a CUDA torch and detlaunch installed).
#
#   scripts/gpu_check.sh            # every check this machine's GPU count allows
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DETLAUNCH_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
WORK="$(mktemp -d)"  # private (0700), removed at the end
trap 'rm -rf "$WORK"' EXIT
NGPU="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)"
[ "$NGPU" -gt 0 ] || { echo "FAILED setup: no CUDA device visible to torch in $VENV"; exit 1; }
echo "gpus: $NGPU ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
FAILED=0
check() {  # check NAME EXPECTED_CODE GREP -- detlaunch args...
    local name="$1" want="$2" pattern="$3"; shift 4
    local out="$WORK/$name.log" start=$SECONDS
    timeout 240 "$PY" -m detlaunch "$@" >"$out" 2>&1
    local code=$?
    if [ "$code" = "$want" ] && grep -Eq "$pattern" "$out"; then
        echo "ok $name ($((SECONDS - start)) s)"
    else
        echo "FAILED $name: exit $code (want $want), /$pattern/ $(grep -Ec "$pattern" "$out") time(s); last lines:"
        tail -n 15 "$out" | sed 's/^/    /'
        FAILED=1
    fi
}

cat >"$WORK/own_device.py" <<'EOF'
import os, torch
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
props = torch.cuda.get_device_properties(local)
print(f"rank {os.environ['RANK']} local {local} sees {torch.cuda.device_count()} device(s), uses {props.uuid}"
      f" CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '-')}")
EOF
cat >"$WORK/cuda_sync_hang.py" <<'EOF'
import torch
print("spinning on the GPU", flush=True)
torch.cuda._sleep(10**13)  # far longer than the hang timeout
torch.cuda.synchronize()
EOF
cat >"$WORK/nccl_one_late.py" <<'EOF'
import os, time, datetime, torch, torch.distributed as dist
local = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local)
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=int(os.environ["PG_TIMEOUT"])))
t = torch.ones(1, device="cuda")
for _ in range(3):
    dist.all_reduce(t)
torch.cuda.synchronize()
print(f"rank {dist.get_rank()} before the late collective", flush=True)
if dist.get_rank() == 1:
    time.sleep(120)  # past a 30 s process-group timeout: NCCL's watchdog aborts rank 0
dist.all_reduce(t)
torch.cuda.synchronize()
EOF

check own-device 0 "rank 0 local 0 sees $NGPU device" -- --layer torchrun --nproc-per-node "$NGPU" "$WORK/own_device.py"
if [ "$NGPU" -gt 1 ]; then
    n=$(grep -o "uses GPU-[0-9a-f-]*" "$WORK/own-device.log" | sort -u | wc -l)
    [ "$n" = "$NGPU" ] && echo "ok every rank on its own device" || { echo "FAILED own devices: $n distinct of $NGPU"; FAILED=1; }
fi
check own-device-slots 0 "sees 1 device" -- --layer direct --nproc-per-node 1 "$WORK/own_device.py"
if "$PY" "$ROOT/scripts/gpu_check_restart.py" >"$WORK/restart.log" 2>&1; then
    sed -n 's/^/ok /;1p' "$WORK/restart.log"
else
    echo "FAILED $(head -n 1 "$WORK/restart.log")"; tail -n +2 "$WORK/restart.log" | tail -n 15 | sed 's/^/    /'; FAILED=1
fi
check hang-in-cuda-sync 124 "rank 0.*(cuda|synchronize|_sleep)" -- \
    --layer torchrun --nproc-per-node 1 --hang-timeout 20 "$WORK/cuda_sync_hang.py"
if [ "$NGPU" -gt 1 ]; then
    # a hang detlaunch sees first (NCCL's timeout is longer): the Flight Recorder names the late rank
    PG_TIMEOUT=300 check nccl-hang-flight-recorder 124 "flight recorder: rank 1 never entered all_reduce" -- \
        --layer torchrun --nproc-per-node 2 --hang-timeout 20 "$WORK/nccl_one_late.py"
    # NCCL's watchdog first (30 s): an infrastructure failure, restarted, the survivor marked as following it
    PG_TIMEOUT=30 check nccl-timeout-restarted 1 "restart 1 of 1" -- \
        --layer torchrun --nproc-per-node 2 --max-restarts 1 "$WORK/nccl_one_late.py"
    grep -E "restart|crash loop|aborted after|Watchdog|job failed" "$WORK/nccl-timeout-restarted.log" | head -n 8 | sed 's/^/    /'
else
    echo "skipped nccl-hang-flight-recorder, nccl-timeout-restarted: need 2 GPUs"
fi
exit "$FAILED"
