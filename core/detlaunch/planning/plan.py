"""From parsed options to this node's LaunchPlan: pure data, rendered by --dry-run.

Building a plan calls the layer's hooks and never starts a process or touches
the filesystem: the run directory's name is chosen here (random, so it cannot be
predicted) and created by the supervisor when the job starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from detlaunch.errors import PluginLoadError
from detlaunch.observe.events import node_events_path
from detlaunch.options import Option
from detlaunch.outcome import signal_name
from detlaunch.planning import warm_ranks
from detlaunch.planning.addresses import socket_ifname_env
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.config import Config, supervision_options
from detlaunch.planning.plugin_manager import Hooks
from detlaunch.planning.rank_defaults import rank_defaults
from detlaunch.planning.stage import SOCKET_NAME, SSHD_SUPERVISOR_ENV, Command, RankWrapper, Stage, StageContext
from detlaunch.restarts.options import OPTION_ENV, policy_from_options
from detlaunch.restarts.policy import RestartPolicy
from detlaunch.system.jobdir import SECRET_ENV
from detlaunch.system.safefs import random_hex

WRAPPER_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rank", "run_wrapper.py")
# The variable core sets for every process it starts.
SUPERVISOR_ENV = "DETLAUNCH_SUPERVISOR"
SUPERVISION_OPTIONS = supervision_options()


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything this node's supervisor needs to run its part of the job: its only input.

    What the stage hooks were given (cluster, run dir, shared dir, commands, environment) is
    stored once, in `context`, and read through the properties below.
    """

    layer: str
    role: str  # "chief" or "worker"
    stage: Stage
    env: Mapping[str, str]  # added for every process of the job on this node
    unset_env: tuple[str, ...]  # removed from every process of the job on this node
    wrapper_argv: tuple[str, ...]
    log_dir: str | None
    console_ranks: tuple[int, ...] | None  # the ranks whose output reaches the console (None: all)
    context: StageContext
    link_port: int = 0  # the chief's port for the job link
    restarts: RestartPolicy = RestartPolicy()  # job-wide restarts: the chief's policy (restarts/policy.py)
    events_path: str | None = None  # the event log (--events, else events.jsonl in --log-dir)
    not_progress: tuple[str, ...] = ()  # output the hang watch does not count (RankWrapper.not_progress)
    # The supervision options (declared with supervision=True, planning/config.py), read as plan.NAME:
    # plan.grace_period, plan.hang_timeout... A new one is carried here with no change to this class.
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Set in each rank's environment where it is unset there (rank_defaults.py): the wrappers set them.
    rank_defaults: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # What the layer's launcher adds to its ranks' environment, read at import (RankWrapper.warm_env; None:
    # not declared, its ranks start cold), and what they import besides torch (RankWrapper.preload).
    launcher_rank_env: Mapping[str, str] | None = None
    layer_preload: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["settings"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def cluster(self) -> ClusterInfo:
        return self.context.cluster

    @property
    def run_dir(self) -> str:
        return self.context.run_dir

    @property
    def shared_dir(self) -> str:
        return self.context.shared_dir

    @property
    def user_command(self) -> tuple[str, ...]:
        return self.context.user_command

    @property
    def rank_command(self) -> tuple[str, ...]:
        return self.context.rank_command

    @property
    def environ(self) -> Mapping[str, str]:
        """detlaunch's own environment (where the scheduler's variables, and a job secret, come from)."""
        return self.context.env

    def process_env(self) -> dict[str, str]:
        """The environment every process of the job on this node starts with."""
        env = {k: v for k, v in self.environ.items() if k not in self.unset_env}
        env.update(self.env)
        return env

    @property
    def socket_path(self) -> str:
        return os.path.join(self.run_dir, SOCKET_NAME)

    def standby_of(self, cmd: Command) -> str | None:
        """The standby the supervisor starts for `cmd` while the first attempt runs: none when no restart
        can follow it (the same rule as the supervisor's, RestartPolicy.restarts_after)."""
        return cmd.standby if self.restarts.restarts_after(1, self.cluster.num_nodes) > 0 else None

    @property
    def expected_ranks(self) -> int:
        s = self.stage.expected_ranks
        return self.cluster.local_slots if s is None else s

    def to_json(self) -> dict[str, Any]:
        c = self.cluster
        return {
            "layer": self.layer,
            "role": self.role,
            "cluster": {
                "node_addrs": list(c.node_addrs), "slots": list(c.slots), "node_rank": c.node_rank,
                "chief_addr": c.chief_addr, "job_id": c.job_id, "provider": c.provider,
                "sources": dict(c.sources),
            },
            "supervisor": {"socket": self.socket_path, **self.settings, "expected_ranks": self.expected_ranks,
                           "control": f"{c.chief_addr}:{self.link_port}" if c.num_nodes > 1 else None},
            "dirs": list(self.stage.dirs),
            "files": sorted([*self.stage.files, *self.stage.executables]),
            "setup": [list(s) for s in self.stage.setup],
            "wait_for_sshd": [f"{h}:{p}" for h, p in self.stage.wait_for_sshd],
            "prelaunch": [list(s) for s in self.stage.prelaunch],
            "commands": [
                {"name": cmd.name, "argv": list(cmd.argv), "daemon": cmd.daemon,
                 "stop_signal": int(cmd.stop_signal), "env": dict(cmd.env), "rank": cmd.rank,
                 "standby": self.standby_of(cmd), "notes": list(cmd.notes)}
                for cmd in self.stage.commands
            ],
            "rank_wrapper": list(self.wrapper_argv),
            "not_progress": list(self.not_progress),
            "command": list(self.user_command),
            "env": dict(self.env),
            "unset_env": list(self.unset_env),
            "rank_defaults": dict(self.rank_defaults),
            "restarts": self.restarts.to_json(),
            "warm_ranks": self.warm_ranks_json(),
        }

    def warm_ranks_json(self) -> dict[str, Any]:
        why = warm_ranks.why_cold(self)
        return {"on": not why, "why_not": why or None, "imports": list(warm_ranks.imports(self))}


def wrapper_argv(config: Config, job_id: str, rank_env: tuple[str, ...]) -> tuple[str, ...]:
    argv = [sys.executable, "-S", WRAPPER_PATH, "--job", job_id,
            "--grace", f"{config.options['grace_period']:g}"]
    if rank_env:
        argv += ["--rank-env", ",".join(rank_env)]
    if config.options.get("ranks"):
        argv += ["--console-ranks", ",".join(map(str, config.options["ranks"]))]
    if config.options.get("log_dir"):
        argv += ["--log-dir", os.path.abspath(config.options["log_dir"])]
    return tuple(argv) + ("--",)


def private_run_dir() -> str:
    """A random, unpredictable path in the temp dir (created 0700 by the supervisor).

    A Unix socket path must fit in 108 bytes: under a deep TMPDIR, fall back to /tmp.
    """
    name = f"detlaunch-{random_hex(8)}"
    base = tempfile.gettempdir()
    if len(os.path.join(base, name, SOCKET_NAME)) > 100:
        base = "/tmp"
    return os.path.join(base, name)


def default_shared_dir(job_id: str, env: Mapping[str, str]) -> str:
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "detlaunch", "jobs", job_id)


