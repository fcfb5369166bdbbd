"""The ``detlaunch`` command: argv -> Config -> ClusterInfo -> LaunchPlan -> Supervisor -> exit code."""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import functools
import json
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import detlaunch.exit_codes as exit_codes
from detlaunch.cli.control import CONTROL_COMMANDS, control_command
from detlaunch.errors import ConfigError, DetlaunchError, one_line
from detlaunch.planning.command_line import CommandLine, first_pass, truthy
from detlaunch.planning.config import Parser, check_sections, split_argv

if TYPE_CHECKING:
    from detlaunch.link.membership import Membership
    from detlaunch.planning.cluster import ClusterInfo
    from detlaunch.planning.config import Config
    from detlaunch.planning.plan import LaunchPlan
    from detlaunch.planning.plugin_manager import Hooks, PluginSet

SUBCOMMANDS = ("layers", "plugins", "info", "doctor")


def without_openssl_hashes() -> None:
    """hashlib's own sha256 (and the rest) in this process, not OpenSSL's: loading libcrypto costs each of
    detlaunch's processes ~3 MB (issue 17: <= 30 MB a node), for stevedore's cache key and the job link's
    HMAC, a few hashes a job. hashlib falls back to its builtins where _hashlib cannot be imported (a Python
    built without OpenSSL); ssl is a module of its own and works as before. Only OpenSSL's extras are
    not there (scrypt, names such as "sha512_224"; pbkdf2_hmac is Python 3.11's slow fallback, gone in
    3.12), and nothing of detlaunch uses them."""
    if "hashlib" not in sys.modules:
        sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]


