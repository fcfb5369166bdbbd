"""The layer under test, loaded in this process through detlaunch's real loader, and planned from there.

The contract suite plans in-process (milliseconds), from the options a command line gives
(:mod:`detlaunch.planning.command_line`), so that its planning checks stay in the fast loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psutil

from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.command_line import CommandLine
from detlaunch.planning.config import Config
from detlaunch.planning.plan import LaunchPlan, build_plan, render_json
from detlaunch.planning.plugin_manager import LAYERS, PluginEntry, PluginSet


def clean_env(base: Mapping[str, str]) -> dict[str, str]:
    """`base` without detlaunch's own variables: a plan must not depend on an outer job."""
    return {k: v for k, v in base.items() if not k.startswith("DETLAUNCH_") and k != "DET_CHIEF_IP"}


@dataclasses.dataclass
class LoadedLayer:
    """The layer, loaded through the real loader, with the parser and options it adds."""

    name: str
    plugins: PluginSet
    entry: PluginEntry

    @classmethod
    def load(cls, name: str, env: Mapping[str, str]) -> LoadedLayer:
        plugins = PluginSet(env)
        plugins.load_layer(name)  # raises a DetlaunchError (one line) when it does not load
        plugins.check_hooks()
        entry = next(e for e in plugins.entries if e.group == LAYERS and e.name == name)
        return cls(name, plugins, plugins.owned(entry))  # with its distribution and version

    @property
    def module(self) -> Any:
        return self.plugins.layer_module

    def config(self, args: Sequence[str], env: Mapping[str, str]) -> Config:
        """Options exactly as the command line ``detlaunch --layer NAME ARGS`` gives them (the core's and
        the layer's)."""
        line = CommandLine.read(["--layer", self.name, *args], env)
        return line.config(self.plugins.hooks, self.plugins.layer_names())

    def plan(self, config: Config, cluster: ClusterInfo) -> LaunchPlan:
        return build_plan(self.plugins.hooks, config, cluster)

    def own_results(self, hook: str, **kwargs: Any) -> list[Any]:
        """The layer's own, unmerged results of `hook` (the Hooks facade merges and converts them)."""
        results = []
        for caller in self.plugins.pm.get_hookcallers(self.module) or []:
            if caller.name == hook:
                for impl in caller.get_hookimpls():
                    if impl.plugin is self.module:
                        result = impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
                        if result is not None:
                            results.append(result)
        return results


def normalized(plan: LaunchPlan) -> str:
    """The plan as JSON, with its random run directory replaced: two plans of one input compare equal."""
    return render_json(plan).replace(plan.run_dir, "<RUN_DIR>")


@contextlib.contextmanager
def no_side_effects(paths: Sequence[str]) -> Iterator[list[str]]:
    """Collect what planning did that it must not: start a process, or create one of `paths`."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    problems: list[str] = []
    yield problems
    started = [p for p in me.children(recursive=True) if p.pid not in before]
    if started:
        problems.append("planning started process(es): " + ", ".join(
            f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in started if p.is_running()))
    problems.extend(f"planning created {path}" for path in paths if os.path.lexists(path))

