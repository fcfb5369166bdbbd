"""One command starts the whole job: what a spawner is given, and what it returns (pure).

``detlaunch --spawn NAME ...`` run once (a login node, node 0 itself) starts the per-node ``detlaunch``
of every node through a spawner: ``ssh`` (the user's own ssh, one session a node, in parallel) and
``srun`` (one step of a SLURM allocation) are built in, as plugins that use only the public API; a
plugin adds another through the ``detlaunch_spawners`` hook (HOOKS.md). A spawner turns a
:class:`SpawnRequest` into :class:`NodeLaunch` es, each a command run here; cli/fanout.py runs them,
relays their output, and turns Ctrl-C into a stop of every node.

Every node's detlaunch gets the same arguments, plus ``--spawned VERSION[,stdin]`` (and its
``--node-rank`` where the spawner knows it): it checks that it is the spawning detlaunch's version,
and with ``stdin`` stops its job when its standard input closes, which is how it learns that the
spawning command went away (Ctrl-C, SIGKILL: the ssh session ends).

What reaches a remote shell is quoted here, once (``shlex.quote``, for POSIX shells): every argument and the
working directory arrive exactly as given. The variables a node gets (``--export``, ``.deepspeed_env``) and the
job secret are never on a command line, which any local user can read (``ps``): a node that watches its stdin
gets them on it, before anything else (``spawning.start_lines``); another (srun's tasks) in its environment.
Only the paths its interpreter reads as it starts (``startup_variables``: PATH, PYTHON*, LD_*) are on its
command line.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Protocol

from detlaunch.errors import ConfigError
from detlaunch.planning.config import Config

SPAWNED_STDIN = "stdin"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_FILE = ".deepspeed_env"  # deepspeed's: K=V lines from ~ and ., for every node (DS_ENV_FILE names another)


@dataclasses.dataclass(frozen=True)
class NodeLaunch:
    """One command run here that starts one node's detlaunch (``node``), or all of them (``node`` None:
    srun). ``label`` names it in every line said about it ("node 1 (10.0.0.2)"). ``watches_stdin``: its
    node's detlaunch stops its job when this command's stdin closes (``request.node_argv(node)``), even
    when the spawning command is SIGKILLed, so the launch need not die with it (PR_SET_PDEATHSIG) and
    starts without a fork of the spawning Python (~8 ms a launch, in turn)."""

    argv: tuple[str, ...]
    label: str
    node: int | None = None
    watches_stdin: bool = False
    # The variables of request.env, for a launch that does not watch its stdin (srun passes its environment on to
    # its tasks): its own environment, never its command line, which any local user reads (ps). A launch that
    # watches its stdin gets them there, from detlaunch, with the job secret.
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SpawnRequest:
    """What a spawner is asked to start.

    hosts: node i's address (from --hosts/--hostfile/-H; empty when the scheduler knows them: srun);
    argv: the arguments every node's detlaunch gets (as the user gave them; ``--spawn`` stays, the
    node ignores it once spawned); detlaunch: how a node runs detlaunch (the same Python path as here,
    as deepspeed's runner does); cwd: the working directory here, and on every node; env: the
    variables every node's detlaunch gets (named with --export, and .deepspeed_env's); ssh_opts: the
    user's --ssh-opts, split as a shell would; version: this detlaunch's, which every node must run.
    """

    hosts: tuple[str, ...]
    argv: tuple[str, ...]
    detlaunch: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    config: Config
    ssh_opts: tuple[str, ...] = ()
    version: str = ""

    def node_argv(self, node: int | None, watch_stdin: bool = True) -> tuple[str, ...]:
        """Node `node`'s detlaunch command (None: the scheduler tells each node its rank)."""
        spawned = f"{self.version},{SPAWNED_STDIN}" if watch_stdin else self.version
        rank = ("--node-rank", str(node)) if node is not None else ()
        return (*self.detlaunch, "--spawned", spawned, *rank, *self.argv)

    def startup_argv(self, node: int | None, watch_stdin: bool = True) -> tuple[str, ...]:
        """node_argv, behind ``env NAME=VALUE`` for the variables its interpreter reads as it starts (paths: see
        startup_variables); the others come on its stdin (NodeLaunch.env says why)."""
        assigns = [f"{k}={v}" for k, v in startup_variables(self.env).items()]
        return ("env", *assigns, *self.node_argv(node, watch_stdin)) if assigns else self.node_argv(node, watch_stdin)

    def shell_command(self, node: int | None, watch_stdin: bool = True) -> str:
        """startup_argv as one line for a remote POSIX shell (sh, bash, dash, zsh, ksh), in the same directory."""
        words = ["exec", *self.startup_argv(node, watch_stdin)]
        return f"cd {shlex.quote(self.cwd)} && " + " ".join(shlex.quote(w) for w in words)