SECRET_ENV = "DETLAUNCH_JOB_SECRET"  # system/jobdir.SECRET_ENV, without importing it at every start


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    as_command = argv is None  # the detlaunch command itself, not a caller in this interpreter
    if as_command:
        without_openssl_hashes()
    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if env is None else env)
    if as_command and any(a == "--spawned" or a.startswith("--spawned=") for a in argv):  # docs/SPAWN.md
        from detlaunch.cli.spawning import take_start_lines

        take_start_lines(argv, env)  # its variables and the job secret, on its stdin
    if as_command and SECRET_ENV in os.environ:  # kept in `env` only: no fork of this process shows it
        from detlaunch.system.environ_block import take_out  # (ctypes: only for a job given a secret)

        take_out(SECRET_ENV)
    if argv and argv[0] == "report":  # a job's page from its event logs: no plugin is loaded for it
        from detlaunch.cli.report import report_command

        return report_command(argv[1:], env)
    if argv and argv[0] in CONTROL_COMMANDS:  # questions to a running job: no plugin is loaded for them
        try:
            return control_command(argv[0], argv[1:], env)
        except BrokenPipeError:
            return _reader_went_away()
    args = argv[1:] if argv and argv[0] in SUBCOMMANDS else argv
    pre = None
    try:
        pre = first_pass(args, env)
        debug = pre.debug
    except DetlaunchError:  # reported by run(), in one line
        debug = "--debug" in split_argv(args)[0] or truthy(env.get("DETLAUNCH_DEBUG"))
    try:
        code = run(argv, env, pre)
        if as_command:
            exit_at_once(code)
        return code
    except DetlaunchError as e:
        if debug:
            traceback.print_exc()
        print(f"detlaunch: error: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else 0
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
    except BrokenPipeError:
        return _reader_went_away()


def _reader_went_away() -> int:
    """`detlaunch --dry-run | head`: whoever read our output stopped; end as a shell tool does, quietly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
    os.close(devnull)
    return exit_codes.by_signal(signal.SIGPIPE)


def exit_at_once(code: int) -> None:
    """Exit now, as the interpreter would once atexit ran, without tearing its objects down one by one
    (unless a plugin left a thread of its own running: then the interpreter joins it, as always).

    That teardown (a full garbage collection over what the start built, then every module's objects) cost
    each detlaunch ~50 ms of CPU after its job was over: 32 nodes ending together on 2 cores spent seconds
    in it after their supervisors were done (bench teardown-nodes).
    """
    import threading  # loaded already by then: this costs a dict lookup

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)


def run(argv: list[str], env: dict[str, str], pre: argparse.Namespace | None = None) -> int:
    """One detlaunch command; `pre`: main's first pass over the same argv, if it has one (it costs ~5 ms)."""
    from detlaunch.planning.plugin_manager import (
        PluginSet,  # not at import: `detlaunch status` loads no plugin, and starts faster
    )

    subcommand = argv.pop(0) if argv and argv[0] in SUBCOMMANDS else None
    line = CommandLine.read(argv, env, pre)
    pre = line.first
    plugins = PluginSet(env)
    layers = plugins.layer_names()
    if line.sections:
        check_sections(line.sections, layers, pre.config)
    plugins.load_plugins()
    if subcommand in ("layers", "plugins"):
        return list_plugins(plugins, subcommand, as_json=pre.format == "json", env=env, debug=pre.debug)
    for entry in plugins.entries:  # reported, not fatal: the job does not need this plugin
        if entry.status == "failed":
            entry = plugins.owned(entry)
            print(f"detlaunch: warning: plugin {entry.name!r} ({entry.dist} {entry.version}) failed to load and "
                  f"is skipped: {entry.error} (DETLAUNCH_DISABLE_PLUGINS={entry.name} silences this)",
                  file=sys.stderr)

    layer = line.layer
    if layer:
        plugins.load_layer(layer)
    elif subcommand not in ("info", "doctor") and not pre.help:
        raise ConfigError(f"no layer chosen: add --layer NAME, before the launcher's own flags "
                          f"(installed: {', '.join(layers) or 'none'})")
    plugins.check_hooks()
    hooks = plugins.hooks
    config = line.config(hooks, layers, job=subcommand not in ("info", "doctor"))
    options = config.options
    if subcommand is None and (options.get("spawn") or options.get("spawned")):
        from detlaunch.cli.spawning import join_as_node, spawn_job

        if not options.get("spawned"):  # this command starts every node (--spawn): docs/SPAWN.md
            return spawn_job(hooks, config, line.argv)
        config = join_as_node(config)  # with the spawning command's job secret

    if subcommand == "info":
        return print_info(discover(hooks, config, job=False), options.get("format", "text"))

    if subcommand == "doctor" and not options.get("job"):
        return doctor(hooks, config)
    if subcommand == "doctor":  # --job: the preflight across the allocation, as a job that starts no rank
        from detlaunch.planning.preflight import doctor_job_config

        config = doctor_job_config(config)
        options = config.options

    from detlaunch.planning.plan import build_plan

    if options.get("dry_run"):  # what this node would run, or every node of a host list (cli/dry_run.py)
        from detlaunch.cli.dry_run import dry_run

        return dry_run(config, functools.partial(plan_node, hooks, job=False))
    everyone, spare, plan = plan_node(hooks, config, job=True)
    cluster, n_spares = plan.cluster, options.get("spares") or 0

    if cluster.num_nodes > 1 and cluster.is_chief:  # refused now, in one line, not half-way through the start
        from detlaunch.link.fdlimit import check_open_files, chief_needs

        check_open_files(chief_needs(cluster))
    if options.get("log_dir"):
        _prepare_log_dir(options["log_dir"])

    from detlaunch.node.supervisor import NodeSupervisor
    from detlaunch.observe.report import format_report, format_warnings
    from detlaunch.system.isolation import run_isolated
    from detlaunch.system.jobdir import lock_job_dir
    from detlaunch.system.rundirs import remove_stale_run_dirs

    for tmpdir in {os.path.dirname(plan.run_dir), tempfile.gettempdir()}:
        remove_stale_run_dirs(tmpdir)  # left by a detlaunch of ours that was SIGKILLed
    job_lock = None
    if cluster.num_nodes > 1 or options.get("job_dir"):  # held by this process until it exits
        job_lock = lock_job_dir(plan.shared_dir, everyone.node_rank, cluster.job_id, bool(options.get("job_dir")))
    promoted_from: int | None = None  # the spare number it waited as, once sent to a place (said when it joins)
    if spare is not None:
        place = wait_as_spare(plan, spare, everyone.node_addr, bool(options.get("debug")))
        if not isinstance(place, Place):
            if job_lock is not None:
                job_lock.release()
            return place
        plan, promoted_from = build_plan(hooks, config, spare_in_place(everyone, place, n_spares)), spare

    def supervise() -> int:
        nonlocal plan, promoted_from
        carried = None
        while True:  # the job goes on here: as a lost chief's successor or a node that follows it
            # (node/succession.py), or as a spare, this node's place having gone to another (a lost host back)
            supervisor = NodeSupervisor(plan, debug=bool(options.get("debug")), on_event=hooks.event, carried=carried,
                                        replan=functools.partial(replan, hooks, config, plan.run_dir),
                                        promoted_from=promoted_from)
            result = supervisor.run()
            carried, promoted_from = supervisor.succession.next, None
            if carried is not None:
                try:
                    plan = build_plan(hooks, config, carried.cluster)
                except DetlaunchError as e:  # this node's part under the new chief cannot be planned: one line
                    print(f"detlaunch: error: the job cannot go on here after the succession: {one_line(e)}",
                          file=sys.stderr)
                    return exit_codes.FAILED
                continue
            number = supervisor.link_events.spare_number  # this node was lost and its place taken: a spare now
            if number is None:
                break
            place = wait_as_spare(plan, number, everyone.node_addr, bool(options.get("debug")))
            if not isinstance(place, Place):
                return place
            plan, promoted_from = build_plan(hooks, config, spare_in_place(everyone, place, n_spares)), number
        for problem in hooks.job_finished(plan.context, result):
            print(f"detlaunch: warning: a job_finished observer failed: {problem}", file=sys.stderr)
        for line in [*format_warnings(result), *result.attempts, *format_report(result)]:
            print(line, file=sys.stderr)
        if options.get("log_dir") and plan.cluster.is_chief:  # the job's page, from its logs (cli/report.py)
            from detlaunch.cli.report import page_at_end

            if page_problem := page_at_end(options["log_dir"], options.get("events")):
                print(f"detlaunch: warning: {page_problem}", file=sys.stderr)
        return result.exit_code

    if options.get("spawned"):  # the job's own handlers take SIGHUP from here (cli/spawning.py)
        from detlaunch.cli.spawning import job_begins

        job_begins()
    try:
        hooks.job_started(plan.context, plan.stage)  # scheduler side effects; a failure is one error line
        if options.get("no_pid_namespace"):
            return supervise()
        return run_isolated(supervise, warn=lambda line: print(f"detlaunch: warning: {line}", file=sys.stderr))
    finally:
        if job_lock is not None:
            job_lock.release()


def plan_node(hooks: Hooks, config: Config, job: bool) -> tuple[ClusterInfo, int | None, LaunchPlan]:
    """This node's plan: the whole cluster as discovered, this node's spare number (None: not a spare), and the plan
    it runs (a spare's: as the last place would). Options that cannot go together are one line here."""
    from detlaunch.planning import spares
    from detlaunch.planning.plan import build_plan

    options = config.options
    everyone = discover(hooks, config, job=job)
    n_spares = options.get("spares") or 0
    spare = spares.spare_number(everyone, n_spares)  # this detlaunch waits as a spare (planning/spares.py)
    # A spare plans as the last worker would, for the link's settings; once promoted, as the node it replaces.
    cluster = spares.active_cluster(everyone, n_spares) if spare is None else \
        spares.take_place(everyone, n_spares, spares.places(everyone, n_spares) - 1)
    if cluster.num_nodes > 1 and not options.get("link_port") and options["master_port"] >= 65535:
        raise ConfigError(f"--master-port {options['master_port']} leaves no port for the link between nodes "
                          "(master port + 1): give --link-port PORT or a lower --master-port")
    plan = build_plan(hooks, config, cluster)
    if n_spares and not plan.restarts.enabled:
        raise ConfigError(f"--spares {n_spares}: a spare takes a lost node's place at the next attempt, and this "
                          "job has none: add --max-node-restarts N (or --max-restarts N)")
    if options.get("min_nodes") and not plan.restarts.enabled:
        raise ConfigError(f"--nnodes {options['min_nodes']}:{options['nnodes']}: a job shrinks at its next attempt, "
                          "and this job has none: add --max-node-restarts N (or --max-restarts N)")
    excluded = spares.read_excluded(options.get("exclude_hosts"))
    if everyone.node_addr in excluded:
        raise ConfigError(f"this node's host {everyone.node_addr} is in --exclude-hosts {options['exclude_hosts']}: "
                          "it takes no part in the job (with --spares, a spare takes its place)")
    return everyone, spare, plan


def spare_in_place(everyone: ClusterInfo, place: Place, n_spares: int) -> ClusterInfo:
    """This spare's cluster once it takes `place`: the other places where the chief that sent it knows them, this
    node at its own address. (The membership's entry for this node's first place may be another node's now: a
    node lost and back as a spare, whose old place a spare took, claimed that spare's address, and the chief
    took it for the lost node coming back again, and again.)"""
    from detlaunch.planning import spares

    known = list(place.everyone(everyone).node_addrs)
    known[everyone.node_rank] = everyone.node_addrs[everyone.node_rank]
    moved = dataclasses.replace(place.everyone(everyone), node_addrs=tuple(known))
    return spares.take_place(moved, n_spares, place.node)


def replan(hooks: Hooks, config: Config, run_dir: str, moved: ClusterInfo) -> LaunchPlan:
    """This node's plan again, for nodes that moved (a spare in a lost node's place), in the same run dir."""
    from detlaunch.planning.plan import build_plan

    return build_plan(hooks, config, moved, run_dir)


@dataclasses.dataclass(frozen=True)
class Place:
    node: int  # the node rank a spare takes
    membership: Membership | None = None  # the chief's last (its addresses: a successor's may differ)

    def everyone(self, everyone: ClusterInfo) -> ClusterInfo:
        """The whole cluster with the addresses the chief that promoted the spare has."""
        from detlaunch.link.membership import with_addresses

        return with_addresses(everyone, self.membership) if self.membership is not None else everyone


def wait_as_spare(plan: LaunchPlan, spare: int, addr: str | None, debug: bool) -> Place | int:
    """Wait as spare number `spare` (node/spare.py): the place it is sent to, or its exit code."""
    from detlaunch.node.link_events import link_settings
    from detlaunch.node.spare import SpareWait

    settings = dataclasses.replace(link_settings(plan), node=spare, node_addr=addr)
    wait = SpareWait(settings, say=lambda line: print(f"detlaunch: {line}", file=sys.stderr, flush=True), debug=debug,
                     start_timeout=plan.start_timeout)
    place = wait.wait()
    if place is None:
        assert wait.exit_code is not None
        return wait.exit_code
    return Place(place, wait.membership)


def discover(hooks: Hooks, config: Config, job: bool) -> ClusterInfo:
    """The cluster as the providers see it, with addresses the other machines reach (planning/addresses.py).

    Only a job waits for names that do not resolve yet: `detlaunch info` and --dry-run show them as they are.
    """
    from detlaunch.planning.addresses import settle

    wait = config.options.get("start_timeout") or 0.0 if job else None
    return settle(hooks.discover_cluster(config), wait=wait,
                  say=lambda line: print(f"detlaunch: {line}", file=sys.stderr, flush=True))


def _prepare_log_dir(path: str) -> None:
    """Create --log-dir before anything starts: a bad one is one line here, not a crash mid-launch."""
    from detlaunch.rank import log_files

    try:
        log_files.make_log_dir(path)
    except OSError as e:
        raise ConfigError(f"cannot use --log-dir {path}: {log_files.reason(e)}; pick another --log-dir") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--log-dir {path} is not writable; pick a writable directory")


def list_plugins(plugins: PluginSet, which: str, as_json: bool, env: Mapping[str, str] | None = None,
                 debug: bool = False) -> int:
    """``detlaunch layers`` / ``detlaunch plugins``: what is installed, from where, and whether it loads.

    Each layer is loaded on its own (a fresh plugin manager each), so that one layer's failure,
    or its unknown hook, is its own line and never hides another's. A disabled layer is not imported.
    """
    from detlaunch.planning.plugin_manager import LAYERS, PLUGINS, PluginSet

    groups = (LAYERS,) if which == "layers" else (LAYERS, PLUGINS)
    disabled_env = {"DETLAUNCH_DISABLE_PLUGINS": ",".join(sorted(plugins.disabled))}
    tracebacks = dict(plugins.tracebacks)
    for name in plugins.layer_names():
        one = PluginSet(disabled_env if env is None else env)
        try:
            one.load_layer(name)
            one.check_hooks()
        except DetlaunchError as exc:
            if one.entries and one.entries[-1].status == "loaded":  # loaded, but its hooks are wrong
                one.entries[-1] = dataclasses.replace(one.entries[-1], status="failed", error=str(exc))
        tracebacks.update(one.tracebacks)
        plugins.entries.extend(one.entries)
    entries = plugins.list_entries(groups)
    if as_json:
        print(json.dumps([dataclasses.asdict(e) for e in entries], indent=2))
        return 0
    width = max((len(e.name) for e in entries), default=4)
    for e in entries:
        kind = "layer " if e.group == LAYERS else "plugin"
        line = f"{kind} {e.name:<{width}}  {e.dist} {e.version}  ({e.target})  {e.status}"
        if e.error:
            line += f": {e.error}"
        print(line)
        if debug and e.status == "failed" and tracebacks.get(e.name):
            print("    " + tracebacks[e.name].rstrip().replace("\n", "\n    "))
    return 0


def doctor(hooks: Hooks, config: Config) -> int:
    """``detlaunch doctor [--layer NAME]``: core's checks, then every plugin's; 1 if a required one failed."""
    from detlaunch.planning.doctor import core_checks, exit_code

    checks = [*core_checks(config), *hooks.doctor_checks(config)]
    for check in checks:
        print(check.line())
    if not config.layer:
        print("(add --layer NAME to check what a layer needs)")
    return exit_code(checks)


def print_info(cluster: object, fmt: str) -> int:
    """``detlaunch info``: what discovery found on this node, and from which flag or variable."""
    from detlaunch.planning.cluster import ClusterInfo

    assert isinstance(cluster, ClusterInfo)
    nodes = [{"rank": i, "addr": a, "slots": s}
             for i, (a, s) in enumerate(zip(cluster.node_addrs, cluster.slots, strict=True))]
    if fmt == "json":
        print(json.dumps({"provider": cluster.provider, "job_id": cluster.job_id, "node_rank": cluster.node_rank,
                          "chief": cluster.chief_addr, "nodes": nodes, "sources": dict(cluster.sources)}, indent=2))
        return 0
    print(f"provider: {cluster.provider}")
    print(f"job id:   {cluster.job_id}")
    print(f"this node: rank {cluster.node_rank} of {cluster.num_nodes}, {cluster.local_slots} slot(s)")
    print(f"chief:    {cluster.chief_addr}")
    for i, (addr, slots) in enumerate(zip(cluster.node_addrs, cluster.slots, strict=True)):
        here = "  (this node)" if i == cluster.node_rank and cluster.num_nodes > 1 else ""
        print(f"  node {i}: {addr or '(address unknown)'}  slots={slots}{here}")
    for what, source in cluster.sources.items():
        print(f"  {what} from {source}")
    return 0


__all__ = ["main", "Parser"]
