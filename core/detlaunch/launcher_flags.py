"""A launcher's own flags on detlaunch's command line: a table per layer, applied here.

A public submodule of the plugin API: ``from detlaunch.launcher_flags import maps, passes, ...``.

A torchrun, horovodrun or deepspeed user arrives with a command line that works with their launcher.
A layer declares a table of :class:`LauncherFlag` rows, one per flag of its launcher, saying what
detlaunch does with it, and registers it with :func:`add_launcher_flags` from its
``detlaunch_add_options`` hook:

- ``maps(...)``: the flag means a detlaunch option (``--nproc_per_node`` -> ``--nproc-per-node``;
  ``turns_on(dest)`` for a switch: torchrun's ``-m`` is ``--module``);
  it is converted once every flag is parsed, so a conversion can read other options (``-np`` with
  ``-H``), and a flag that contradicts the same option given in detlaunch's spelling is refused;
- ``passes(...)``: a launcher-only flag, handed to the launcher as the user spelled it;
- ``refuses(...)``: detlaunch cannot honour it: one line saying why and what to type instead;
- ``same_as_detlaunch(...)``: detlaunch has an option of the very same spelling (``--nnodes``): nothing to add.

Every flag is accepted in the launcher's spelling with dashes or underscores, ``=`` or a space.
While planning, a layer calls :func:`check_launcher_args` on the arguments given before ``--``: a
flag there that detlaunch plans itself (an abbreviation the parser did not take, a Config built by
hand) is refused rather than handed to the launcher, where it would contradict the plan and end as
a false root cause.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from detlaunch.errors import ConfigError

# A conversion: (the value as typed, or None for a flag without one; every parsed option) -> the
# detlaunch options it sets. It raises ConfigError for a value detlaunch cannot honour. The options
# hold GIVEN too: the launcher flags given, by their row's first name (torchrun's --redirects
# reads --tee).
Convert = Callable[[str | None, Mapping[str, Any]], Mapping[str, Any]]
GIVEN = "launcher_flags_given"

_SEEN = "_detlaunch_launcher_flags"  # namespace attributes the actions fill, removed by finish_launcher_flags
_PASS = "_detlaunch_launcher_passthrough"


@dataclasses.dataclass(frozen=True)
class LauncherFlag:
    """One flag of a launcher, and what detlaunch does with it.

    names: the launcher's spellings (``-np``, ``--num-proc``); the other dash/underscore spelling
    of each long name is accepted too.
    value: whether the flag takes a value (checked against the launcher's own parser by the tests).
    does: "map", "pass", "refuse" or "own" (see the module's docstring).
    to: for "map", the detlaunch dest it sets, or a conversion to the options it sets.
    dest: for "map" rows that exist only when detlaunch has that option (``max_restarts``): the row
    refuses with ``why`` when the parser has no such dest.
    why: for "refuse" (and a "map" whose dest is missing): the line the user sees after the flag.
    doc: what detlaunch does with it, in a few words (docs/LAUNCHER_FLAGS.md).
    check: for "map", refuses a value detlaunch cannot honour (see :func:`maps`).
    narrows: for "map", the options its conversion reads and narrows (deepspeed's --include keeps some hosts
    of --hostfile): it may set them over the user's value, which it has taken into account.
    """

    names: tuple[str, ...]
    value: bool
    does: str
    to: str | Convert | None = None
    dest: str | None = None
    why: str = ""
    doc: str = ""
    check: Callable[[str], None] | None = None
    narrows: tuple[str, ...] = ()

    def convert(self, value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
        if isinstance(self.to, str):
            return {self.to: value}
        assert self.to is not None
        return self.to(value, options)

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every spelling accepted: the launcher's, and each long name with dashes and with underscores."""
        out: list[str] = []
        for name in self.names:
            variants = [name]
            if name.startswith("--"):
                body = name[2:]
                variants += ["--" + body.replace("_", "-"), "--" + body.replace("-", "_")]
            out += [v for v in variants if v not in out]
        return tuple(out)


def maps(*names: str, to: str | Convert, value: bool = True, doc: str = "", needs_dest: bool = False,
         why: str = "", check: Callable[[str], None] | None = None, narrows: tuple[str, ...] = ()) -> LauncherFlag:
    """A flag that sets a detlaunch option.

    to: its dest (the value is parsed as that option parses it), or a conversion.
    needs_dest: refuse with `why` unless the parser has the dest `to`.
    check: raises ConfigError for a value detlaunch cannot honour; it also guards detlaunch's own
    option when that has the same spelling (torchrun's ``--nnodes=1:2``).
    narrows: the options the conversion reads and replaces with a narrower value (see LauncherFlag).
    """
    if not doc:
        doc = f"--{to.replace('_', '-')}" if isinstance(to, str) else ""
    return LauncherFlag(tuple(names), value, "map", to=to, dest=to if isinstance(to, str) and needs_dest else None,
                        why=why, doc=doc, check=check, narrows=narrows)


def turns_on(dest: str) -> Convert:
    """The conversion of a flag without a value that means a detlaunch switch (torchrun's ``-m``: ``--module``)."""
    def convert(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
        return {dest: True}
    return convert


def passes(*names: str, value: bool = True, doc: str = "passed to the launcher") -> LauncherFlag:
    return LauncherFlag(tuple(names), value, "pass", doc=doc)


def refuses(*names: str, why: str, value: bool = True) -> LauncherFlag:
    return LauncherFlag(tuple(names), value, "refuse", why=why, doc="refused: " + why)


def same_as_detlaunch(*names: str, value: bool = True,
                      doc: str = "detlaunch's own option of the same name") -> LauncherFlag:
    return LauncherFlag(tuple(names), value, "own", doc=doc)


class _FlagAction(argparse.Action):
    """Records a launcher flag as typed; finish_launcher_flags applies it once everything is parsed."""

    def __init__(self, option_strings: list[str], dest: str, row: LauncherFlag, refuse_why: str = "",
                 launcher: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs=None if row.value else 0,
                         default=argparse.SUPPRESS, **kwargs)
        self.row = row
        self.refuse_why = refuse_why
        self.launcher = launcher

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        typed = f"{option_string}={values}" if self.row.value else str(option_string)
        if self.refuse_why:
            raise ConfigError(f"{typed}: {self.refuse_why}")
        if self.row.check is not None and self.row.value:
            self.row.check(str(values))
        if self.row.does == "pass":
            given = [str(option_string), str(values)] if self.row.value else [str(option_string)]
            setattr(namespace, _PASS, [*getattr(namespace, _PASS, []), *given])
            return
        seen = getattr(namespace, _SEEN, [])
        seen.append((typed, self.row, values if self.row.value else None))
        setattr(namespace, _SEEN, seen)


def add_launcher_flags(parser: argparse.ArgumentParser, table: Sequence[LauncherFlag], launcher: str) -> None:
    """Accept the flags of `table` on detlaunch's command line (from a layer's detlaunch_add_options).

    A spelling detlaunch already has (its own ``--nnodes``, a layer's ``--ssh-port``) stays
    detlaunch's. Flags are hidden from ``--help``; docs/LAUNCHER_FLAGS.md lists them.
    """
    taken = set(parser._option_string_actions)
    dests = {a.dest for a in parser._actions}
    group = parser.add_argument_group(f"{launcher}'s own flags (see docs/LAUNCHER_FLAGS.md)")
    for row in table:
        if row.check is not None:
            for spelling in row.spellings:
                if spelling in taken:
                    _guard(parser._option_string_actions[spelling], row.check)
        if row.does == "own":
            continue
        spellings = [s for s in row.spellings if s not in taken]
        if not spellings:
            continue
        refuse_why = row.why if row.does == "refuse" or (row.dest and row.dest not in dests) else ""
        group.add_argument(*spellings, action=_FlagAction, row=row, refuse_why=refuse_why, launcher=launcher,
                           help=argparse.SUPPRESS)
        taken.update(spellings)


def _guard(action: argparse.Action, check: Callable[[str], None]) -> None:
    """Run `check` on the value of detlaunch's own option before its own type conversion."""
    original = action.type

    def checked(text: str) -> Any:
        check(text)
        return original(text) if callable(original) else text

    checked.__name__ = getattr(original, "__name__", "value")
    checked.__wrapped__ = original  # type: ignore[attr-defined]  # inspect.unwrap finds the checked Number
    action.type = checked


def finish_launcher_flags(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> list[str]:
    """Apply the launcher flags recorded while parsing; return the ones that pass to the launcher.

    A mapped flag sets its detlaunch option unless the user set that option to something else in
    detlaunch's spelling (then: one line naming both). Options still at their default (from the
    config file or DETLAUNCH_* too) give way to the flag, as any flag wins over them.
    """
    recorded: list[tuple[str, LauncherFlag, str | None]] = getattr(ns, _SEEN, [])
    passthrough: list[str] = getattr(ns, _PASS, [])
    for attr in (_SEEN, _PASS):
        if hasattr(ns, attr):
            delattr(ns, attr)
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    by_flag: dict[str, tuple[str, Any]] = {}
    given = {row.names[0]: value for _, row, value in recorded}
    # Flags naming one option first, so that a conversion sees them (--tee 3 --log_dir DIR).
    for typed, row, value in sorted(recorded, key=lambda r: not isinstance(r[1].to, str)):
        for dest, new in row.convert(value, {**vars(ns), GIVEN: given}).items():
            new = _parse_like(actions.get(dest), new, typed)
            current = getattr(ns, dest, None)
            narrowed = dest in row.narrows  # the conversion read the value it replaces: no contradiction
            if not narrowed and dest in by_flag and by_flag[dest][1] != new:
                raise ConfigError(f"{typed} contradicts {by_flag[dest][0]}: give one of them")
            if not narrowed and dest not in by_flag and current is not None and current != parser.get_default(dest) \
                    and current != new:
                raise ConfigError(f"{typed} contradicts {_spelling(actions.get(dest), dest)} {_show(current)}: "
                                  "give one of them")
            by_flag[dest] = (typed, new)
            setattr(ns, dest, new)
    return passthrough


def _parse_like(action: argparse.Action | None, value: Any, typed: str) -> Any:
    """A value is checked and converted as detlaunch's own option would (a number a conversion
    computed too: ``-np 100000`` meets --nproc-per-node's range)."""
    if action is None or action.type is None or not isinstance(value, (str, int, float)) or isinstance(value, bool):
        return value
    try:
        return action.type(str(value))  # type: ignore[operator]
    except argparse.ArgumentTypeError as e:
        raise ConfigError(f"{typed}: {e}") from None
    except (TypeError, ValueError):
        kind = getattr(action.type, "__name__", "value")
        raise ConfigError(f"{typed}: {value!r} is not a valid {kind}") from None


def _spelling(action: argparse.Action | None, dest: str) -> str:
    if action is None:
        return "--" + dest.replace("_", "-")
    return next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def find_flag(table: Sequence[LauncherFlag], arg: str, allow_abbrev: bool = True) -> LauncherFlag | None:
    """The row `arg` (``--nproc=2``, ``-np``) means to the launcher: exact, or an unambiguous prefix
    of a long spelling, as argparse (allow_abbrev) resolves it."""
    name = arg.split("=", 1)[0]
    exact = [row for row in table if name in row.spellings]
    if exact or not (allow_abbrev and name.startswith("--") and len(name) > 2):
        return exact[0] if exact else None
    prefixed = {id(row): row for row in table for s in row.spellings if s.startswith(name)}
    return next(iter(prefixed.values())) if len(prefixed) == 1 else None


# Other launchers' best-known flags, by the detlaunch option they mean. Given to a layer whose
# launcher lacks them (`--layer deepspeed -np 2`), the line names what this layer takes instead:
# handed on after `--`, the launcher would refuse them too.
ELSEWHERE: dict[str, tuple[str, str]] = {
    "-np": ("horovodrun", "nproc_per_node"), "--num-proc": ("horovodrun", "nproc_per_node"),
    "--num_gpus": ("deepspeed", "nproc_per_node"), "--num_accelerators": ("deepspeed", "nproc_per_node"),
    "--nproc_per_node": ("torchrun", "nproc_per_node"), "--num_nodes": ("deepspeed", "nnodes"),
    "-hostfile": ("horovodrun", "hostfile"),
}
_MEANING = {"nproc_per_node": ("the ranks per node", "--nproc-per-node N"),
            "nnodes": ("the number of nodes", "--nnodes N"), "hostfile": ("the hosts", "--hostfile FILE")}


def elsewhere_hint(arg: str, table: Sequence[LauncherFlag], launcher: str) -> str | None:
    """What to type instead of another launcher's flag `arg`: detlaunch's option, and this
    launcher's own spelling of it when it has one (`table`); None for a flag not in ELSEWHERE."""
    name = arg.split("=", 1)[0]
    known = ELSEWHERE.get(name) or ELSEWHERE.get(name.replace("-", "_") if name.startswith("--") else name)
    if known is None:
        return None
    other, dest = known
    meaning, option = _MEANING[dest]
    detlaunch_spelling = option.split()[0]
    # A row meaning that option: it maps onto it, or its doc names it first (a conversion that does more).
    own = [s for row in table if row.does == "map" and (row.to == dest or row.doc.split(";")[0] == detlaunch_spelling)
           for s in row.names if s.replace("_", "-") != detlaunch_spelling]
    also = f" (or {launcher}'s own {own[0]} {option.split()[1]})" if own else ""
    return f"for {meaning}, give {option}{also}; {name} is {other}'s spelling"


def layer_table(parser: argparse.ArgumentParser) -> tuple[str, list[LauncherFlag]]:
    """The launcher and table a layer registered on `parser` with add_launcher_flags ("", [] if none)."""
    actions = [a for a in parser._actions if isinstance(a, _FlagAction)]
    return (actions[0].launcher if actions else ""), [a.row for a in actions]


def check_launcher_args(table: Sequence[LauncherFlag], launcher_args: Sequence[str], launcher: str,
                        allow_abbrev: bool = True) -> None:
    """Refuse, while planning, a launcher argument that detlaunch plans itself or cannot honour.

    Such a flag would reach the launcher and contradict detlaunch's plan (an extra rank the
    supervisor refuses, ending as a false root cause).
    """
    for arg in launcher_args:
        if not arg.startswith("-"):
            continue
        row = find_flag(table, arg, allow_abbrev)
        hint = elsewhere_hint(arg, table, launcher) if row is None else None
        if hint:
            raise ConfigError(f"{arg}: {hint}")
        if row is None or row.does == "pass":
            continue
        if row.does == "refuse":
            raise ConfigError(f"{arg}: {row.why}")
        raise ConfigError(f"{arg} would reach {launcher} and contradict detlaunch's plan, which sets it itself: "
                          f"give detlaunch's option instead ({row.doc or row.names[0]})")
