"""Options: the command line, mirrored by DETLAUNCH_* variables and a config file.

Precedence, highest first: command-line flag, ``DETLAUNCH_<OPTION>`` environment
variable, the config file (``--config``/DETLAUNCH_CONFIG, TOML: a ``[detlaunch]``
section for these options, a section named after the layer for its own), then
the documented default.

The command line reads ``detlaunch [OPTIONS] [LAUNCHER_ARGS... --] COMMAND...``:
anything detlaunch does not know, given before ``--``, is passed to the
underlying launcher (torchrun, horovodrun...). Without ``--``, the first
argument that is not an option starts the command; a ``--`` that comes after the
command has started belongs to the command. Launcher arguments always start with
an option (``--rdzv-backend c10d --``).

An empty ``DETLAUNCH_<OPTION>`` variable counts as unset.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import string
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import detlaunch.exit_codes as exit_codes
from detlaunch.errors import ConfigError
from detlaunch.launcher_flags import elsewhere_hint, finish_launcher_flags, layer_table
from detlaunch.numbers import Number as Number
from detlaunch.numbers import ports
from detlaunch.observe.dedupe import DEFAULT_WINDOW
from detlaunch.options import Option, OptionGroup, env_name, every_option, numbers_of
from detlaunch.planning.cluster import job_id_arg
from detlaunch.planning.text_values import named, ssh_options
from detlaunch.rank.protocol import DEFAULT_GRACE, DEFAULT_PREFIX
from detlaunch.restarts.options import RESTARTS
from detlaunch.system.safefs import read_regular_file

CORE_SECTION = "detlaunch"


@dataclasses.dataclass(frozen=True)
class Config:
    """Every parsed option, and the command to run on each rank."""

    layer: str
    command: tuple[str, ...]
    launcher_args: tuple[str, ...]
    options: Mapping[str, Any]
    env: Mapping[str, str]

    def __getattr__(self, name: str) -> Any:
        # Options read as attributes: config.nproc_per_node, config.grace_period...
        try:
            return self.options[name]
        except KeyError:
            raise AttributeError(name) from None


class Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see detlaunch --help)")


RANK = Number(int, 0, 2**31 - 1)


def preflight_mode(text: str) -> str | None:
    """--preflight's value: once (also 1/yes/true/on: the variable or config key set) or always; off: none."""
    word = str(text).strip().lower()
    if word in ("once", "1", "yes", "true", "on"):
        return "once"
    if word == "always":
        return "always"
    if word in ("0", "no", "false", "off", "never"):
        return None
    raise argparse.ArgumentTypeError(f"--preflight {text!r}: write --preflight once or --preflight always (the "
                                     "flag alone takes the word after it: put another option after it)")


def rank_list(text: str) -> tuple[int, ...]:
    return tuple(int(RANK.parse(r)) for r in text.split(",") if r.strip())


PREFIX_FIELDS = ("rank", "node", "host")
DEDUPE_MIN_RANKS = 4  # "more than a few": fewer ranks than this rarely drown a console


NODES = Number(int, 1, 65536)


class NodeRange(int):
    """--nnodes MIN:MAX (torchrun's spelling): MAX nodes run ranks; with none to replace a lost one, the job
    goes on with fewer, down to MIN (docs/RESTARTS.md). An int, MAX, to whatever reads --nnodes as a count
    (a launcher flag's conversion); Config.options holds nnodes=MAX, min_nodes=MIN (split_node_range)."""

    low: int

    def __new__(cls, low: int, high: int) -> NodeRange:
        value = super().__new__(cls, high)
        value.low = low
        return value

    @property
    def high(self) -> int:
        return int(self)


def node_count(text: str) -> int | NodeRange:
    """--nnodes's type: N, or MIN:MAX (the flag, DETLAUNCH_NNODES and the config file alike)."""
    low, colon, high = str(text).partition(":")
    if not colon:
        return int(NODES.parse(text))
    pair = NodeRange(int(NODES.parse(low)), int(NODES.parse(high)))
    if pair.low > pair.high:
        raise argparse.ArgumentTypeError(f"{text!r}: MIN is more than MAX; give --nnodes MIN:MAX with MIN <= MAX")
    return pair


