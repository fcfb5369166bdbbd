"""What a layer declares it can do, for the layer contract suite (:mod:`detlaunch.testing.contract`).

What a layer cannot do is declared, never skipped silently. Each capability has a
documented default; a layer module may declare its own in a ``DETLAUNCH_CONTRACT``
dict (so the three lines are enough), and a test class attribute of the same name wins
over both. A check that a declaration rules out is reported as skipped, with a reason
that starts with "declared by the layer" (and listed at the end of the pytest run).

===================  =========================  ==================================================
capability           default                    meaning
===================  =========================  ==================================================
``multi_node``       ``True``                   the layer plans jobs of several nodes. When False,
                                                planning a 2-node job must fail with a detlaunch
                                                error (one line), and the 2-node checks are skipped.
``runs_here``        ``True``                   a real 2-rank job can run on this machine (CPU
                                                only, no scheduler). When False, the real-job
                                                checks are skipped.
``needs``            ``()``                     programs the real jobs need on PATH (``mpirun``);
                                                when one is missing the real-job checks are skipped,
                                                saying which.
``heavy_modules``    ``DEFAULT_HEAVY_MODULES``  modules that loading the layer must not import.
``run_args``         ``()``                     extra detlaunch options for every run and plan.
``run_timeout``      ``100``                    seconds a real job may take (every check also has its
                                                own timeouts: none can hang).
``rank_commands``    ``False``                  the layer runs no launcher: each node's stage starts
                                                its ranks itself, one ``Command(rank=N)`` per local
                                                rank (``--layer direct``). When True, the stages must
                                                be made so, and a real job of two nodes on loopback
                                                runs (no ssh is needed); when False, a stage must
                                                have no rank command.
===================  =========================  ==================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

DEFAULT_HEAVY_MODULES: tuple[str, ...] = ("torch", "tensorflow", "jax", "horovod", "deepspeed", "mpi4py", "numpy")
CONTRACT_ATTR = "DETLAUNCH_CONTRACT"
DECLARED = "declared by the layer"


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a layer declares it can do (see the module docstring for each field)."""

    multi_node: bool = True
    runs_here: bool = True
    needs: tuple[str, ...] = ()
    heavy_modules: tuple[str, ...] = DEFAULT_HEAVY_MODULES
    run_args: tuple[str, ...] = ()
    run_timeout: float = 100.0
    rank_commands: bool = False
    # where each non-default value came from, for the skip reasons
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)

    def declared(self, name: str) -> str:
        """`declared by the layer: NAME = VALUE (in WHERE)`."""
        where = self.sources.get(name, "the documented default")
        return f"{DECLARED}: {name} = {getattr(self, name)!r} (in {where})"


CAPABILITY_NAMES = tuple(f.name for f in dataclasses.fields(Capabilities) if f.name != "sources")


def resolve_capabilities(module: Any, overrides: Mapping[str, Any]) -> Capabilities:
    """Defaults, then the layer module's DETLAUNCH_CONTRACT, then the test class's attributes."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    declared = getattr(module, CONTRACT_ATTR, None) or {}
    if not isinstance(declared, Mapping):
        raise TypeError(f"{module.__name__}.{CONTRACT_ATTR} must be a dict, not {type(declared).__name__}")
    for where, given in ((f"{module.__name__}.{CONTRACT_ATTR}", declared), ("the test class", overrides)):
        unknown = sorted(set(given) - set(CAPABILITY_NAMES))
        if unknown:
            raise TypeError(f"{where}: unknown capability {', '.join(unknown)} "
                            f"(known: {', '.join(CAPABILITY_NAMES)})")
        for name, value in given.items():
            if value is not None:
                values[name], sources[name] = value, where
    for name in ("needs", "heavy_modules", "run_args"):
        if name in values:
            if isinstance(values[name], str) or not all(isinstance(v, str) for v in values[name]):
                raise TypeError(f"{sources[name]}: {name} must be a sequence of strings")
            values[name] = tuple(values[name])
    for name in ("multi_node", "runs_here", "rank_commands"):
        if name in values and not isinstance(values[name], bool):
            raise TypeError(f"{sources[name]}: {name} must be True or False")
    return Capabilities(**values, sources=sources)
