"""The restart options: detlaunch's flags (and their DETLAUNCH_* variables and config-file keys) that
make a RestartPolicy, checked here in one clear line each. Pure: no I/O.
"""

from __future__ import annotations

import argparse
import re
import signal as signals
from collections.abc import Mapping
from typing import Any

import detlaunch.exit_codes as exit_codes
from detlaunch.errors import ConfigError
from detlaunch.numbers import Number
from detlaunch.options import Option, OptionGroup, numbers_of
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


# How long the next attempt may wait for the last one's processes and GPU memory (node/release_wait.py).
RELEASE_TIMEOUT = 50.0
# Bounded so that no wait overflows a timer (select refuses ~25 days) and no count is silly: a day, a million.
_D = RestartPolicy()
RESTARTS = OptionGroup("restarts (job-wide, decided by the chief; see docs/RESTARTS.md)", (
    Option("--max-restarts", type=Number(int, 0, 10**6, 0), metavar="N",
           help="restart the whole job on every node at most N times after a failure (default 0: off)"),
    Option("--max-node-restarts", type=Number(int, 0, 10**6), metavar="N",
           help="restarts after a lost node, counted apart (default: as many as --max-restarts); the node's "
           "detlaunch, started again, must join within --start-timeout"),
    Option("--restart-on", type=item_list, default=(), metavar="LIST",
           help="also restart on these: exit codes, SIGNAMEs, restart classes (user-error, start-failure...) "
           "or exception classes, comma-separated"),
    Option("--no-restart-on", type=item_list, default=(), metavar="LIST",
           help="never restart on these (same forms as --restart-on)"),
    Option("--no-restart-exit-code", type=Number(int, 1, 255, _D.no_restart_exit_code, off=("none", "off", "")),
           metavar="N", help=f"a rank exiting with N asks not to be restarted (default {_D.no_restart_exit_code}; "
           "none: off)"),
    Option("--restart-backoff", type=Number(float, 0, 86400, _D.backoff_initial, "s"), metavar="S",
           help=f"wait before the first restart, doubled for each next one (default {_D.backoff_initial:g})"),
    Option("--restart-backoff-max", type=Number(float, 0, 86400, _D.backoff_cap, "s"), metavar="S",
           help=f"the longest wait between attempts (default {_D.backoff_cap:g})"),
    Option("--release-timeout", type=Number(float, 0, 86400, RELEASE_TIMEOUT, "s"), metavar="S", supervision=True,
           help="before the next attempt, wait at most S seconds for every thread of the last attempt's processes "
           "to end and, where nvidia-smi is found, for their GPU memory to be freed; then start it anyway "
           f"(default {RELEASE_TIMEOUT:g}, as NVIDIA's resiliency extension; 0: do not wait)"),
))
NUMBERS = numbers_of([RESTARTS])


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
        else get("no_restart_exit_code", NUMBERS["no_restart_exit_code"], None),
        backoff_initial=get("restart_backoff", NUMBERS["restart_backoff"], d.backoff_initial),
        backoff_cap=get("restart_backoff_max", NUMBERS["restart_backoff_max"], d.backoff_cap),
    )
