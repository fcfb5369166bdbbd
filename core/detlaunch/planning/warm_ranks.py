"""Warm ranks in the plan: whether this node's ranks are forked from a rank template, and what it imports.

Pure (the dry run shows it); node/rank_template.py starts the template, rank/template.py is it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
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
    if launcher_env(plan) is None:
        return "this layer's launcher starts the ranks, and the layer does not say what it sets in their environment"
    if warm.python_command(plan.user_command) is None:
        return "the command is not `python SCRIPT` or `python -m MODULE`"
    return why_not_forkable(plan)


def why_not_forkable(plan: LaunchPlan, env: Mapping[str, str] | None = None) -> str:
    """Why a template would have threads after importing torch ('' : it would not): torch starts OpenMP's pool
    at import, one thread per CPU unless OMP_NUM_THREADS says, and a process with threads is never forked
    (rank/template.py). So it is not started for nothing: the ranks start cold, said in one line."""
    if "torch" not in imports(plan):
        return ""
    value = ranks_env(plan, env).get("OMP_NUM_THREADS", "").strip()
    if value == "1" or not value and len(os.sched_getaffinity(0)) <= 1:
        return ""
    what = f"is {value}" if value else "is unset"
    return (f"the ranks' OMP_NUM_THREADS {what} (torch starts that many OpenMP threads at import, one a CPU when "
            "unset, and a process with threads is not forked: OMP_NUM_THREADS=1 makes them warm)")


def ranks_env(plan: LaunchPlan, env: Mapping[str, str] | None = None,
              defaults: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of this node's first rank as far as the template shares it: what its starter inherits
    (`env`, the supervisor's: plan.process_env()), the starter's own, what a launcher adds, the rank defaults."""
    first = starter(plan)
    out = {**(plan.process_env() if env is None else env), **(first.env if first is not None else {}),
           **(launcher_env(plan) or {})}
    for key, value in (plan.rank_defaults if defaults is None else defaults).items():
        out.setdefault(key, value)
    return out


def launcher_env(plan: LaunchPlan) -> dict[str, str] | None:
    """What this node's ranks get in their environment besides what their starter inherits: {} where the
    supervisor starts them itself (--layer direct), what the layer declares its launcher adds
    (RankWrapper.warm_env), None where it declares nothing (they start cold)."""
    if any(c.rank is not None for c in plan.stage.commands):
        return {}
    declared = getattr(plan, "launcher_rank_env", None)
    return None if declared is None else dict(declared)


def starter(plan: LaunchPlan) -> Any:
    """The command whose environment the ranks inherit: the first rank's own (--layer direct), else the
    launcher that runs the rank command (torchrun, horovodrun, deepspeed), else the first one."""
    commands = plan.stage.commands
    ranks = [c for c in commands if c.rank is not None]
    if ranks:
        return ranks[0]
    rc = tuple(plan.rank_command)
    runs = [c for c in commands if any(tuple(c.argv[i:i + len(rc)]) == rc for i in range(len(c.argv)))]
    return (runs or list(commands) or [None])[0]


def imports(plan: LaunchPlan) -> tuple[str, ...]:
    """What the template imports: torch and torch.distributed when the script mentions torch (or runs as
    -m MODULE), with what the layer's ranks import (horovod.torch), then --preload. A script that does not
    is forked from a template that imported nothing more: no interpreter start per rank, and no torch
    import it would not have made."""
    preload = tuple(m for m in str(plan.settings.get("preload") or "").split(",") if m)
    layer = tuple(getattr(plan, "layer_preload", ()) or ())
    return (*DEFAULT_IMPORTS, *layer, *preload) if mentions_torch(plan.user_command) else preload


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