def split_node_range(options: dict[str, Any]) -> None:
    """--nnodes MIN:MAX as the rest of detlaunch reads it: nnodes=MAX, min_nodes=MIN (None: a fixed count)."""
    value = options.get("nnodes")
    if isinstance(value, NodeRange):
        options["nnodes"], options["min_nodes"] = value.high, value.low if value.low < value.high else None
    elif value is not None:
        options["nnodes"], options["min_nodes"] = int(value), None
    else:
        options["min_nodes"] = None


def line_prefix(text: str) -> str:
    """A --prefix template: only {rank}, {node} and {host} (the wrapper fills them in with str.format)."""
    fields = ", ".join("{" + f + "}" for f in PREFIX_FIELDS)
    try:
        named = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
        unknown = [name for name in named if name not in PREFIX_FIELDS]
        if unknown:  # also {rank.x} and {rank[0]}: a bare field name only
            raise argparse.ArgumentTypeError(f"{text!r} names an unknown field {unknown[0]!r}; use {fields}")
        text.format(rank=0, node=0, host="h")
    except (KeyError, IndexError, AttributeError, TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid template ({e}); use {fields}, "
                                         "and write {{ for a brace") from None
    return text


def job_options(layer_names: Sequence[str] = ()) -> OptionGroup:
    return OptionGroup("job", (
        Option("--layer", help="launch layer: " + (", ".join(layer_names) or "see `detlaunch layers`")),
        Option("--config", metavar="FILE", help="TOML config file ([detlaunch] and [<layer>] sections)"),
        Option("--job-id", type=job_id_arg, metavar="NAME", help="job id shared by every node, a plain name "
               "(default: from the scheduler, else derived from the host list for multi-node jobs, else random)"),
        Option("--module", action="store_true", help="COMMAND is a Python module: every rank runs "
               "`python -m COMMAND ARGS` (torchrun's -m)"),
        Option("--no-python", action="store_true", help="run COMMAND as it is, even X.py (an executable "
               "script with its own #! line); by default X.py runs under detlaunch's Python"),
        Option("--dry-run", action="store_true", help="print this node's plan; start nothing"),
        Option("--format", choices=("text", "json"), default="text", help="--dry-run and info output"),
        Option("--debug", action="store_true", help="tracebacks and launcher verbosity"),
    ))


CLUSTER = OptionGroup("cluster (torchrun-style flags, or --hosts/--hostfile)", (
    Option("--nproc-per-node", type=Number(int, 1, 4096), metavar="N",
           help="ranks on this node (default: visible GPUs, else 1)"),
    Option("--nnodes", type=node_count, metavar="N|MIN:MAX", help="number of nodes; MIN:MAX: MAX nodes run ranks "
           "and, when a node is lost and no spare is left, the job goes on with the nodes that remain, down to MIN "
           "(needs restarts: --max-node-restarts)"),
    Option("--node-rank", type=Number(int, 0, 65535), metavar="R", help="this node's rank (0 is the chief)"),
    Option("--master-addr", metavar="ADDR", help="the chief's address"),
    Option("--master-port", type=ports(29500), metavar="PORT",
           help="rendezvous port on the chief (default %(default)s)"),
    Option("--node-addr", metavar="ADDR", help="this node's own address (default: from the host list)"),
    Option("--hosts", metavar="H:S,...", help="every node and its slots: 10.0.0.1:8,10.0.0.2:8"),
    Option("--hostfile", metavar="FILE", help="MPI-style hostfile: 'host slots=N' per line"),
    Option("--cluster", metavar="PROVIDER", help="force a discovery provider (see detlaunch plugins)"),
    Option("--spares", type=Number(int, 0, 65535, 0), metavar="N", supervision=True,
           help="the last N nodes of the host list (with --nnodes M: node ranks M..M+N-1) start as spares: they run "
           "no rank and each takes a lost node's place at the next attempt (needs restarts: --max-node-restarts)"),
    Option("--exclude-hosts", type=named("--exclude-hosts", "file"), metavar="FILE", supervision=True,
           help="hosts kept out of the job, one a line, read at the start and before every attempt; detlaunch "
           "appends each host it loses, with the reason and the time"),
))

