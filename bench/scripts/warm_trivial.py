"""A trivial rank for bench/warm.py: starts, prints one line, ends (no torch)."""

import os

print("rank", os.environ.get("RANK"), "up")
