"""What is wrong with one node's plan: the contract suite's checks of a layer's hook results.

Each check returns a list of problems, one line each, so that a failing check says everything
wrong with the plan at once.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from detlaunch.planning.plan import LaunchPlan, render_text
from detlaunch.planning.stage import Command, RankWrapper, Stage

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def contains(haystack: Sequence[str], needle: Sequence[str]) -> bool:
    n = len(needle)
    return any(tuple(haystack[i : i + n]) == tuple(needle) for i in range(len(haystack) - n + 1))


def _check_env(where: str, env: Any, problems: list[str]) -> None:
    if not isinstance(env, Mapping):
        problems.append(f"{where} is a {type(env).__name__}, not a mapping of str to str")
        return
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            problems.append(f"{where}: {key!r} is not a valid environment variable name")
        if not isinstance(value, str):
            problems.append(f"{where}: {key}={value!r} is a {type(value).__name__}, not a str")
        elif "\0" in value:
            problems.append(f"{where}: {key} holds a NUL byte")


def _check_argv(where: str, argv: Any, problems: list[str]) -> None:
    if not isinstance(argv, tuple) or not argv:
        problems.append(f"{where}: argv must be a non-empty tuple, got {argv!r}")
        return
    bad = [a for a in argv if not isinstance(a, str)]
    if bad:
        problems.append(f"{where}: every argv item must be a str, got {bad[0]!r} ({type(bad[0]).__name__})")
    elif not argv[0]:
        problems.append(f"{where}: argv[0] is empty")


def plan_problems(plan: LaunchPlan, wrappers: Sequence[Any], layer_env: Any) -> list[str]:
    """Everything wrong with one node's plan and the hook results it was built from."""
    problems = [*wrapper_problems(wrappers), *layer_env_problems(plan, layer_env)]
    if not isinstance(plan.stage, Stage):
        problems.append(f"the {plan.role} stage is a {type(plan.stage).__name__}, not a detlaunch.Stage")
        return problems
    problems += command_problems(plan)
    problems += rank_command_problems(plan, wrappers)
    problems += stage_problems(plan.stage)
    problems += rank_command_run_problems(plan)
    if plan.env.get("DET_CHIEF_IP") != plan.cluster.chief_addr:
        problems.append(f"the plan's environment has DET_CHIEF_IP={plan.env.get('DET_CHIEF_IP')!r}, "
                        f"not the chief {plan.cluster.chief_addr!r}")
    try:
        json.dumps(plan.to_json())
        render_text(plan)
    except (TypeError, ValueError) as e:
        problems.append(f"the plan does not render: {type(e).__name__}: {e}")
    return problems


def wrapper_problems(wrappers: Sequence[Any]) -> list[str]:
    """detlaunch_rank_wrappers' results: RankWrappers of strings, one naming the rank's variable."""
    problems: list[str] = []
    for w in wrappers:
        if not isinstance(w, RankWrapper):
            problems.append(f"detlaunch_rank_wrappers returned a {type(w).__name__}, not a detlaunch.RankWrapper")
            continue
        for name in w.rank_env:
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                problems.append(f"RankWrapper.rank_env: {name!r} is not an environment variable name")
        if not all(isinstance(a, str) for a in w.argv):
            problems.append(f"RankWrapper.argv must hold str only: {w.argv!r}")
        if not all(isinstance(t, str) and t.strip() and "\n" not in t for t in w.not_progress):
            problems.append(f"RankWrapper.not_progress must hold text of one line each: {w.not_progress!r}")
    if not any(isinstance(w, RankWrapper) and w.rank_env for w in wrappers):
        problems.append("detlaunch_rank_wrappers: the layer names no rank variable (RankWrapper(rank_env=...)); "
                        "the wrapper would guess, and could read an outer job's RANK")
    return problems


def layer_env_problems(plan: LaunchPlan, layer_env: Any) -> list[str]:
    """The layer's own detlaunch_environment result (None: it has none): str to str, DET_CHIEF_IP untouched."""
    problems: list[str] = []
    if layer_env is not None:
        _check_env("detlaunch_environment's result", layer_env, problems)
        if isinstance(layer_env, Mapping) and layer_env.get("DET_CHIEF_IP", plan.cluster.chief_addr) != \
                plan.cluster.chief_addr:
            problems.append(f"detlaunch_environment sets DET_CHIEF_IP={layer_env['DET_CHIEF_IP']!r}, "
                            f"not the chief {plan.cluster.chief_addr!r}")
    return problems