SUPERVISION = OptionGroup("supervision", (
    Option("--grace-period", type=Number(float, 0, 3600, DEFAULT_GRACE, "s"), metavar="S", supervision=True,
           shown="grace {:g} s",
           help="after asking processes to stop, SIGKILL them this many seconds later (default %(default)g, as "
           "torchrun's; a rank that ignores the signal is SIGKILLed at once)"),
    Option("--start-timeout", type=Number(float, 0.001, 7 * 86400, 300.0, "s"), metavar="S", supervision=True,
           shown="start timeout {:g} s",
           help="give up when the ranks (or peers) have not started after this long, or when a lost node has not "
           "joined again for the next attempt (default %(default)g)"),
    Option("--no-pid-namespace", action="store_true",
           help="do not run the job in a PID namespace of its own (by default every process of the job is in one, "
           "so nothing it starts can outlive detlaunch, even a SIGKILLed one)"),
    Option("--no-warm-ranks", action="store_true", supervision=True,
           help="start every rank as a new interpreter (by default, under --layer direct, each node imports torch "
           "once, in a rank template, and forks its ranks from it: docs/RESTARTS.md, \"Warm ranks\")"),
    Option("--preload", metavar="MOD,...", supervision=True,
           help="warm ranks: the rank template also imports these modules (a model library, your own package)"),
    Option("--link-port", type=ports(), metavar="PORT", old_flags=("--control-port",),
           help="multi-node: the chief's port for the job link, the other nodes' supervisors' connections "
           "(default: master port + 1; --control-port, its old name, is still accepted)"),
    Option("--heartbeat", type=Number(float, 0.01, 60, 1.0, "s"), metavar="S", supervision=True,
           help="multi-node: heartbeat interval; a node silent for 5 intervals is lost (default %(default)g)"),
    Option("--hang-timeout", type=Number(float, 0, 7 * 86400, None, "s", words=("auto",)), metavar="S",
           supervision=True,
           help="when no rank on any node has shown progress (an output line, or detlaunch.progress()) for S "
           f"seconds, print every rank's stack and the suspects, and stop the job with exit code {exit_codes.HANG}. "
           "auto: S learned from the job (5 x the longest interval between progress after a warm-up, at least "
           "60 s, kept across restarts). Default: after 10 minutes without progress, the stacks and suspects are "
           "printed once and the job goes on; 0: not watched at all"),
    Option("--strict-teardown", action="store_true", supervision=True,
           help="count a rank that a crash signal (SIGABRT, SIGSEGV...) ended while Python finalized, after its "
           "script returned and its atexit handlers ran, as failed. By default it counts as finished, with a line "
           "saying so: torch's gloo threads abort a rank so about 1 run in 6 (docs/RESTARTS.md)"),
    Option("--straggler-action", choices=("warn", "replace"), default="warn", supervision=True,
           help="a rank named a straggler (its detlaunch.section() times stay under --straggler-threshold of the "
           "other ranks' speed; without sections, the CPU-busy suspect): warn (a line, an event, a mark in "
           "detlaunch status), or replace its node by a spare (needs --spares; else warns) (default %(default)s)"),
    Option("--straggler-threshold", type=Number(float, 0.05, 0.99, 0.7), metavar="F", supervision=True,
           help="a rank slower than this fraction of the other ranks' median speed, window after window, is a "
           "straggler (default %(default)g)"),
    Option("--preflight", type=preflight_mode, nargs="?", const="once", metavar="once|always", supervision=True,
           help="before any rank starts, every node runs its layer's doctor checks, a compute check and a network "
           "check in pairs of nodes (and every plugin's, docs/HOOKS.md); a node that fails or is under "
           "--preflight-threshold of the median is named with its figures (docs/HANGS.md, \"Preflight\"). once "
           "(the flag alone): before the first attempt (again after a failed one); always: before every attempt. "
           "Right before the script, give its value: `--preflight once train.py`"),
    Option("--job", action="store_true", supervision=True,
           help="detlaunch doctor --job [OPTIONS]: on every node of an allocation, as a job would run there (the same "
           "nodes and options), run the --preflight and print its table; no rank starts. Exits 0, or "
           f"{exit_codes.PREFLIGHT} when a node is named"),
    Option("--preflight-threshold", type=Number(float, 0.05, 0.99, 0.7), metavar="F", supervision=True,
           help="a node under this fraction of the median node's figure fails the preflight (default %(default)g)"),
    Option("--preflight-action", choices=("stop", "warn"), default="stop", supervision=True,
           help="a node failed the preflight and no spare can take its place (--spares): stop the job before any "
           f"rank starts (one line naming the node and its figures, exit code {exit_codes.PREFLIGHT}), or warn and "
           "go on (default %(default)s)"),
    Option("--dump-budget", type=Number(float, 0, 10, 1.5, "s"), metavar="S", supervision=True,
           help="when a rank fails, take the other ranks' stacks within S seconds before stopping them "
           "(default %(default)g; 0: stop at once)"),
    Option("--job-dir", metavar="DIR",
           help="job directory shared by all nodes, for per-job ssh keys (default ~/.cache/detlaunch/jobs/JOB_ID)"),
    Option("--log-dir", metavar="DIR", help="also write each rank's output to DIR/rank-N.log "
           "(DIR/attempt-K/rank-N.log with --max-restarts)"),
    Option("--ranks", type=rank_list, metavar="R,R", help="only these global ranks reach the console, on whichever "
           "node they run (not local ranks: 0 is rank 0 of the job); log files get every rank"),
    Option("--prefix", type=line_prefix, default=DEFAULT_PREFIX, metavar="TEMPLATE", supervision=True,
           help="what starts each output line: {rank}, {node} (node rank) and {host} are replaced "
           "(default '[rank={rank}] '; e.g. '{rank}@{host}: ')"),
    Option("--dedupe", action=argparse.BooleanOptionalAction, supervision=True,
           help="fold identical lines that several ranks of a node print within the window into one "
           "'[ranks=0-7] line' on the console (log files keep every line). Default: on when the console is a "
           f"terminal and a node runs more than {DEDUPE_MIN_RANKS} ranks"),
    Option("--dedupe-window", type=Number(float, 0.001, 60, DEFAULT_WINDOW, "s"), metavar="S", supervision=True,
           help="--dedupe: how long a line may wait for the same line from other ranks (default %(default)g)"),
    Option("--events", metavar="FILE", help="append the job's events to FILE, one JSON object a line "
           "(default: in --log-dir, events.jsonl on node 0, events-node-N.jsonl on node N; see docs/EVENTS.md)"),
))