class Spawner(Protocol):
    """What a ``detlaunch_spawners`` plugin returns, by name: the commands that start every node."""

    def launches(self, request: SpawnRequest) -> Sequence[NodeLaunch]: ...


_HOST = re.compile(r"[A-Za-z0-9_.:\[\]][A-Za-z0-9_.:\[\]-]*")  # a name, an IPv4 or an IPv6 address


def checked_host(host: str) -> str:
    """A host to start a node's detlaunch on, as a spawner may pass it to ssh: letters, digits, '.', ':', '-',
    '_' and brackets only. A shell's metacharacter in a name reaches a user's ProxyCommand through ssh's %h
    (older OpenSSH expands it unquoted), and a leading '-' reads as an option: both refused."""
    if not _HOST.fullmatch(host):
        raise ConfigError(f"{host!r} is not a host name or address (letters, digits, '.', ':', '-', '_'): fix it in "
                          "--hosts/--hostfile")
    return host


def startup_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The variables a node's detlaunch must have when its interpreter starts, so on its command line: PATH,
    PYTHON* (PYTHONPATH may be how it finds detlaunch) and LD_* (its libraries). Paths, not secrets; every other
    variable (a token) reaches the node on its stdin, never on a command line, which any local user reads."""
    return {k: v for k, v in env.items() if k == "PATH" or k.startswith(("PYTHON", "LD_"))}


def exported(names: str | None, env: Mapping[str, str]) -> dict[str, str]:
    """--export VAR,VAR: those variables of this environment (a name not set here is refused)."""
    out: dict[str, str] = {}
    for name in (n.strip() for n in (names or "").split(",")):
        if not name:
            continue
        if not _NAME.fullmatch(name):
            raise ConfigError(f"--export {name!r}: not a variable name (letters, digits and _)")
        if name not in env:
            raise ConfigError(f"--export {name}: {name} is not set here; set it, or drop it from --export")
        out[name] = env[name]
    return out


def env_file_values(paths: Sequence[str]) -> dict[str, str]:
    """K=V lines of deepspeed's env files, the later file winning (as deepspeed's runner reads them)."""
    out: dict[str, str] = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read {path}: {e}; fix or remove it") from None
        for n, line in enumerate(lines, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep or not _NAME.fullmatch(key.strip()):
                raise ConfigError(f"{path}:{n}: {line!r} is not KEY=VALUE; fix it (deepspeed's env file)")
            out[key.strip()] = value
    return out


def env_files(env: Mapping[str, str], cwd: str) -> list[str]:
    """Where deepspeed's runner looks: ~ then ., named DS_ENV_FILE or .deepspeed_env."""
    name = env.get("DS_ENV_FILE") or ENV_FILE
    home = env.get("HOME") or os.path.expanduser("~")
    return list(dict.fromkeys([os.path.join(home, name), os.path.join(cwd, name)]))


def spawn_env(config: Config, cwd: str) -> dict[str, str]:
    """Every variable the nodes get: deepspeed's env files, then --export (which wins)."""
    return {**env_file_values(env_files(config.env, cwd)), **exported(config.options.get("export"), config.env)}
