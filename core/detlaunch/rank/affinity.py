"""The CPUs a rank runs on, when its layer bound it (``--numa-binding``: planning/cpu_binding.py).

Part of the per-rank wrapper (stdlib only). The wrapper binds itself before it starts the rank, so
the rank and every thread and process it starts inherit the binding from their first instruction,
as torch's own binding does (sched_setaffinity before exec). The variable is taken out of the
environment: the rank's children are bound already and must not bind again.
"""

from __future__ import annotations

import os

ENV = "DETLAUNCH_CPUS"


def parse_cpu_list(text: str) -> set[int]:
    """``"0-2,5"`` -> ``{0, 1, 2, 5}`` (sysfs's and taskset's CPU lists); ValueError if malformed."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def bind_from_environment(environ: dict[str, str]) -> str | None:
    """Bind this process to the CPUs named in `environ` (and drop the variable); a warning line or None."""
    text = environ.pop(ENV, None)
    if not text:
        return None
    try:
        os.sched_setaffinity(0, parse_cpu_list(text))
    except (OSError, ValueError) as e:
        return f"detlaunch rank wrapper: warning: not bound to CPUs {text}: {e}\n"
    return None