SPAWN = OptionGroup("one command for every node (docs/SPAWN.md)", (
    Option("--spawn", type=named("--spawn", "spawner (ssh or srun)"), metavar="NAME",
           help="start every node's detlaunch from here: ssh (the nodes of --hosts/"
           "--hostfile, over your own ssh, in parallel) or srun (one step of the SLURM allocation you are in)"),
    Option("--ssh-opts", type=ssh_options, metavar="OPTS",
           help="--spawn ssh: more options for ssh, as one string ('-p 2222 -F cfg')"),
    Option("--export", metavar="VAR,VAR", help="--spawn: these variables of this environment reach every node "
           "(as mpirun's -x, which --layer horovod takes too; ~/.deepspeed_env and ./.deepspeed_env are read too)"),
    Option("--spawned", metavar="VERSION", help=argparse.SUPPRESS),  # set by the spawning detlaunch, for each node
))


def core_options(layer_names: Sequence[str] = ()) -> tuple[OptionGroup, ...]:
    """Every core option, in --help's order: the one place each is declared."""
    return (job_options(layer_names), CLUSTER, SPAWN, SUPERVISION, RESTARTS)


def supervision_options() -> tuple[Option, ...]:
    """The options the plan carries to the node's supervisor (LaunchPlan.settings, read as plan.NAME)."""
    return tuple(o for o in every_option(core_options()) if o.supervision)


# Every numeric core option's Number (kind, range, unit, default), by dest: derived from the declarations
# (the ssh layers' --ssh-port is declared by detlaunch.ssh, above this module, with this table's row).
NUMBERS: Mapping[str, Number] = {**numbers_of(core_options()), "ssh_port": ports()}
# Options renamed, by their old names: the old flag, DETLAUNCH_ variable and config key still work (the
# new name wins where both are given).
OLD_NAMES = {old: o.dest for o in every_option(core_options()) for old in o.old_dests}


