"""How detlaunch writes a set of ranks (or nodes) for people: ``0-3,5,7-8``, in one form everywhere.

The console's folded lines (``[ranks=0-1] loading``: dedupe.py), the stack groups of hang reports
and `detlaunch stacks` (stacks/groups.py) use it. Every run of two or more consecutive numbers is
a range, as Slurm's host lists write them (``node[1-2]``).
"""

from __future__ import annotations

from collections.abc import Iterable


def format_ranks(ranks: Iterable[int]) -> str:
    """``0-3,5,7-8``: sorted, without repeats, consecutive numbers as ranges; "" for none."""
    out: list[str] = []
    start = prev = None
    for r in sorted(set(ranks)):
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(out)
