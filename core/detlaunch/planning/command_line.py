"""argv + environment -> Config, the way the ``detlaunch`` command reads them: in two passes.

A layer's options exist only once the layer is loaded, and which layer to load is itself an
option. So the first pass, before any plugin is loaded, reads only what decides what to load and
how to answer: ``--layer``, ``--config``, ``--debug``, ``--format``, ``--help``. The second pass,
once the plugins (and the layer) are loaded, builds the whole parser (detlaunch's options and every
loaded plugin's), sets defaults from the config file and ``DETLAUNCH_*`` variables, and parses the
same argv again into a :class:`~detlaunch.planning.config.Config`.

The command (cli/main.py), the layer contract suite and the tests all read a command line here, so
what they plan from is what a user's command line gives.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from detlaunch.planning.config import (
    CORE_SECTION,
    Config,
    Parser,
    apply_defaults,
    build_parser,
    parse,
    read_config_file,
    resolve_command,
    split_argv,
    split_node_range,
)

if TYPE_CHECKING:
    from detlaunch.planning.plugin_manager import Hooks


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _first_pass_parser(with_command: bool) -> Parser:
    # The core parser knows which options take a value, so `--nnodes 2 --layer x` finds the layer.
    pre = build_parser(add_help=False)
    pre.add_argument("-h", "--help", action="store_true")
    pre.set_defaults(format=None)  # given or not: DETLAUNCH_FORMAT only counts when not
    for action in pre._actions:  # values are checked by the real parse, where a layer may guard them
        action.type = None
    if with_command:
        pre.add_argument("command", nargs=argparse.REMAINDER)
    return pre


def first_pass(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    """Read what is needed before the layer is loaded: --layer, --config, --debug, --format, --help.

    Only detlaunch's own options count: a ``--layer`` or ``-h`` of the user's command is the command's.
    """
    head, command = split_argv(argv)
    # A launcher's single-dash word (horovodrun's -hostfile, -np) is not detlaunch's -h: unknown here.
    head = ["-" + a if re.match(r"-[^-]{2,}", a) else a for a in head]
    ns = None
    if command is not None:  # launcher args before `--`, unless the command started before it
        ns, extras = _first_pass_parser(with_command=False).parse_known_args(head)
        if extras and not extras[0].startswith("-"):
            ns = None
    if ns is None:
        ns, _ = _first_pass_parser(with_command=True).parse_known_args(head)
    ns.config = ns.config or env.get("DETLAUNCH_CONFIG")
    ns.debug = ns.debug or truthy(env.get("DETLAUNCH_DEBUG"))
    ns.format = ns.format or env.get("DETLAUNCH_FORMAT") or "text"
    return ns


@dataclasses.dataclass
class CommandLine:
    """One command line after the first pass: what it asks for before anything is loaded.

    ``first``: the first pass's options (``layer``, ``config``, ``debug``, ``format``, ``help``);
    ``sections``: the config file's sections (empty without a config file).
    """

    argv: list[str]
    env: Mapping[str, str]
    first: argparse.Namespace
    sections: dict[str, dict[str, Any]]

    @classmethod
    def read(cls, argv: Sequence[str], env: Mapping[str, str],
             first: argparse.Namespace | None = None) -> CommandLine:
        """The first pass (or `first`, when the caller made it already: it costs ~5 ms) and the config file."""
        first = first or first_pass(argv, env)
        return cls(list(argv), env, first, read_config_file(first.config))

    @property
    def layer(self) -> str | None:
        """The layer to load: --layer, else DETLAUNCH_LAYER, else the config file's [detlaunch] layer."""
        return self.first.layer or self.env.get("DETLAUNCH_LAYER") or \
            self.sections.get(CORE_SECTION, {}).get("layer") or None

    def config(self, hooks: Hooks, layer_names: Sequence[str] = (), job: bool = True) -> Config:
        """The second pass, once the plugins and the layer are loaded: every option, as the command reads it.

        `hooks`: the loaded plugins' (their ``detlaunch_add_options`` add their options);
        `layer_names`: the installed layers, for --help; `job`: a command to run is required (and
        resolved as each rank runs it); False for ``detlaunch info`` and ``doctor``, which run none.
        """
        layer = self.layer
        parser = build_parser(layer_names)
        core_dests = {a.dest for a in parser._actions}
        hooks.add_options(parser)
        layer_dests = {layer: {a.dest for a in parser._actions} - core_dests} if layer else {}
        apply_defaults(parser, self.env, self.sections, layer_dests, self.first.config)
        ns, launcher_args, command = parse(parser, self.argv, self.env)
        options = vars(ns)
        options["layer"] = layer
        split_node_range(options)  # --nnodes MIN:MAX: nnodes=MAX, min_nodes=MIN
        run = resolve_command(command, self.env, bool(options.get("module")),
                              bool(options.get("no_python"))) if job else ()
        return Config(layer=layer or "", command=run,
                      launcher_args=tuple(launcher_args), options=options, env=dict(self.env))