def command_problems(plan: LaunchPlan) -> list[str]:
    """Each Command of the stage: argv and env of strings, a real stop signal, DET_CHIEF_IP untouched."""
    problems: list[str] = []
    for i, cmd in enumerate(plan.stage.commands):
        where = f"command {i} ({getattr(cmd, 'name', '?')})"
        if not isinstance(cmd, Command):
            problems.append(f"{where} is a {type(cmd).__name__}, not a detlaunch.Command")
            continue
        _check_argv(where, cmd.argv, problems)
        _check_env(f"{where} env", cmd.env, problems)
        try:
            signal.Signals(cmd.stop_signal)
        except ValueError:
            problems.append(f"{where}: stop_signal {cmd.stop_signal!r} is not a signal")
        if not isinstance(cmd.daemon, bool):
            problems.append(f"{where}: daemon must be True or False")
        if isinstance(cmd.env, Mapping) and cmd.env.get("DET_CHIEF_IP", plan.cluster.chief_addr) != \
                plan.cluster.chief_addr:
            problems.append(f"{where} overrides DET_CHIEF_IP with {cmd.env['DET_CHIEF_IP']!r}")
    return problems


def stage_problems(stage: Stage) -> list[str]:
    """The stage's other fields: files, setup steps, sshd waits, dirs, expected ranks, unset variables."""
    problems: list[str] = []
    for kind, files in (("files", stage.files), ("executables", stage.executables)):
        for path, content in files.items():
            if not isinstance(path, str) or not path:
                problems.append(f"Stage.{kind}: bad path {path!r}")
            if not isinstance(content, str):
                problems.append(f"Stage.{kind}[{path!r}] is a {type(content).__name__}, not a str")
    for kind, steps in (("setup", stage.setup), ("prelaunch", stage.prelaunch)):
        for i, argv in enumerate(steps):
            _check_argv(f"Stage.{kind}[{i}]", argv, problems)
    for entry in stage.wait_for_sshd:
        if len(entry) != 2 or not isinstance(entry[0], str) or not isinstance(entry[1], int):
            problems.append(f"Stage.wait_for_sshd: {entry!r} is not (host, port)")
    if not all(isinstance(d, str) and d for d in stage.dirs):
        problems.append(f"Stage.dirs must be paths: {stage.dirs!r}")
    if stage.expected_ranks is not None and (not isinstance(stage.expected_ranks, int) or stage.expected_ranks < 0):
        problems.append(f"Stage.expected_ranks must be None or a count, got {stage.expected_ranks!r}")
    if "DET_CHIEF_IP" in stage.unset_env:
        problems.append("Stage.unset_env removes DET_CHIEF_IP: the ranks and nested layers need it")
    return problems


def rank_command_run_problems(plan: LaunchPlan) -> list[str]:
    """The ranks must run the wrapper: a stage that launches anything runs ctx.rank_command somewhere."""
    stage, rc = plan.stage, plan.context.rank_command
    launches = plan.cluster.is_chief or any(not c.daemon for c in stage.commands if isinstance(c, Command))
    if not launches:
        return []
    carried = any(contains(c.argv, rc) for c in stage.commands if isinstance(c, Command)) or \
        any(contains(s, rc) for s in (*stage.setup, *stage.prelaunch)) or \
        any(shlex.join(rc) in text for text in (*stage.files.values(), *stage.executables.values())
            if isinstance(text, str))
    if carried:
        return []
    return ["the stage never runs ctx.rank_command (the rank wrapper, then the user's command): "
            "put it in the launcher's argv, or in a file the stage writes"]


def rank_commands(stage: Stage) -> list[Command]:
    return [c for c in stage.commands if isinstance(c, Command) and c.rank is not None]


def rank_command_problems(plan: LaunchPlan, wrappers: Sequence[Any]) -> list[str]:
    """What is wrong with the ranks a stage starts itself (``Command(rank=N)``), if it has any."""
    commands = rank_commands(plan.stage)
    if not commands:
        return []
    problems: list[str] = []
    c, rc = plan.cluster, plan.rank_command
    rank_env = next((w.rank_env for w in wrappers if isinstance(w, RankWrapper) and w.rank_env), ())
    mine = range(c.first_rank, c.first_rank + c.local_slots)
    for cmd in commands:
        where = f"rank command {cmd.name}"
        if cmd.argv != rc:
            problems.append(f"{where}: its argv must be ctx.rank_command (the wrapper, then the user's command; "
                            "put anything in between in RankWrapper.argv), got {cmd.argv!r}")
        if cmd.rank not in mine:
            problems.append(f"{where}: rank {cmd.rank} is not one of node {c.node_rank}'s ranks "
                            f"({mine.start}..{mine.stop - 1})")
        env = {**plan.process_env(), **cmd.env}
        named = next((name for name in rank_env if name in env), None)
        if named is None or env[named] != str(cmd.rank):
            problems.append(f"{where}: the wrapper would not read rank {cmd.rank} from its environment "
                            f"(RankWrapper.rank_env {rank_env!r}: {named}={env.get(named or '')!r})")
    ranks = [cmd.rank or 0 for cmd in commands]
    for rank in sorted({r for r in ranks if ranks.count(r) > 1}):
        problems.append(f"rank {rank} is started by {ranks.count(rank)} commands on node {c.node_rank}")
    if len(commands) != plan.expected_ranks:
        problems.append(f"node {c.node_rank} starts {len(commands)} rank(s) itself but expects "
                        f"{plan.expected_ranks} (Stage.expected_ranks, default: its slots)")
    return problems

