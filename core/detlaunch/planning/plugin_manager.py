"""Finding, loading and calling plugins.

Two entry-point groups: ``detlaunch.layers`` (one per layer; only the chosen
layer is imported) and ``detlaunch.plugins`` (always on: discovery providers,
observers). Built-in layers and providers register through the same entry points
as anyone else's. A plugin that fails to import is reported and skipped; the
chosen layer failing to import is an error. ``DETLAUNCH_DISABLE_PLUGINS``
(comma-separated names) keeps plugins and layers from being imported at all.

Core calls hooks only through :class:`Hooks`, never through ``pm.hook``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pluggy
import stevedore

from detlaunch.errors import ClusterError, DetlaunchError, LaunchError, LayerNotFoundError, PluginLoadError
from detlaunch.observe.events import Event
from detlaunch.outcome import JobResult
from detlaunch.planning import hookspecs
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.config import Config
from detlaunch.planning.doctor import Check
from detlaunch.planning.preflight import PreflightCheck
from detlaunch.planning.spawn import Spawner
from detlaunch.planning.stage import RankWrapper, Stage, StageContext

LAYERS = "detlaunch.layers"
PLUGINS = "detlaunch.plugins"
BUILTIN_DIST = "detlaunch"


@dataclasses.dataclass(frozen=True)
class PluginEntry:
    """One installed entry point, and what happened when (or if) it was loaded."""

    group: str
    name: str
    target: str
    dist: str  # "" until asked for (PluginSet.owned)
    version: str
    status: str = "not loaded"  # "loaded", "not loaded", "disabled", "failed", "shadowed"
    error: str = ""


def disabled_names(env: Mapping[str, str]) -> set[str]:
    return {n.strip() for n in env.get("DETLAUNCH_DISABLE_PLUGINS", "").split(",") if n.strip()}


Owners = dict[tuple[str, str, str], tuple[str, str]]  # (group, name, target) -> (distribution, version)


def _owners() -> Owners:
    """Who publishes each entry point of detlaunch's groups: one scan of the installed distributions for
    both groups, and each publishing distribution's metadata parsed once (``dist.name`` and
    ``dist.version`` parse it again on every call: that cost more than the scan)."""
    found: Owners = {}
    parsed: dict[int, tuple[str, str]] = {}
    installed = importlib.metadata.entry_points()
    for group in (LAYERS, PLUGINS):
        for ep in installed.select(group=group):
            dist = ep.dist
            if dist is not None and id(dist) not in parsed:
                meta = dist.metadata
                parsed[id(dist)] = (meta["Name"], meta["Version"])
            found[(group, ep.name, ep.value)] = parsed[id(dist)] if dist is not None else ("?", "?")
    return found


def _entries(group: str, owners: Callable[[], Owners]) -> list[PluginEntry]:
    manager: stevedore.NamedExtensionManager[Any] = stevedore.NamedExtensionManager(group, names=[])  # lists only
    listed = manager.list_entry_points()
    # Who publishes an entry point is asked of every installed distribution (a scan that cost a start
    # ~15 ms): here only when a name is published twice, since the built-in one must win. Otherwise
    # PluginSet.owned reads it when a listing or an error message names it.
    twice = len({ep.name for ep in listed}) < len(listed)
    found = owners() if twice else {}
    entries = [PluginEntry(group, ep.name, ep.value, *found.get((group, ep.name, ep.value), ("", "")))
               for ep in listed]
    # A name published twice: the built-in one wins, the other is shadowed (entry points add,
    # they never replace a built-in).
    entries.sort(key=lambda e: (e.name, e.dist != BUILTIN_DIST))
    result, seen = [], set()
    for e in entries:
        result.append(dataclasses.replace(e, status="shadowed") if e.name in seen else e)
        seen.add(e.name)
    return result


class _OneEntryPoint(stevedore.NamedExtensionManager):  # type: ignore[type-arg]
    """Loads the one entry point `target` of a name: another distribution's entry point of the same
    name (shadowed, or a layer not chosen) is never imported."""

    def __init__(self, group: str, target: str, **kwargs: Any):
        self._target = target  # before super().__init__, which lists and loads
        super().__init__(group, **kwargs)

    def list_entry_points(self) -> list[importlib.metadata.EntryPoint]:
        return [ep for ep in super().list_entry_points() if ep.value == self._target]


def _error_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def _unknown_hooks(pm: pluggy.PluginManager, plugin: object) -> list[str]:
    """The hooks `plugin` implements that no hook spec declares (optionalhook ones excepted)."""
    unknown = []
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.has_spec():
            continue
        impls = [i for i in caller.get_hookimpls() if i.plugin is plugin]
        if any(not i.optionalhook for i in impls):
            unknown.append(caller.name)
    return sorted(unknown)


class PluginSet:
    """The loaded plugins of one detlaunch run, and the record of what loaded."""

    def __init__(self, env: Mapping[str, str]):
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.entries: list[PluginEntry] = []
        self.disabled = disabled_names(env)
        self.layer_module: Any = None
        self.tracebacks: dict[str, str] = {}
        self._listed: dict[str, list[PluginEntry]] = {}
        self._owners: Owners | None = None  # finding them scans every distribution: once a run

    def listed(self, group: str) -> list[PluginEntry]:
        """The entry points of `group`, listed once per run."""
        if group not in self._listed:
            self._listed[group] = _entries(group, self._owners_once)
        return self._listed[group]

    def _owners_once(self) -> Owners:
        if self._owners is None:
            self._owners = _owners()
        return self._owners

    def owned(self, entry: PluginEntry) -> PluginEntry:
        """`entry` with the distribution that publishes it, and its version."""
        if entry.dist:
            return entry
        dist, version = self._owners_once().get((entry.group, entry.name, entry.target), ("?", "?"))
        return dataclasses.replace(entry, dist=dist, version=version)

    def layer_names(self) -> list[str]:
        return [e.name for e in self.listed(LAYERS) if e.status != "shadowed"]

    def _load(self, entry: PluginEntry) -> tuple[PluginEntry, Any]:
        if entry.status == "shadowed":
            return entry, None
        if entry.name in self.disabled:
            return dataclasses.replace(entry, status="disabled"), None
        failures: list[BaseException] = []

        def on_failure(_manager: Any, _ep: Any, exc: BaseException) -> None:
            failures.append(exc)

        manager = _OneEntryPoint(
            entry.group, entry.target, names=[entry.name], on_load_failure_callback=on_failure,
            on_missing_entrypoints_callback=lambda names: None,
        )
        ext = next((e for e in manager.extensions if e.entry_point.value == entry.target), None)
        if ext is None:
            error = _error_line(failures[0]) if failures else "the entry point did not load"
            self.tracebacks[entry.name] = "".join(traceback.format_exception(failures[0])) if failures else ""
            return dataclasses.replace(entry, status="failed", error=error), None
        module = ext.plugin
        try:
            self.pm.register(module, name=f"{entry.group}:{entry.name}")
        except (ValueError, pluggy.PluginValidationError) as e:
            return dataclasses.replace(entry, status="failed", error=_error_line(e)), None
        unknown = _unknown_hooks(self.pm, module)
        if unknown:  # a typo in one plugin must not stop every other plugin (check_pending would)
            self.pm.unregister(module)
            return dataclasses.replace(entry, status="failed", error=(
                f"unknown hook(s) {', '.join(unknown)}: not in detlaunch's hook specs "
                "(see docs/HOOKS.md)")), None
        return dataclasses.replace(entry, status="loaded"), module

    def load_plugins(self) -> None:
        for entry in self.listed(PLUGINS):
            loaded, _ = self._load(entry)
            self.entries.append(loaded)

    def load_layer(self, name: str) -> None:
        candidates = [e for e in self.listed(LAYERS) if e.name == name and e.status != "shadowed"]
        if not candidates:
            raise LayerNotFoundError(
                f"unknown layer {name!r}; installed layers: {', '.join(self.layer_names()) or 'none'}"
            )
        if name in self.disabled:
            self.entries.append(dataclasses.replace(candidates[0], status="disabled"))
            raise PluginLoadError(f"layer {name!r} is disabled by DETLAUNCH_DISABLE_PLUGINS")
        loaded, module = self._load(candidates[0])
        self.entries.append(loaded)
        if module is None:
            loaded = self.owned(loaded)
            raise PluginLoadError(
                f"layer {name!r} ({loaded.target}, from {loaded.dist} {loaded.version}) failed to "
                f"load: {loaded.error}"
            )
        self.layer_module = module

    def check_hooks(self) -> None:
        """Fail on a hook implementation that matches no hook spec (a typo in a plugin)."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as e:
            raise PluginLoadError(f"plugin error: {e}") from None

    def list_entries(self, groups: Sequence[str] = (LAYERS, PLUGINS)) -> list[PluginEntry]:
        """Every installed entry point of `groups`, with what happened when it was loaded here."""
        loaded = {(e.group, e.name, e.target): e for e in self.entries}
        out = []
        for group in groups:
            for e in self.listed(group):
                out.append(self.owned(loaded.get((e.group, e.name, e.target), e)))
        return out

    @property
    def hooks(self) -> Hooks:
        return Hooks(self.pm)