def build_parser(layer_names: Sequence[str] = (), add_help: bool = True) -> Parser:
    p = Parser(
        prog="detlaunch",
        usage="detlaunch --layer NAME [OPTIONS] [LAUNCHER_ARGS... --] COMMAND [ARGS...]\n"
        "       detlaunch {layers,plugins,info,doctor} [OPTIONS]",
        description="Start a distributed training job on this node, supervised: any rank's "
        "failure stops the whole job with that rank's exit code; every output line carries its "
        "rank; signals reach every process; nothing is left running.",
        epilog="Every option --foo-bar is also read from DETLAUNCH_FOO_BAR. "
        f"Installed layers: {', '.join(layer_names) or 'none'}.",
        allow_abbrev=False,
        add_help=add_help,
    )
    for group in core_options(layer_names):
        group.add_to(p)
    return p


def option_env_name(dest: str) -> str:
    return env_name(dest)


def _convert(action: argparse.Action, raw: Any, where: str, fix: str) -> Any:
    """Check and convert one value from the environment or the config file, as the flag would."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)):
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{where}={raw!r} is not a yes/no value: write 1 or 0; {fix}")
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise ConfigError(f"{where}={raw!r}: write a single value (a string or a number); {fix}")
    value: Any = str(raw)  # a TOML number is checked exactly like the same text on the command line
    if action.type is not None:
        try:
            value = action.type(value)  # type: ignore[operator]
        except argparse.ArgumentTypeError as e:
            raise ConfigError(f"{where}={raw!r}: {e}; {fix}") from None
        except (TypeError, ValueError):
            kind = getattr(action.type, "__name__", "value")
            raise ConfigError(f"{where}={raw!r} is not a valid {kind}; {fix}") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{where}={raw!r}: choose one of {', '.join(map(str, action.choices))}; {fix}")
    return value


def read_config_file(path: str | None) -> dict[str, dict[str, Any]]:
    if not path:
        return {}
    import tomllib  # only when there is a file: most runs have none, and it costs a start ~5 ms

    try:
        data = tomllib.loads(read_regular_file(path).decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}; give a TOML file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not valid TOML: it is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    for section, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(f"config file {path}: {section!r} must be a [section]")
    return data


def check_sections(sections: Mapping[str, Any], layer_names: Sequence[str], path: str | None) -> None:
    """Every section of the config file is [detlaunch] or an installed layer's: catch typos."""
    known = (CORE_SECTION, *layer_names)
    for section in sections:
        if section not in known:
            raise ConfigError(f"config file {path}: unknown section [{section}]; use "
                              f"{', '.join(f'[{k}]' for k in known)}")


def apply_defaults(
    parser: argparse.ArgumentParser,
    env: Mapping[str, str],
    sections: Mapping[str, Mapping[str, Any]],
    layer_dests: Mapping[str, set[str]],
    config_path: str | None,
) -> None:
    """Set option defaults from the config file, then from DETLAUNCH_* variables (which win)."""
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    owner = {dest: section for section, dests in layer_dests.items() for dest in dests}
    for section, values in sections.items():
        for key, raw in values.items():
            dest = key.replace("-", "_")
            dest = OLD_NAMES.get(dest, dest)
            if dest not in actions or owner.get(dest, CORE_SECTION) != section:
                if section == CORE_SECTION or section in layer_dests:
                    raise ConfigError(f"config file {config_path}: unknown option {key!r} in [{section}]")
                continue  # a section for a layer not in use
            if isinstance(raw, list):
                raw = ",".join(map(str, raw))
            parser.set_defaults(**{dest: _convert(actions[dest], raw, f"[{section}] {key}",
                                                  f"fix it in {config_path}")})
    for dest, action in actions.items():
        old = [option_env_name(o) for o, new in OLD_NAMES.items() if new == dest]
        for name in (*old, option_env_name(dest)):  # the last one set wins: the new name
            if env.get(name):
                parser.set_defaults(**{dest: _convert(action, env[name], name, f"fix or unset {name}")})


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """Split at the first ``--``: (options, command), command None when there is no ``--``."""
    if "--" in argv:
        i = list(argv).index("--")
        return list(argv[:i]), list(argv[i + 1 :])
    return list(argv), None