def build_plan(hooks: Hooks, config: Config, cluster: ClusterInfo, run_dir: str | None = None) -> LaunchPlan:
    """This node's plan; `run_dir`: the one a running supervisor has (planning again for moved nodes)."""
    run_dir = run_dir or private_run_dir()
    shared = config.options.get("job_dir") or default_shared_dir(cluster.job_id, config.env)
    ctx = StageContext(config=config, cluster=cluster, run_dir=run_dir,
                       shared_dir=os.path.abspath(shared), user_command=config.command,
                       env=config.env)

    pieces = hooks.rank_wrappers(ctx)
    rank_env = next((p.rank_env for p in pieces if p.rank_env), ())
    wrapper = wrapper_argv(config, cluster.job_id, rank_env)
    extra = tuple(arg for p in pieces for arg in p.argv)
    ctx = ctx.replace(rank_command=wrapper + extra + config.command)

    env = hooks.environment(ctx)
    env["DET_CHIEF_IP"] = cluster.chief_addr
    for key, value in socket_ifname_env(cluster).items():  # unless the user or the layer chose one
        if key not in config.env:
            env.setdefault(key, value)
    env[SUPERVISOR_ENV] = os.path.join(run_dir, SOCKET_NAME)
    if "PYTHONUNBUFFERED" not in config.env:
        env["PYTHONUNBUFFERED"] = "1"  # the last line before a crash must reach the logs

    role = "chief" if cluster.is_chief else "worker"
    stage = hooks.chief_stage(ctx) if cluster.is_chief else hooks.worker_stage(ctx)
    if stage is None:
        raise PluginLoadError(f"layer {config.layer!r} has no {role} stage "
                              f"(it implements no detlaunch_{role}_stage hook)")
    if not isinstance(stage, Stage):
        raise PluginLoadError(f"layer {config.layer!r}: detlaunch_{role}_stage returned "
                              f"{type(stage).__name__}, not a detlaunch.Stage")
    return LaunchPlan(
        layer=config.layer, role=role, stage=stage, env=env,
        unset_env=(SSHD_SUPERVISOR_ENV, SECRET_ENV, *OPTION_ENV, *stage.unset_env), wrapper_argv=wrapper,
        log_dir=config.options.get("log_dir"), console_ranks=config.options.get("ranks") or None, context=ctx,
        link_port=config.options.get("link_port") or config.options["master_port"] + 1,
        restarts=policy_from_options(config.options),
        events_path=node_events_path(config.options.get("events"), config.options.get("log_dir"), cluster.node_rank),
        settings={**supervision_settings(config.options), "min_nodes": config.options.get("min_nodes")},
        rank_defaults=rank_defaults(config.env),
        not_progress=tuple(dict.fromkeys(str(text) for p in pieces for text in p.not_progress if text)),
        launcher_rank_env=launcher_rank_env(pieces),
        layer_preload=tuple(dict.fromkeys(m for p in pieces for m in p.preload if m)),
    )