class Hooks:
    """The typed facade core uses to call hooks; the only code that touches ``pm.hook``."""

    def __init__(self, pm: pluggy.PluginManager):
        self._hook = pm.hook

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        self._hook.detlaunch_add_options.call_historic(kwargs={"parser": parser})

    def discover_cluster(self, config: Config) -> ClusterInfo:
        info: ClusterInfo | None = self._hook.detlaunch_discover_cluster(config=config)
        if info is None:
            wanted = config.options.get("cluster")
            if wanted:
                raise ClusterError(f"cluster provider {wanted!r} found nothing here, or is not "
                                   "installed (see detlaunch plugins)")
            raise ClusterError("no cluster provider answered (is the 'local' plugin disabled?)")
        return info

    def rank_wrappers(self, ctx: StageContext) -> list[RankWrapper]:
        return [w for w in self._hook.detlaunch_rank_wrappers(ctx=ctx) if w is not None]

    def environment(self, ctx: StageContext) -> dict[str, str]:
        merged: dict[str, str] = {}
        for result in self._hook.detlaunch_environment(ctx=ctx):
            for key, value in (result or {}).items():
                merged.setdefault(str(key), str(value))
        return merged

    def chief_stage(self, ctx: StageContext) -> Stage | None:
        stage: Stage | None = self._hook.detlaunch_chief_stage(ctx=ctx)
        return stage

    def worker_stage(self, ctx: StageContext) -> Stage | None:
        stage: Stage | None = self._hook.detlaunch_worker_stage(ctx=ctx)
        return stage

    def _per_plugin(self, hook: Any, config: Config) -> Iterator[tuple[str, list[Any] | Exception]]:
        """Call `hook` (it takes the config alone) plugin by plugin: each one's name and its list, or what it raised
        (one plugin's error must not hide the others' checks)."""
        for impl in reversed(hook.get_hookimpls()):
            name = impl.plugin_name.rpartition(":")[2]
            try:
                yield name, list(impl.function(**{arg: config for arg in impl.argnames}) or [])  # its only parameter
            except Exception as e:
                yield name, e

    def doctor_checks(self, config: Config) -> list[Check]:
        """Every plugin's checks; one that raises is a failed check naming it (the others still run)."""
        checks: list[Check] = []
        for name, result in self._per_plugin(self._hook.detlaunch_doctor_checks, config):
            if isinstance(result, Exception):
                checks.append(Check(f"{name}: its checks", False, f"raised {_error_line(result)}",
                                    f"report this to the {name} plugin's authors"))
            else:
                checks.extend(result)
        return checks

    def preflight_checks(self, config: Config) -> tuple[list[PreflightCheck], list[str]]:
        """Every plugin's preflight checks, and one error line for each plugin whose hook raised."""
        checks: list[PreflightCheck] = []
        errors: list[str] = []
        for name, result in self._per_plugin(self._hook.detlaunch_preflight_checks, config):
            if isinstance(result, Exception):
                errors.append(f"{name}: its preflight checks raised {_error_line(result)}")
            else:
                checks.extend(result)
        return checks, errors

    def job_started(self, ctx: StageContext, stage: Stage) -> None:
        """Call every job_started hook; the first failure stops the launch as one DetlaunchError line."""
        for impl in reversed(self._hook.detlaunch_job_started.get_hookimpls()):
            kwargs = {"ctx": ctx, "stage": stage}
            name = impl.plugin_name.rpartition(":")[2]
            try:
                impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
            except DetlaunchError as e:
                raise type(e)(f"{name}: {e}") from e
            except Exception as e:
                raise LaunchError(f"{name}: job_started failed: {_error_line(e)}") from e

    def job_finished(self, ctx: StageContext, result: JobResult) -> list[str]:
        """Call every observer; return the errors they raised (they never change the exit code)."""
        errors = []
        for impl in reversed(self._hook.detlaunch_job_finished.get_hookimpls()):
            kwargs = {"ctx": ctx, "result": result}
            try:
                impl.function(**{name: kwargs[name] for name in impl.argnames})
            except Exception as e:  # an observer's failure is reported, not fatal
                errors.append(f"{impl.plugin_name}: {_error_line(e)}")
        return errors

    def event(self, event: Event) -> list[tuple[str, str]]:
        """Give `event` to every detlaunch_event plugin; the (plugin, error) of those that raised."""
        errors = []
        for impl in reversed(self._hook.detlaunch_event.get_hookimpls()):
            try:
                impl.function(**{name: event for name in impl.argnames if name == "event"})
            except Exception as e:  # an observer's failure is reported, never fatal
                errors.append((impl.plugin_name.rpartition(":")[2], _error_line(e)))
        return errors

    def spawners(self, config: Config) -> dict[str, Spawner]:
        """Every plugin's spawners, by name; the first plugin loaded to name one wins (a built-in's name stays
        the built-in's)."""
        found: dict[str, Spawner] = {}
        for result in reversed(self._hook.detlaunch_spawners(config=config)):  # pluggy calls the last loaded first
            for name, spawner in (result or {}).items():
                found.setdefault(str(name), spawner)
        return found
