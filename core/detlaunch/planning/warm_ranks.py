"""Warm ranks in the plan: whether this node's ranks are forked from a rank template, and what it imports.

Pure (the dry run shows it); node/rank_template.py starts the template, rank/template.py is it.
"""

from __future__ import annotations

import re
from typing import Any

from detlaunch.rank import warm

LaunchPlan = Any  # planning/plan.py's, which imports this module

PRELOAD_ENV = "DETLAUNCH_PRELOAD"
# `import torch`, `import os, torch.distributed as dist`, `from torch import nn`: at any indentation
IMPORTS_TORCH = re.compile(
    rb"^[ \t]*(?:from[ \t]+torch\b|import[ \t]+(?:[\w.]+(?:[ \t]+as[ \t]+\w+)?[ \t]*,[ \t]*)*torch\b)", re.MULTILINE)
DEFAULT_IMPORTS = ("torch", "torch.distributed")


def why_cold(plan: LaunchPlan) -> str:
    """Why this node's ranks start cold ('' : they are forked from a rank template)."""
    if plan.settings.get("no_warm_ranks"):
        return "--no-warm-ranks"
    commands = [c for c in plan.stage.commands if c.rank is not None]
    if not commands:
        return "this layer's launcher starts the ranks (warm ranks: --layer direct)"
    if warm.python_command(plan.user_command) is None:
        return "the command is not `python SCRIPT` or `python -m MODULE`"
    return ""


def imports(plan: LaunchPlan) -> tuple[str, ...]:
    """What the template imports: torch and torch.distributed when the script mentions torch (or runs as
    -m MODULE), then --preload. A script that does not is forked from a template that imported nothing
    more: no interpreter start per rank, and no torch import it would not have made."""
    preload = tuple(m for m in str(plan.settings.get("preload") or "").split(",") if m)
    return (*DEFAULT_IMPORTS, *preload) if mentions_torch(plan.user_command) else preload


def mentions_torch(command: tuple[str, ...]) -> bool:
    parsed = warm.python_command(command)
    if parsed is None or parsed[1] == "module":
        return True
    try:
        with open(parsed[2], "rb") as f:
            return IMPORTS_TORCH.search(f.read(1 << 20)) is not None
    except OSError:
        return True


def describe(plan: LaunchPlan) -> str:
    """The dry run's line."""
    why = why_cold(plan)
    if why:
        return f"warm ranks: off ({why}): each rank is a new interpreter"
    what = ", ".join(imports(plan)) or "nothing more (the script does not mention torch; --preload adds modules)"
    return f"warm ranks: every rank is forked from a rank template that imported {what} once (--no-warm-ranks: off)"
