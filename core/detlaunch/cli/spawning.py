"""--spawn NAME: this command starts every node's detlaunch; --spawned: this detlaunch is one of them.

The spawning side reads the hosts, asks the named spawner (a ``detlaunch_spawners`` plugin) for the
launches, and runs them (cli/fanout.py); with --dry-run it prints them, one line each, as a shell would
read them. A spawned node checks that it runs the spawning command's version and, when told to, watches its
stdin: a line there stops its job (Ctrl-C in the spawning command), its end after that kills it at once
(a second Ctrl-C), its end alone stops it (the spawning command is gone: SIGKILL).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import socket
import sys
import threading

import detlaunch.exit_codes as exit_codes
from detlaunch.errors import ConfigError
from detlaunch.planning.config import Config
from detlaunch.planning.plugin_manager import Hooks
from detlaunch.planning.spawn import SPAWNED_STDIN, NodeLaunch, SpawnRequest, spawn_env
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
        return config  # srun's tasks: the secret is in their environment
    secret = _take_the_job_secret()
    signal.signal(signal.SIGHUP, _hangup)
    threading.Thread(target=_stop_at_stdin_end, name="spawner-watch", daemon=True).start()
    return dataclasses.replace(config, env={**config.env, SECRET_ENV: secret})


_began = threading.Event()
SECRET_LINE = b"secret "  # the first line on a spawned node's stdin: the job link's key (fanout.py)


def _take_the_job_secret() -> str:
    """The spawning command's first line: the job secret, which the nodes of one command share whatever their
    job directories (node 0 here and the others over ssh need no shared home). Read a byte at a time, so that
    a stop line right after it stays for the watch; an end before it is the spawning command gone."""
    line = b""
    while not line.endswith(b"\n"):
        try:
            byte = os.read(0, 1)
        except InterruptedError:
            continue
        if not byte:
            raise SystemExit(exit_codes.by_signal(signal.SIGHUP))
        line += byte
    if not line.startswith(SECRET_LINE):  # a stop line first: told to stop while still planning
        raise SystemExit(exit_codes.by_signal(signal.SIGHUP))
    return line[len(SECRET_LINE):].strip().decode()


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
        hosts = tuple(a or "" for a in hooks.discover_cluster(as_chief).node_addrs)
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
    return Fanout(launches, SECRET_LINE + secret.encode() + b"\n", {SECRET_ENV: secret}).run()
