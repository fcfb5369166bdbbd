"""--spawn NAME: this command starts every node's detlaunch; --spawned: this detlaunch is one of them.

The spawning side reads the hosts, asks the named spawner (a ``detlaunch_spawners`` plugin) for the
launches, and runs them (cli/fanout.py); with --dry-run it prints them, one line each, as a shell would
read them. A spawned node checks that it runs the spawning command's version and, when told to, watches its
stdin: a line there stops its job (Ctrl-C in the spawning command), its end after that kills it at once
(a second Ctrl-C), its end alone stops it (the spawning command is gone: SIGKILL).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import socket
import sys
import threading
from collections.abc import Mapping

import detlaunch.exit_codes as exit_codes
from detlaunch.errors import ConfigError
from detlaunch.planning.config import Config
from detlaunch.planning.plugin_manager import Hooks
from detlaunch.planning.spawn import (
    SPAWNED_STDIN,
    NodeLaunch,
    SpawnRequest,
    checked_host,
    spawn_env,
    startup_variables,
)
from detlaunch.system.jobdir import SECRET_ENV
from detlaunch.system.safefs import random_hex
from detlaunch.version import __version__ as VERSION

DETLAUNCH_COMMAND = (sys.executable, "-m", "detlaunch")  # the same path on every node, as deepspeed's runner


def join_as_node(config: Config) -> Config:
    """A node's detlaunch started by a spawner: the same version, the spawning command's job secret, and a stop
    when the spawner goes."""
    version, _, how = str(config.options["spawned"]).partition(",")
    if version != VERSION:
        host = socket.gethostname()
        raise ConfigError(f"{host} runs detlaunch {VERSION}, the spawning command {version}: "
                          "install the same detlaunch on every node")
    if how != SPAWNED_STDIN:
        return config  # srun's tasks: the secret and the variables are in their environment
    if SECRET_ENV not in config.env:  # not read at the start (take_start_lines): a caller in this interpreter
        secret, variables = _take_the_start_lines()
        os.environ.update(variables)
        config = dataclasses.replace(config, env={**config.env, **variables, SECRET_ENV: secret})
    signal.signal(signal.SIGHUP, _hangup)
    threading.Thread(target=_stop_at_stdin_end, name="spawner-watch", daemon=True).start()
    return config


def take_start_lines(argv: list[str], env: dict[str, str]) -> None:
    """A node started by `--spawn` that watches its stdin (`--spawned VERSION,stdin`): its variables and the job
    secret come first on its stdin (start_lines), read here before anything reads the environment (its options'
    DETLAUNCH_* variables, the scheduler's): the variables into this process's environment, as if it had been
    started with them, and into `env`; the secret into `env` only."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--spawned"] + \
        [a.split("=", 1)[1] for a in argv if a.startswith("--spawned=")]
    if not values or not values[-1].endswith("," + SPAWNED_STDIN):
        return
    secret, variables = _take_the_start_lines()
    os.environ.update(variables)
    env.update({**variables, SECRET_ENV: secret})


_began = threading.Event()
SECRET_LINE = b"secret "  # the last of the lines a spawned node's stdin starts with: the job link's key (fanout.py)
ENV_LINE = b"env "  # before it: the variables the node gets (--export, .deepspeed_env), as one JSON object


def start_lines(secret: str, variables: Mapping[str, str]) -> bytes:
    """What a spawned node that watches its stdin reads first: its variables (when there are any; not those its
    interpreter reads as it starts, which are on its command line: spawn.startup_variables), then the job secret.
    Never on a command line: any local user reads those (ps)."""
    rest = {k: v for k, v in variables.items() if k not in startup_variables(variables)}
    env_line = ENV_LINE + json.dumps(rest).encode() + b"\n" if rest else b""
    return env_line + SECRET_LINE + secret.encode() + b"\n"


