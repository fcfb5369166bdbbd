#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the linters and the whole test suite.
# Extra arguments go to pytest: scripts/test.sh -k torchrun -x
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
PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pytest "$@"