def launcher_rank_env(pieces: Sequence[RankWrapper]) -> dict[str, str] | None:
    """What the layer's launcher adds to its ranks' environment (RankWrapper.warm_env): None where no piece says."""
    declared = [p.warm_env for p in pieces if p.warm_env is not None]
    return {str(k): str(v) for env in declared for k, v in env.items()} if declared else None


def supervision_settings(options: Mapping[str, Any],
                         declared: Sequence[Option] = SUPERVISION_OPTIONS) -> dict[str, Any]:
    """The supervision options' values (the declared default where an option was not parsed)."""
    values = {}
    for option in declared:
        value = options.get(option.dest)
        values[option.dest] = option.value_default if value is None else value
    return values


# -- rendering -------------------------------------------------------------------------------


LONG_WORD = 160  # a launcher's word longer than this (an encoded command) is shortened in the text; JSON has it


def _quote(argv: tuple[str, ...] | list[str], shorten: bool = False) -> str:
    return " ".join(shlex.quote(a) if not shorten or len(a) <= LONG_WORD else
                    f"{shlex.quote(a[:48])}...({len(a)} characters)" for a in argv)


def _split_rank_command(cmd: Command, plan: LaunchPlan) -> tuple[tuple[str, ...], bool]:
    """The launcher's own argv, and whether the rank command follows it."""
    argv, rc = cmd.argv, plan.rank_command
    for i in range(len(argv) - len(rc) + 1):
        if argv[i : i + len(rc)] == rc:
            return argv[:i], True
    return argv, False


