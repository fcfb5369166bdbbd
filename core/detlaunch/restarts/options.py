"""The restart options: detlaunch's flags (and their DETLAUNCH_* variables and config-file keys) that
make a RestartPolicy, checked here in one clear line each. Pure: no I/O.
"""

from __future__ import annotations

import argparse
import re
import signal as signals
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import detlaunch.exit_codes as exit_codes
from detlaunch.errors import ConfigError
from detlaunch.numbers import Number
from detlaunch.outcome import RestartClass
from detlaunch.restarts.policy import Item, RestartPolicy

# detlaunch's own restart options, removed from the job's processes: a detlaunch nested in the job must
# not restart its part on its own (the outer chief restarts the whole job, and counts once).
OPTION_ENV = ("DETLAUNCH_MAX_RESTARTS", "DETLAUNCH_MAX_NODE_RESTARTS")

_CLASSES = {c.value for c in RestartClass}
_CLASS_NAME = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*$")


def parse_item(text: str) -> Item:
    """One entry of --restart-on / --no-restart-on: an exit code, SIGNAME (as 128+N), a restart class
    (RestartClass's value), an exception class."""
    text = text.strip()
    if text.isdigit():
        code = int(text)
        if code > 255:
            raise ValueError(f"exit code {code} is more than 255")
        return code
    if text.upper().startswith("SIG") and text.upper() in signals.Signals.__members__:
        return exit_codes.by_signal(signals.Signals[text.upper()].value)
    restart_class = text.lower().replace("_", "-")
    if restart_class in _CLASSES:
        return restart_class
    if _CLASS_NAME.match(text):
        return text
    raise ValueError(text)


def item_list(text: str) -> tuple[Item, ...]:
    return tuple(parse_item(t) for t in text.split(",") if t.strip())


item_list.__name__ = "list of exit codes (3, SIGKILL), restart classes (" + ", ".join(sorted(_CLASSES)) + \
    ") or exception classes (ValueError)"


T = TypeVar("T")


def _checked(name: str, convert: Callable[[str], T], ok: Callable[[T], bool]) -> Callable[[str], T]:
    """An argparse type: convert, then check; `name` is what the error line calls a valid value."""
    def parse(text: str) -> T:
        value = convert(text)
        if not ok(value):
            raise ValueError(text)
        return value

    parse.__name__ = name
    return parse


# The numeric restart options, part of config.NUMBERS (their one definition: default and range). Bounded
# so that no wait overflows a timer (select refuses ~25 days) and no count is silly: a day, a million.
_D = RestartPolicy()
NUMBERS = {
    "max_restarts": Number(int, 0, 10**6, 0),
    "max_node_restarts": Number(int, 0, 10**6),
    "restart_backoff": Number(float, 0, 86400, _D.backoff_initial, "s"),
    "restart_backoff_max": Number(float, 0, 86400, _D.backoff_cap, "s"),
}
_exit_code = _checked("exit code", int, lambda v: 1 <= v <= 255)


def optional_exit_code(text: str) -> int | None:
    return None if text.strip().lower() in ("none", "off", "") else _exit_code(text)


optional_exit_code.__name__ = "exit code (1-255, or none)"


def add_restart_options(parser: argparse.ArgumentParser) -> None:
    """The restart options, as a group of the main parser (config.build_parser calls this)."""
    d, n = RestartPolicy(), NUMBERS
    g = parser.add_argument_group("restarts (job-wide, decided by the chief; see docs/RESTARTS.md)")
    g.add_argument("--max-restarts", type=n["max_restarts"], default=n["max_restarts"].default, metavar="N",
                   help="restart the whole job on every node at most N times after a failure (default 0: off)")
    g.add_argument("--max-node-restarts", type=n["max_node_restarts"], metavar="N",
                   help="restarts after a lost node, counted apart (default: as many as --max-restarts); the node's "
                   "detlaunch, started again, must join within --start-timeout")
    g.add_argument("--restart-on", type=item_list, default=(), metavar="LIST",
                   help="also restart on these: exit codes, SIGNAMEs, restart classes (user-error, start-failure...) "
                   "or exception classes, comma-separated")
    g.add_argument("--no-restart-on", type=item_list, default=(), metavar="LIST",
                   help="never restart on these (same forms as --restart-on)")
    g.add_argument("--no-restart-exit-code", type=optional_exit_code, default=d.no_restart_exit_code, metavar="N",
                   help=f"a rank exiting with N asks not to be restarted (default {d.no_restart_exit_code}; none: off)")
    g.add_argument("--restart-backoff", type=n["restart_backoff"], default=d.backoff_initial, metavar="S",
                   help=f"wait before the first restart, doubled for each next one (default {d.backoff_initial:g})")
    g.add_argument("--restart-backoff-max", type=n["restart_backoff_max"], default=d.backoff_cap, metavar="S",
                   help=f"the longest wait between attempts (default {d.backoff_cap:g})")


def policy_from_options(options: Mapping[str, Any]) -> RestartPolicy:
    """The policy from parsed options (values as add_restart_options' types give them, or their text)."""
    d = RestartPolicy()

    def get(name: str, convert: Any, default: Any) -> Any:
        value = options.get(name)
        if value is None:
            return default
        if isinstance(value, str):  # from DETLAUNCH_* or a config file, not through the parser
            flag = "--" + name.replace("_", "-")
            try:
                return convert(str(value))
            except argparse.ArgumentTypeError as e:
                raise ConfigError(f"{flag} {value!r}: {e}") from None
            except ValueError:
                raise ConfigError(f"{flag} {value!r} is not a valid {convert.__name__}") from None
        return tuple(value) if convert is item_list else value

    return RestartPolicy(
        max_restarts=get("max_restarts", NUMBERS["max_restarts"], 0),
        max_node_restarts=get("max_node_restarts", NUMBERS["max_node_restarts"], None),
        restart_on=get("restart_on", item_list, ()),
        no_restart_on=get("no_restart_on", item_list, ()),
        no_restart_exit_code=d.no_restart_exit_code if "no_restart_exit_code" not in options
        else get("no_restart_exit_code", optional_exit_code, None),
        backoff_initial=get("restart_backoff", NUMBERS["restart_backoff"], d.backoff_initial),
        backoff_cap=get("restart_backoff_max", NUMBERS["restart_backoff_max"], d.backoff_cap),
    )