def _take_the_start_lines() -> tuple[str, dict[str, str]]:
    """The spawning command's first lines (start_lines): the job secret and the variables, which the nodes of one
    command share whatever their job directories (node 0 here and the others over ssh need no shared home).
    Read a byte at a time, so that a stop line right after them stays for the watch; an end before them is the
    spawning command gone, and a stop line before them a stop while still planning."""
    variables: dict[str, str] = {}
    while True:
        line = b""
        while not line.endswith(b"\n"):
            try:
                byte = os.read(0, 1)
            except InterruptedError:
                continue
            if not byte:
                raise SystemExit(exit_codes.by_signal(signal.SIGHUP))
            line += byte
        if line.startswith(SECRET_LINE):
            return line[len(SECRET_LINE):].strip().decode(), variables
        if not line.startswith(ENV_LINE):
            raise SystemExit(exit_codes.by_signal(signal.SIGHUP))
        variables.update({str(k): str(v) for k, v in json.loads(line[len(ENV_LINE):]).items()})


def job_begins() -> None:
    """From now on the job's own SIGHUP handlers stop it (the supervisor's, the namespace's relay); once
    they are gone again the job is over, and a late end of stdin changes nothing (not its exit code)."""
    _began.set()


def _hangup(signum: int, frame: object) -> None:
    if not _began.is_set():  # still planning: nothing has started, stop here
        raise SystemExit(exit_codes.by_signal(signal.SIGHUP))


def _stop_at_stdin_end() -> None:
    """The spawning command's pipe (an ssh session's stdin): its first line (Ctrl-C there) stops the job as
    SIGHUP does, and its end after that (a second Ctrl-C) as a second SIGHUP does: everything killed now. An
    end without a line first (the spawning command gone, SIGKILL included) is a first SIGHUP."""
    asked = False
    while True:
        try:
            data = os.read(0, 4096)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if data and asked:
            continue
        if asked and not _began.is_set():  # still planning: the first one ends it (no second SystemExit)
            break
        os.kill(os.getpid(), signal.SIGHUP)
        if not data:
            break
        asked = True


def spawn_request(hooks: Hooks, config: Config, argv: list[str]) -> SpawnRequest:
    o = config.options
    if o.get("node_rank") is not None:
        raise ConfigError(f"--spawn {o['spawn']} starts every node with its own --node-rank: drop --node-rank")
    hosts: tuple[str, ...] = ()
    if o.get("hosts") or o.get("hostfile"):  # read as node 0 would: the same checks, the same hosts
        as_chief = dataclasses.replace(config, options={**o, "node_rank": 0})
        hosts = tuple(checked_host(a) if a else "" for a in hooks.discover_cluster(as_chief).node_addrs)
    cwd = os.getcwd()
    return SpawnRequest(hosts=hosts, argv=tuple(argv), detlaunch=DETLAUNCH_COMMAND, cwd=cwd,
                        env=spawn_env(config, cwd), config=config, ssh_opts=tuple(shlex.split(o.get("ssh_opts") or "")),
                        version=VERSION)


def launches_for(hooks: Hooks, config: Config, argv: list[str]) -> list[NodeLaunch]:
    name = config.options["spawn"]
    spawners = hooks.spawners(config)
    if name not in spawners:
        raise ConfigError(f"--spawn {name}: no such spawner (installed: {', '.join(sorted(spawners)) or 'none'})")
    launches = list(spawners[name].launches(spawn_request(hooks, config, argv)))
    if not launches:
        raise ConfigError(f"--spawn {name}: the spawner has nothing to start")
    return launches


def spawn_job(hooks: Hooks, config: Config, argv: list[str]) -> int:
    """The spawning command: every node's launch, or with --dry-run the lines that would run."""
    launches = launches_for(hooks, config, argv)
    if config.options.get("dry_run"):
        for launch in launches:
            print(f"{launch.label}: {shlex.join(launch.argv)}")
        return 0
    from detlaunch.cli.fanout import Fanout

    # One secret for the job's link, whatever job directory each node has: a launch that reads its stdin gets it
    # as its first line, the others (srun passes its environment on to its tasks) in their environment only.
    secret = config.env.get(SECRET_ENV) or random_hex(32)
    return Fanout(launches, start_lines(secret, spawn_env(config, os.getcwd())), {SECRET_ENV: secret}).run()