def parse(
    parser: argparse.ArgumentParser, argv: Sequence[str], env: Mapping[str, str]
) -> tuple[argparse.Namespace, list[str], list[str]]:
    """Parse options; return (options, launcher_args, command).

    A layer's launcher flags (launcher_flags.py) are applied once everything is parsed; those that
    only the launcher knows join the launcher args.
    """
    ns, launcher_args, command = _split_options(parser, argv)
    if getattr(ns, "dedupe", None) and (getattr(ns, "prefix", None) or DEFAULT_PREFIX) != DEFAULT_PREFIX:
        raise ConfigError(f"--dedupe folds lines that carry the default prefix {DEFAULT_PREFIX.strip()!r} only: "
                          "give --prefix or --dedupe, not both")
    return ns, [*finish_launcher_flags(parser, ns), *launcher_args], command


def _split_options(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.Namespace, list[str], list[str]]:
    head, command = split_argv(argv)
    if command is None:
        return _parse_without_separator(parser, head)
    ns, launcher_args = parser.parse_known_args(head)
    if not launcher_args or launcher_args[0].startswith("-"):
        return ns, launcher_args, command
    # The command started before the `--` (train.py --epochs 3 -- extra): that `--` is the command's.
    ns, _, started = _parse_without_separator(parser, head)
    return ns, [], [*started, "--", *command]


def _parse_without_separator(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.Namespace, list[str], list[str]]:
    """The first argument that is not an option starts the command; the rest is the command's."""
    parser.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns, unknown = parser.parse_known_args(argv)
    command = ns.command
    if unknown:
        raise ConfigError(unknown_option_message(parser, unknown[0], getattr(ns, "layer", None) or "NAME"))
    del ns.command
    return ns, [], command


def unknown_option_message(parser: argparse.ArgumentParser, arg: str, layer: str = "NAME") -> str:
    """Name the fix: detlaunch's spelling of a near miss or of another launcher's flag (``-np`` on a
    layer other than horovod's), else the `--` that hands it to the launcher."""
    import difflib  # a typo's path only

    name = arg.split("=", 1)[0]
    known = [s for s in parser._option_string_actions if s.startswith("--")]
    close = difflib.get_close_matches(name.replace("_", "-"), known, n=1, cutoff=0.8)
    if close:
        return f"unknown option {arg}: did you mean {close[0]}?"
    launcher, table = layer_table(parser)
    hint = elsewhere_hint(arg, table, launcher)
    if hint:
        return f"unknown option {arg}: {hint}"
    return (f"unknown option {arg}: if it is for the launcher, add -- before the script "
            f"(detlaunch --layer {layer} {arg} ... -- train.py); detlaunch --layer {layer} --help lists its options")


def resolve_command(command: Sequence[str], env: Mapping[str, str], module: bool = False,
                    no_python: bool = False) -> tuple[str, ...]:
    """The user's command as each rank runs it: ``x.py`` runs under this Python, unbuffered; with
    `module`, ``python -m COMMAND``; with `no_python`, the command as it is (torchrun's -m, --no-python)."""
    if not command:
        raise ConfigError("no command given: detlaunch --layer NAME [OPTIONS] train.py [ARGS...]")
    first = command[0]
    if first.startswith("-"):
        raise ConfigError(f"{first} is not a command: give detlaunch's and the launcher's flags before `--` "
                          "and the command after it (detlaunch --layer NAME [FLAGS] -- train.py [ARGS])")
    if module and no_python:
        raise ConfigError("--module runs COMMAND under Python and --no-python runs it without: give one of them")
    if module:
        if not all(part.isidentifier() for part in first.split(".")):
            raise ConfigError(f"--module: {first!r} is not a Python module name (pkg.train): "
                              "give the module, or drop --module to run a script")
        return (sys.executable, "-u", "-m", *command)
    if first.endswith(".py") and not no_python:
        if not os.path.isfile(first):
            raise ConfigError(f"script not found: {first} (relative to {os.getcwd()})")
        return (sys.executable, "-u", *command)
    if "/" in first:
        if not os.access(first, os.X_OK) or os.path.isdir(first):
            raise ConfigError(f"command not found or not executable: {first}")
    elif shutil.which(first, path=env.get("PATH")) is None:
        here = f"; --no-python runs it as a command: give ./{first}" if no_python and os.path.isfile(first) else ""
        raise ConfigError(f"command not found: {first} (not on PATH{here})")
    return tuple(command)
