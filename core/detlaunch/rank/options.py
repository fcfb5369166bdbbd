"""The wrapper's argv, parsed by hand (argparse alone costs more than the rest), and the rank it wraps.

Part of the per-rank wrapper (``python -S``, stdlib only: see wrapper.py).
"""

from __future__ import annotations

try:  # imported as detlaunch.rank.options
    from . import protocol as rank_protocol
except ImportError:  # by file, from the wrapper's folder (python -S run_wrapper.py)
    import protocol as rank_protocol  # type: ignore[no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:  # never at run time: the typing module alone costs about 1 MB
    from collections.abc import Mapping
    from typing import Any

DEFAULT_RANK_ENV = ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "DETLAUNCH_RANK")


class UsageError(Exception):
    """The wrapper cannot run (bad argv, no rank, no supervisor, refused): one line, exit code 2."""


def parse_args(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Parse the wrapper's small argv by hand (argparse alone costs more than the rest)."""
    opts: dict[str, Any] = {"rank": None, "rank_env": DEFAULT_RANK_ENV, "job": "", "console": None,
                            "log_dir": None, "grace": rank_protocol.DEFAULT_GRACE,
                            "prefix": rank_protocol.DEFAULT_PREFIX}
    i = 0
    while i < len(argv) and argv[i] != "--":
        key = argv[i]
        if i + 1 >= len(argv):
            raise UsageError(f"{key} needs a value")
        value = argv[i + 1]
        if key == "--rank":
            opts["rank"] = value
        elif key == "--rank-env":
            opts["rank_env"] = tuple(v for v in value.split(",") if v)
        elif key == "--job":
            opts["job"] = value
        elif key == "--console-ranks":
            opts["console"] = {int(r) for r in value.split(",") if r}
        elif key == "--log-dir":
            opts["log_dir"] = value
        elif key == "--grace":
            opts["grace"] = float(value)
        elif key == "--prefix":
            opts["prefix"] = value
        else:
            raise UsageError(f"unknown option {key}")
        i += 2
    command = argv[i + 1:]
    if not command:
        raise UsageError("no command given after --")
    return opts, command


def find_rank(explicit: str | None, names: tuple[str, ...], env: Mapping[str, str]) -> int:
    if explicit is not None:
        return int(explicit)
    for name in names:
        value = env.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    raise UsageError(f"cannot tell this process's rank: none of {', '.join(names)} is set")
