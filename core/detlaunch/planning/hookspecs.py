"""Every hook detlaunch calls, in the order a launch calls them.

A layer (``detlaunch.layers`` entry point, loaded only when chosen) or an
always-on plugin (``detlaunch.plugins``) implements some of these with
``@detlaunch.hookimpl``. Core calls them through the small facade in
``detlaunch.planning.plugin_manager.Hooks``; nothing else touches ``pm.hook``.

Where a hook runs: every hook runs inside the ``detlaunch`` process on each
node, before any process of the job starts (``detlaunch_job_finished``: after
they have all ended); none runs inside a rank.

docs/HOOKS.md documents each hook with an example; tests/test_docs.py keeps it
in step with this module, and names a test for every hook. A plugin that
implements a hook not declared here is refused when it loads (for that plugin
only). Layers are checked against all of this by ``detlaunch.testing.LayerContract``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from detlaunch.observe.events import Event
    from detlaunch.outcome import JobResult
    from detlaunch.planning.cluster import ClusterInfo
    from detlaunch.planning.config import Config
    from detlaunch.planning.doctor import Check
    from detlaunch.planning.preflight import PreflightCheck
    from detlaunch.planning.spawn import Spawner
    from detlaunch.planning.stage import RankWrapper, Stage, StageContext

PROJECT = "detlaunch"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- options -----------------------------------------------------------------------------------


@hookspec(historic=True)
def detlaunch_add_options(parser: argparse.ArgumentParser) -> None:
    """Add a layer's or plugin's command-line options.

    :param parser: the ``detlaunch`` parser; add a group named after your layer.
        Every option ``--foo-bar`` is also read from ``DETLAUNCH_FOO_BAR`` and from
        the config file's section named after the layer (``foo_bar = ...``).

    Historic: a plugin registered later still sees the call. Runs on every node,
    before the command line is parsed. Return value ignored.
    """


# -- cluster discovery -------------------------------------------------------------------------


@hookspec(firstresult=True)
def detlaunch_discover_cluster(config: Config) -> ClusterInfo | None:
    """Find this job's nodes, slots, this node's rank and the chief.

    :param config: the parsed options (``config.cluster`` names a provider when
        the user forces one with ``--cluster``).
    :return: a :class:`ClusterInfo`, or None when this provider does not apply
        here (its environment variables are absent, or ``config.cluster`` names
        another provider).

    firstresult: the first provider that answers wins. Built-in order: static
    (tryfirst: ``--hosts``/``--hostfile`` or torchrun-style flags), then the
    schedulers determined, slurm, kubernetes (``detlaunch.planning.providers`` documents
    their order and the precedence of flags over variables), then local
    (trylast, always answers). Runs on every node.

    Nested jobs: when the user gives no chief address and ``DET_CHIEF_IP`` is set
    (an outer layer exported it), a provider takes the chief from it rather than
    rediscovering one; ``static`` and ``local`` do.
    """


# -- the plan: per-rank wrapper, environment, stages -------------------------------------------


@hookspec
def detlaunch_rank_wrappers(ctx: StageContext) -> RankWrapper | None:
    """Contribute to the per-rank wrapper.

    :param ctx: the stage context (cluster, config, the user's command).
    :return: a :class:`RankWrapper` naming the environment variables that hold
        the rank (in the order to try them) and/or argv pieces to run between
        the wrapper and the user's command (``numactl ...``); or None.

    All results are used, in call order: the rank variables of the first result
    that names any win; argv pieces are concatenated. Runs on every node.
    """


@hookspec
def detlaunch_environment(ctx: StageContext) -> Mapping[str, str] | None:
    """Environment additions for every process the job starts on this node.

    :param ctx: the stage context.
    :return: a mapping of variable names to values, or None.

    All results are merged; when two plugins set the same variable, the one
    called first wins (mark yours ``tryfirst`` to take precedence). Core always
    adds ``DET_CHIEF_IP``. Runs on every node.
    """


@hookspec(firstresult=True)
def detlaunch_chief_stage(ctx: StageContext) -> Stage | None:
    """What the chief node (node rank 0) runs under its supervisor.

    :param ctx: the stage context; ``ctx.rank_command`` is the per-rank wrapper
        followed by the user's command, ready to hand to the launcher.
    :return: a :class:`Stage` (the launcher command, and any daemons, files or
        peers to wait for), or None to let another plugin answer.

    firstresult. Runs on the chief only. Must not start processes: it describes.
    """


@hookspec(firstresult=True)
def detlaunch_worker_stage(ctx: StageContext) -> Stage | None:
    """What a non-chief node (node rank > 0) runs under its supervisor.

    :param ctx: the stage context.
    :return: a :class:`Stage`: a launcher that reaches the chief (torchrun), or a
        daemon the chief's launcher reaches (sshd); None to let another answer.

    firstresult. Runs on worker nodes only. Must not start processes.
    """


# -- preflight ---------------------------------------------------------------------------------


@hookspec
def detlaunch_doctor_checks(config: Config) -> list[Check] | None:
    """Check what this node needs for your layer or plugin, for ``detlaunch doctor``.

    :param config: the parsed options (``detlaunch doctor --layer NAME [OPTIONS]``): a check may
        depend on them (sshd is required only when ``config.nnodes``/``hosts`` say several nodes).
    :return: a list of :class:`detlaunch.Check` (name, ok, what was found, the fix, whether it is
        required), or None.

    All results are shown, one line each, after core's own checks; doctor exits 1 when a required
    check failed. Runs on the node where ``detlaunch doctor`` runs, never during a launch (a layer
    runs its own cheap checks while planning). It may import heavy packages (torch) to check them;
    it must not start a job. An exception is shown as a failed check naming the plugin.
    """


@hookspec
def detlaunch_preflight_checks(config: Config) -> list[PreflightCheck] | None:
    """Add checks to ``--preflight`` and ``detlaunch doctor --job``: run on every node before any rank starts.

    :param config: the job's parsed options.
    :return: a list of :class:`detlaunch.PreflightCheck` (a name, a ``run(peer)`` returning a
        :class:`detlaunch.PreflightFigure`, its unit, whether it runs in a pair of nodes, whether its
        figures are compared with the median of the nodes'), or None.

    Called only in the preflight's check child on each node (never in the launcher): a check may import
    torch, touch a GPU, read a NIC's state or write a probe file. A node whose check fails, or whose
    figure is under ``--preflight-threshold`` x the median, is named with its figures and replaced or
    stopped (``--preflight-action``). The built-in compute and network checks come through this hook.
    """


# -- the job starts ------------------------------------------------------------------------------


@hookspec
def detlaunch_job_started(ctx: StageContext, stage: Stage) -> None:
    """Act on the job starting on this node, before any of its processes start.

    :param ctx: the stage context (cluster, config, environment).
    :param stage: what this node is about to run; ``all(c.daemon for c in
        stage.commands)`` tells a node that only serves the chief (sshd) from one
        that runs a launcher of its own.

    For side effects a scheduler needs (Determined: a worker marks its resources
    as a daemon). Called on every node (chief and workers), after the plan is
    built and not for ``--dry-run``, right before the supervisor starts anything.
    Return value ignored. An exception stops the launch on this node: nothing has
    started yet, and detlaunch exits with one error line naming the plugin.
    """


# -- while the job runs --------------------------------------------------------------------------


@hookspec
def detlaunch_event(event: Event) -> None:
    """Observe one event of the job as it happens (exporters: Prometheus, webhooks, dashboards).

    :param event: a frozen :class:`detlaunch.Event`: wall-clock ``time``, ``job_id``, ``node``
        (node rank), ``rank`` (or None), ``kind`` (a :class:`detlaunch.EventKind`, a str) and
        ``details``. docs/EVENTS.md lists every kind and its details; the same events go to
        ``events.jsonl``, in the same order.

    Called on every node, for that node's events (on the chief, also ``node_joined`` and
    ``node_lost``), inside the supervisor's event loop, from the moment the plan is built
    (``job_planned``) to ``job_finished``; never for ``--dry-run``. It must return quickly and
    never block: hand anything slow (network I/O) to a thread of your own. Return value
    ignored; an exception is reported once per plugin and does not change the job.
    """


# -- after the job -------------------------------------------------------------------------------


@hookspec
def detlaunch_job_finished(ctx: StageContext, result: JobResult) -> None:
    """Observe the end of the job on this node (reporting, marking resources...).

    :param ctx: the stage context.
    :param result: exit code, per-rank statuses and the root cause, if any.

    Called on every node after every process of the job on that node is gone,
    before detlaunch exits. Return value ignored; an exception is reported and
    does not change the exit code.
    """


# -- one command for every node ------------------------------------------------------------------


@hookspec
def detlaunch_spawners(config: Config) -> Mapping[str, Spawner] | None:
    """The spawners this plugin adds, by name: ``detlaunch --spawn NAME`` starts every node with one.

    :param config: the spawning command's options (a plugin may offer a spawner only where it works).

    A spawner has one method, ``launches(request)``: given a :class:`detlaunch.SpawnRequest` (the hosts,
    the arguments every node's detlaunch gets, the working directory, the variables to pass), it returns
    the :class:`detlaunch.NodeLaunch` commands that start every node's detlaunch, run on this machine
    (``ssh HOST '<request.shell_command(node)>'``; one ``srun`` for all). Build each node's command with
    ``request.node_argv`` / ``request.shell_command``: they add ``--spawned`` and ``--node-rank`` and quote
    every word. Never put ``request.env``'s values on a command line (any local user reads it): a launch
    that watches its stdin gets them there from detlaunch; another carries them in ``NodeLaunch.env``, its
    own environment. Called only by the spawning command, before anything starts; raise
    :class:`detlaunch.ConfigError` (one line) when the request cannot be met (no hosts given). The first
    plugin to name a spawner wins. Built in: ``ssh`` and ``srun`` (docs/SPAWN.md).
    """
