#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the linters and the whole test suite.
# Extra arguments go to pytest: scripts/test.sh -k torchrun -x
# The suite runs on four pytest-xdist workers, a test file each at a time (--dist loadfile: a file's
# module and session fixtures, the SLURM test cluster among them, stay in one process); much of a
# real job's time is spent waiting (timeouts, heartbeats, a peer's start): measured on 2 cores, four
# side by side end the suite about a fifth sooner than two. Each worker picks ports from its own range (tests/support/helpers.free_port).
# scripts/test.sh -n 0 runs it in one process.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
VENV="${DETLAUNCH_VENV:-$ROOT/.venv}"
cd "$ROOT"
echo "[test] ruff" >&2
"$VENV/bin/ruff" check core plugins tests examples bench
echo "[test] mypy" >&2
"$VENV/bin/mypy" core plugins
echo "[test] pytest" >&2
PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pytest -n 4 --dist loadfile "$@"
