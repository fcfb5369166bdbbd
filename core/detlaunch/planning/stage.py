"""The data a layer returns: what a node runs (Stage), and what it is given (StageContext).

Everything here is plain frozen data. Building it never starts a process; the
supervisor is what turns a Stage into running processes.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detlaunch.planning.cluster import ClusterInfo
    from detlaunch.planning.config import Config

# The supervisor's socket, in each node's run dir; the variable naming it for sshd sessions
# (core removes it from what the launcher passes on).
SOCKET_NAME = "supervisor.sock"
SSHD_SUPERVISOR_ENV = "DETLAUNCH_SSHD_SUPERVISOR"


@dataclasses.dataclass(frozen=True)
class RankWrapper:
    """A layer's contribution to the per-rank wrapper.

    rank_env: environment variables holding the global rank, in the order to try
    (horovod: HOROVOD_RANK, OMPI_COMM_WORLD_RANK, PMI_RANK).
    argv: a command to run between the wrapper and the user's command (numactl ...).
    not_progress: text of output lines that are not progress for the hang watch, though a rank prints
    them while it waits (horovod's stall warning, every 60 s while ranks wait in a collective): a read of
    a rank's output whose first line holds one of them, and what the same stream brings right after it
    (the rest of that message), does not count as progress (docs/HANGS.md).
    warm_env: for a layer whose launcher starts the rank wrappers (torchrun, horovodrun, deepspeed): what
    that launcher adds to every rank's environment on this node, as far as it is read at import
    (torchrun's ``OMP_NUM_THREADS=1``; rank/warm.py's list). Declaring it (``{}`` when it adds none of those)
    lets the node's ranks be forked from its rank template (docs/RESTARTS.md, "Warm ranks"); None: they start
    cold. A rank whose import-time variables differ from the template's still starts cold, with one line.
    preload: modules the layer's ranks import (horovod: ``horovod.torch``), imported once by the rank
    template with torch when the script mentions torch.
    """

    rank_env: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    not_progress: tuple[str, ...] = ()
    warm_env: Mapping[str, str] | None = None
    preload: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Command:
    """One process a node's supervisor starts and owns.

    daemon: the process serves the job and never ends by itself (sshd); the job on
    this node ends when its ranks have all exited, and then the daemon is stopped.
    An early exit of a daemon is a failure.
    stop_signal: how to ask this process to stop (horovodrun wants SIGINT).
    rank: this command is global rank `rank` itself, started by the supervisor with no
    launcher in between (a launcher-less layer: ``--layer direct``). Its argv is
    ``ctx.rank_command`` and its env names the rank in a variable of the layer's
    ``RankWrapper.rank_env``. The supervisor starts it like a launcher (after any sshd
    wait and prelaunch step), and stops it as a rank: through its wrapper, once.
    standby: ``"pkg.module:function"``, the entry point of a Python launcher whose argv is
    ``python -m pkg.module ARGS...`` (torchrun: ``"torch.distributed.run:main"``). With
    restarts on, the supervisor starts it ahead of time, past its imports, while an attempt
    runs, and the next attempt's launcher is that process: ``function()`` called with
    ``sys.argv = ["pkg.module", ARGS...]`` (see standby.py and docs/HOOKS.md).
    notes: lines ``--dry-run`` shows under the command, in words: what its argv does not say (deepspeed's
    host list, what its encoded rank command carries, where it runs).
    """

    argv: tuple[str, ...]
    name: str = ""
    stop_signal: int = signal.SIGTERM
    daemon: bool = False
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    rank: int | None = None
    standby: str | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "notes", tuple(self.notes))
        if not self.argv:
            raise ValueError("a Command needs a non-empty argv")
        if self.rank is not None and (self.daemon or self.rank < 0):
            raise ValueError("a rank Command is not a daemon, and its rank is >= 0")
        if self.standby is not None and (self.daemon or self.rank is not None or ":" not in self.standby):
            raise ValueError("a Command's standby is 'module:function', for a launcher (not a daemon, not a rank)")
        if not self.name:
            name = os.path.basename(self.argv[0]) if self.rank is None else f"wrapper-{self.rank}"
            object.__setattr__(self, "name", name)


@dataclasses.dataclass(frozen=True)
class Stage:
    """What one node runs: its commands and what must be in place before they start.

    In this order, the supervisor: creates each of `dirs` afresh (0700, emptied if it
    existed); writes `files` (0600) and `executables` (0700) - relative paths are in the
    node's run directory; runs each `setup` command (each must succeed); starts the
    daemon commands; waits until each (host, port) in `wait_for_sshd` answers with an
    SSH greeting; runs each `prelaunch` command; then starts the other commands.
    When the job ends on this node, `dirs` and `files` are removed.
    expected_ranks: ranks that will register on this node (default: its slots).
    unset_env: variables removed from every process of this node (SLURM_JOBID...).
    """

    commands: tuple[Command, ...]
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    executables: Mapping[str, str] = dataclasses.field(default_factory=dict)
    dirs: tuple[str, ...] = ()
    setup: tuple[tuple[str, ...], ...] = ()
    wait_for_sshd: tuple[tuple[str, int], ...] = ()
    prelaunch: tuple[tuple[str, ...], ...] = ()
    expected_ranks: int | None = None
    unset_env: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "commands", tuple(self.commands))
        object.__setattr__(self, "dirs", tuple(self.dirs))
        object.__setattr__(self, "setup", tuple(tuple(s) for s in self.setup))
        object.__setattr__(self, "prelaunch", tuple(tuple(s) for s in self.prelaunch))
        object.__setattr__(self, "wait_for_sshd", tuple(tuple(w) for w in self.wait_for_sshd))
        object.__setattr__(self, "unset_env", tuple(self.unset_env))
        if not self.commands:
            raise ValueError("a Stage needs at least one command")


@dataclasses.dataclass(frozen=True)
class StageContext:
    """What every stage hook is given.

    run_dir: this node's private directory for the job (created 0700 at start;
    holds the supervisor's socket and the stage's files).
    shared_dir: the job directory every node can read (``--job-dir``; by default
    under the user's home, which clusters share), for per-job ssh keys.
    rank_command: the per-rank wrapper followed by the user's command: what the
    launcher must run once per rank.
    """

    config: Config
    cluster: ClusterInfo
    run_dir: str
    shared_dir: str
    user_command: tuple[str, ...]
    rank_command: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def launcher_args(self) -> tuple[str, ...]:
        """The user's overrides for the underlying launcher (given before ``--``)."""
        return self.config.launcher_args

    def option(self, name: str, default: Any = None) -> Any:
        """A parsed option by its dest name (``fusion_threshold_mb``), layer options included.

        A core option that is unset reads as its one default (``master_port`` -> 29500), so a layer
        never writes detlaunch's defaults again; ``default`` is for the layer's own options.
        """
        value = self.config.options.get(name)
        if value is None and default is None:  # a core option's one default (config.NUMBERS, from its Option entry)
            from detlaunch.planning.config import NUMBERS
            value = NUMBERS[name].default if name in NUMBERS else None
        return default if value is None else value

    def replace(self, **changes: Any) -> StageContext:
        return dataclasses.replace(self, **changes)
