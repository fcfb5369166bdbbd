"""How one of detlaunch's own options is declared: once, with everything that is said about it.

An `Option` is one entry: its flag (and the old spellings still read), its help, how a value is
checked (a `Number` for every numeric option: kind, range, unit, default), and whether the plan
carries it to the node's supervisor (`supervision=True`: read there as ``plan.NAME``, written by
``--dry-run --format json``; `shown`: how the text plan names it). Its ``DETLAUNCH_*`` variable and
its config-file key follow from the flag. A new option is one entry in its group and its use.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from detlaunch.numbers import Number

ENV_PREFIX = "DETLAUNCH_"


def dest_of(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def env_name(dest: str) -> str:
    """The DETLAUNCH_* variable an option is also read from."""
    return ENV_PREFIX + dest.upper()


@dataclasses.dataclass(frozen=True)
class Option:
    """One core option, declared once (see the module's docstring)."""

    flag: str
    help: str
    type: Callable[[str], Any] | None = None  # a Number for every numeric option
    default: Any = None  # None: the Number's default, if any
    metavar: str | None = None
    action: Any = None  # "store_true", argparse.BooleanOptionalAction
    choices: tuple[str, ...] | None = None
    old_flags: tuple[str, ...] = ()  # renamed: the old flag, variable and config key are still read
    supervision: bool = False  # the plan carries it to the supervisor (plan.NAME)
    shown: str = ""  # how the text plan shows it, e.g. "grace {:g} s" ("": not on the supervisor's line)
    nargs: str | None = None  # "?": the value may be left out (then `const`)
    const: Any = None

    @property
    def dest(self) -> str:
        return dest_of(self.flag)

    @property
    def env(self) -> str:
        return env_name(self.dest)

    @property
    def old_dests(self) -> tuple[str, ...]:
        return tuple(dest_of(f) for f in self.old_flags)

    @property
    def value_default(self) -> Any:
        if self.default is not None or not isinstance(self.type, Number):
            return self.default
        return self.type.default

    def add_to(self, group: argparse._ActionsContainer) -> None:
        keywords: dict[str, Any] = {"help": self.help}
        for name in ("type", "metavar", "action", "choices", "nargs", "const"):
            if getattr(self, name) is not None:
                keywords[name] = getattr(self, name)
        if self.value_default is not None:
            keywords["default"] = self.value_default
        group.add_argument(self.flag, **keywords)
        for old in self.old_flags:  # still read, not shown
            group.add_argument(old, **{**keywords, "help": argparse.SUPPRESS, "dest": self.dest})


@dataclasses.dataclass(frozen=True)
class OptionGroup:
    """Options shown together in --help."""

    title: str
    options: tuple[Option, ...]

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(self.title)
        for option in self.options:
            option.add_to(group)


def every_option(groups: Iterable[OptionGroup]) -> Sequence[Option]:
    return [option for group in groups for option in group.options]


def numbers_of(groups: Iterable[OptionGroup]) -> dict[str, Number]:
    """Each numeric option's Number, by its dest: the table of ranges and defaults."""
    return {o.dest: o.type for o in every_option(groups) if isinstance(o.type, Number)}
