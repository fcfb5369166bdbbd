"""Checks for options whose value is text that names something: one line of what is wrong, as argparse's type."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable


def named(flag: str, what: str) -> Callable[[str], str]:
    """An option whose value names something (a file, a spawner): an empty one is a mistake, said, not ignored."""
    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"'' names no {what}: give one, or leave {flag} out")
        return text

    check.__name__ = what
    return check


def ssh_options(text: str) -> str:
    """--ssh-opts: one string split as a POSIX shell would (ssh's own options); checked here, split at the spawn."""
    try:
        shlex.split(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"cannot be split as a shell would ({str(e).lower()}): quote it as for a "
                                         "POSIX shell, e.g. --ssh-opts '-p 2222 -F cfg'") from None
    return text