def render_text(plan: LaunchPlan) -> str:
    c = plan.cluster
    slots_from = f" [{c.sources['slots']}]" if c.sources.get("slots") else ""
    lines = [
        f"node {c.node_rank} of {c.num_nodes} ({plan.role}) · layer {plan.layer} · job {c.job_id} · "
        f"{c.local_slots} rank(s) here{slots_from}, {c.total_slots} in all · chief {c.chief_addr} "
        f"(discovered by {c.provider})",
        f"detlaunch supervisor  [socket {plan.socket_path}; "
        + "".join(f"{o.shown.format(plan.settings[o.dest])}; " for o in SUPERVISION_OPTIONS if o.shown)
        + f"expects {plan.expected_ranks} rank(s)]",
    ]
    if c.num_nodes > 1:
        verb = "listens for the other nodes on" if c.is_chief else "joins the chief at"
        lines.append(f"├── {verb} {c.chief_addr}:{plan.link_port} "
                     f"(job secret, heartbeat {plan.heartbeat:g} s)")
    if plan.spares and c.is_chief:
        last = c.num_nodes + plan.spares - 1
        ranks = f"node rank {last}" if plan.spares == 1 else f"node ranks {c.num_nodes}..{last}"
        lines.append(f"├── admits {plan.spares} spare node(s) ({ranks}), each to take a lost node's place")
    if plan.settings.get("min_nodes") and c.is_chief:
        lines.append(f"├── may shrink: with no spare for a lost node's place, the next attempt runs on the nodes "
                     f"left, down to {plan.min_nodes} (--nnodes {plan.min_nodes}:{c.num_nodes}; ranks renumbered)")
    for path in plan.stage.dirs:
        lines.append(f"├── makes a fresh private folder {path}")
    for path in sorted([*plan.stage.files, *plan.stage.executables]):
        lines.append(f"├── writes {path}")
    for argv in plan.stage.setup:
        lines.append(f"├── runs first: {_quote(argv)}")
    for host, port in plan.stage.wait_for_sshd:
        lines.append(f"├── waits for the sshd greeting of {host}:{port}")
    for argv in plan.stage.prelaunch:
        lines.append(f"├── then runs: {_quote(argv)}")
    launched = [cmd for cmd in plan.stage.commands if cmd.rank is None]
    rank_commands = [cmd for cmd in plan.stage.commands if cmd.rank is not None]
    for n, cmd in enumerate(launched):
        last = n == len(launched) - 1 and not rank_commands
        branch, pad = ("└── ", "    ") if last else ("├── ", "│   ")
        own, runs_ranks = _split_rank_command(cmd, plan)
        ahead = plan.standby_of(cmd)
        standby = f"next attempt's started ahead: {ahead}" if ahead else ""
        tags = [t for t in ("daemon" if cmd.daemon else "", f"stop with {signal_name(cmd.stop_signal)}", standby) if t]
        lines.append(f"{branch}{_quote(own, shorten=True)}  [{', '.join(tags)}]")
        for key, value in sorted(cmd.env.items()):
            lines.append(f"{pad}    env {key}={_short(value)}")
        lines.extend(f"{pad}    {note}" for note in cmd.notes)
        if runs_ranks:
            extra = plan.rank_command[len(plan.wrapper_argv) : len(plan.rank_command) - len(plan.user_command)]
            lines.append(f"{pad}└── {_quote(plan.wrapper_argv)}  [one per rank]")
            inner = pad + "    "
            if extra:
                lines.append(f"{inner}└── {_quote(extra)}")
                inner += "    "
            lines.append(f"{inner}└── {_quote(plan.user_command)}")
    if rank_commands:
        lines.extend(_render_rank_commands(plan, rank_commands))
    lines.append(warm_ranks.describe(plan))
    lines.extend(plan.restarts.describe())
    if plan.restarts.enabled:
        lines.append(f"  between attempts: at most {plan.release_timeout:g} s for every thread of the last "
                     "attempt's processes to end and, where nvidia-smi is found, their GPU memory to be freed "
                     "(--release-timeout)")
    if plan.not_progress:
        lines.append("output that is not progress (hang watch): " + "; ".join(map(repr, plan.not_progress)))
    lines.append("environment added for every process:")
    lines.extend(f"  {k}={_short(v)}" for k, v in sorted(plan.env.items()))
    if plan.unset_env:
        lines.append("environment removed: " + ", ".join(plan.unset_env))
    if plan.rank_defaults:
        lines.append("every rank gets, unless its environment has it:")
        lines.extend(f"  {k}={_short(v)}" for k, v in sorted(plan.rank_defaults.items()))
    return "\n".join(lines)


def _render_rank_commands(plan: LaunchPlan, commands: list[Command]) -> list[str]:
    """Ranks the supervisor starts itself: the variables they share once, then each rank's own."""
    shared = dict(commands[0].env)
    for cmd in commands[1:]:
        shared = {k: v for k, v in shared.items() if cmd.env.get(k) == v}
    tags = f"stop with {signal_name(commands[0].stop_signal)}"
    lines = [f"└── {len(commands)} rank(s) started by the supervisor itself, no launcher  [{tags}]"]
    lines.extend(f"    │   env {key}={_short(value)}" for key, value in sorted(shared.items()))
    for cmd in commands:
        own = " ".join(f"{k}={_short(v)}" for k, v in sorted(cmd.env.items()) if k not in shared)
        lines.append(f"    ├── rank {cmd.rank}: {own}" if own else f"    ├── rank {cmd.rank}")
    lines.append(f"    └── {_quote(plan.wrapper_argv)}  [one per rank]")
    extra = plan.rank_command[len(plan.wrapper_argv) : len(plan.rank_command) - len(plan.user_command)]
    inner = "        "
    if extra:
        lines.append(f"{inner}└── {_quote(extra)}")
        inner += "    "
    lines.append(f"{inner}└── {_quote(plan.user_command)}")
    return lines


def _short(value: str, limit: int = 120) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."


def render_json(plan: LaunchPlan) -> str:
    return json.dumps(plan.to_json(), indent=2, sort_keys=True)
