#!/usr/bin/env bash
# One command for the benchmarks: sets up what they need, then runs them (see bench/README.md).
#
#   bench/run.sh                 everything, 5 repetitions (about 20 minutes on 2 cores)
#   bench/run.sh --quick         2 repetitions, no 2M-line streams (about 7 minutes)
#   bench/run.sh --only teardown launch --reps 3
#   bench/run.sh --only flood    stop latency under a connection flood (as root: a throwaway user floods)
#   bench/run.sh --only spawn    --spawn ssh at 4 and 16 nodes vs the nodes started one by one (root: an sshd)
#
# Setup: scripts/setup.sh (apt packages incl. openmpi-bin and GNU time, .venv with torch, horovod,
# deepspeed and detlaunch), Determined 0.38.1 in its own venv (.venv-determined: it pins
# requests<2.32, so it must not share .venv), matplotlib in .venv.
# Results: bench/results/results.md, results.png, results.json (not committed).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DETLAUNCH_VENV:-$ROOT/.venv}"
DET_VENV="${DETERMINED_VENV:-$ROOT/.venv-determined}"
PY="${PYTHON:-python3}"
DETERMINED_VERSION=0.38.1
RESULTS="$ROOT/bench/results"

log() { printf '[bench setup] %s\n' "$*" >&2; }
mkdir -p "$RESULTS"

log "scripts/setup.sh (output in bench/results/setup.log)"
if ! "$ROOT/scripts/setup.sh" >"$RESULTS/setup.log" 2>&1; then
    tail -n 30 "$RESULTS/setup.log" >&2
    exit 1
fi

if ! "$DET_VENV/bin/python" -c "import determined, sys; sys.exit(determined.__version__ != '$DETERMINED_VERSION')" 2>/dev/null; then
    log "determined==$DETERMINED_VERSION in its own venv: $DET_VENV"
    "$PY" -m venv "$DET_VENV"
    "$DET_VENV/bin/pip" install -q --upgrade pip
    "$DET_VENV/bin/pip" install -q "determined==$DETERMINED_VERSION"
fi

if ! "$VENV/bin/python" -c "import matplotlib" 2>/dev/null; then
    log "matplotlib into $VENV"
    "$VENV/bin/pip" install -q "matplotlib>=3.8"
fi

cd "$ROOT"
exec "$VENV/bin/python" -m bench "$@"
