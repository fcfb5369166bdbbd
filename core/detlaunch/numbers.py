"""A numeric option's checked type: the `type` of every numeric Option (options.py), below every part
that declares one (restarts/options.py, planning/config.py), and public for layers (`detlaunch.Number`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Number:
    """A numeric option's one definition: its kind, default and valid range.

    It is the option's argparse ``type``, so the flag, its DETLAUNCH_* variable and the
    config file are all checked by it: nan, inf and values out of range are one clear line
    naming the option, the value and the valid range, never a traceback or a hang later.
    """

    kind: type[int] | type[float]
    low: float
    high: float
    default: int | float | None = None
    unit: str = ""
    off: tuple[str, ...] = ()  # words that turn it off: the value is then None ("none" for an exit code)
    words: tuple[str, ...] = ()  # words that are values of their own: the value is the word ("auto")

    @property
    def __name__(self) -> str:  # argparse and _convert name the kind of value by it
        return "integer" if self.kind is int else "number"

    def describe(self) -> str:
        """The valid range as the error lines show it: ``1..65535``, ``0..3600 s``."""
        low, high = (f"{int(self.low)}", f"{int(self.high)}") if self.kind is int else (f"{self.low:g}",
                                                                                        f"{self.high:g}")
        return f"{low}..{high}" + (f" {self.unit}" if self.unit else "") + (f", or {self.off[0]}" if self.off else "") \
            + "".join(f", or {w}" for w in self.words)

    def __call__(self, text: str) -> int | float | str | None:
        """argparse's view: a word of `off` is None, one of `words` itself, anything else must parse."""
        if self.off and text.strip().lower() in self.off:
            return None
        if self.words and text.strip().lower() in self.words:
            return text.strip().lower()
        return self.parse(text)

    def parse(self, text: str) -> int | float:
        """The value `text` stands for, checked (a word of `off` is not one)."""
        try:
            value = self.kind(text.strip())
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an' if self.kind is int else 'a'} "
                                             f"{self.__name__}; valid: {self.describe()}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; valid: {self.describe()}")
        if not self.low <= value <= self.high:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range; valid: {self.describe()}")
        return value


def ports(default: int | None = None) -> Number:
    return Number(int, 1, 65535, default)
