"""The per-rank wrapper: one small process in front of each rank.

It plays the seed's pid_client and wrap_rank roles in one process:

- registers with its node's supervisor over a Unix socket and reports the rank's
  exit status (with the last lines of its stderr) before it exits;
- runs the rank in its own process group and forwards signals to it (to the rank's own process
  first: stopping.py says how a rank is stopped, and when it gets no grace period);
- prefixes every stdout/stderr line with ``[rank=N] `` or the node's --prefix (``\\r`` ends a line too,
  so progress bars work), keeps the two streams apart, passes bytes through
  unchanged, and splits lines longer than PIPE_BUF so no write is ever torn;
- when the supervisor's connection drops (the supervisor was killed), stops the rank.

It is started as ``python -S run_wrapper.py`` and imports only a few stdlib
modules: it runs once per rank, so its start-up time and memory are the job's.
The argv is::

    run_wrapper.py [--rank N | --rank-env VAR,VAR] [--job ID] [--console-ranks 0,1]
                    [--log-dir DIR] [--grace S] [--prefix TEMPLATE] -- COMMAND...

The supervisor socket comes from the environment: DETLAUNCH_SSHD_SUPERVISOR
(set by a node's own sshd, so ranks that arrive over ssh find their node's
supervisor) wins over DETLAUNCH_SUPERVISOR. Without either, the wrapper only
prefixes output.

The wrapper's parts, each a module of this folder: options.py (its argv, the rank), connection.py
(the supervisor socket), output.py (prefixed lines, the console and the log file) and
wrapped_rank.py (the rank's process and the loop that watches it), stopping.py (how it is asked to
stop). Each is importable as
``detlaunch.rank.NAME`` and, when run as a script, by file from this folder (sys.path[0]).
"""

from __future__ import annotations

import _socket as socket  # the C module under socket: the same calls, without its enum wrappers (~1 MB)
import os
import sys

try:  # imported as detlaunch.rank.wrapper
    from .connection import SupervisorConnection
    from .options import UsageError, find_rank, parse_args
    from .output import RankLog
    from .wrapped_rank import WrappedRank
except ImportError:  # run as a script (python -S run_wrapper.py): its folder is sys.path[0]
    from connection import SupervisorConnection  # type: ignore[no-redef]
    from options import UsageError, find_rank, parse_args  # type: ignore[no-redef]
    from output import RankLog  # type: ignore[no-redef]
    from wrapped_rank import WrappedRank  # type: ignore[no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:  # never at run time: the typing module alone costs about 1 MB
    from typing import Any

    from .progress import OutputMark


def sibling(name: str) -> Any:
    """A module next to this one (progress, faultdump, flightrec), imported only where a rank has a supervisor
    (a wrapper that only prefixes output never loads them): as detlaunch.NAME, or by file as a script."""
    return __import__(f"{__package__}.{name}" if __package__ else name, fromlist=["_"])


def watch_progress(run_dir: str, rank: int) -> OutputMark | None:
    """The rank's progress file in its node's run dir, named in DETLAUNCH_PROGRESS_FILE for
    detlaunch.rank.progress(); None (no hang watch for this rank) when it cannot be made."""
    progress = sibling("progress")
    try:
        path = progress.create_progress_file(run_dir, rank)
        mark = progress.OutputMark(path)
    except (OSError, ValueError) as e:
        os.write(2, f"detlaunch rank wrapper: warning: no progress file for rank {rank}: {e}\n".encode())
        return None
    os.environ[progress.ENV] = path
    return mark  # type: ignore[no-any-return]


def offer_faulthandler(run_dir: str, rank: int) -> None:
    """Let the rank's Python register faulthandler for detlaunch's stack fallback (faultdump.py), so its
    stack can be had when py-spy cannot read it; without the file there is no fallback for this rank."""
    try:
        sibling("faultdump").prepare(run_dir, rank, os.environ)
    except OSError as e:
        os.write(2, f"detlaunch rank wrapper: warning: no faulthandler file for rank {rank}: {e}\n".encode())


def offer_flight_recorder(run_dir: str, rank: int) -> None:
    """torch's Flight Recorder on in the rank, and its FIFO for detlaunch's questions (flightrec.py): the
    thread that answers them lives in detlaunch's sitecustomize, so only where that runs (faultdump's file)."""
    try:
        listener = bool(os.environ.get(sibling("faultdump").ENV))  # the sitecustomize will run in the rank
        sibling("flightrec").prepare(run_dir, rank, os.environ, listener=listener)
    except OSError as e:
        os.write(2, f"detlaunch rank wrapper: warning: no flight recorder FIFO for rank {rank}: {e}\n".encode())


def main(argv: list[str] | None = None) -> int:
    try:
        opts, command = parse_args(sys.argv[1:] if argv is None else argv)
        rank = find_rank(opts["rank"], opts["rank_env"], os.environ)
        return wrap(rank, command, opts)
    except (UsageError, ValueError) as e:
        os.write(2, f"detlaunch rank wrapper: error: {e}\n".encode())
        return 2
    except FileNotFoundError as e:
        os.write(2, f"detlaunch rank wrapper: error: command not found: {e.filename}\n".encode())
        return 127


def wrap(rank: int, command: list[str], opts: dict[str, Any]) -> int:
    """Register with this node's supervisor (when there is one), take its settings, and run the rank."""
    path = os.environ.get("DETLAUNCH_SSHD_SUPERVISOR") or os.environ.get("DETLAUNCH_SUPERVISOR")
    supervisor, console_fds, node = SupervisorConnection.connect(path, opts["job"], rank)
    # Where logs go and which ranks reach the console are this node's settings: a rank that
    # arrived over ssh carries the chief's argv, its node's supervisor knows better.
    console_ranks = node.get("console_ranks", opts["console"])
    console = None if console_ranks is not None and rank not in console_ranks else console_fds
    log_dir = node.get("log_dir", opts["log_dir"])
    # This attempt's variables (DETLAUNCH_RESTART_COUNT...), over any a launcher set (torchrun's own count).
    os.environ.update({str(k): str(v) for k, v in (node.get("env") or {}).items()})
    # Variables the rank gets where its environment does not have them (planning/rank_defaults.py).
    for key, value in (node.get("defaults") or {}).items():
        os.environ.setdefault(str(key), str(value))
    warning = sibling("affinity").bind_from_environment(os.environ)
    if warning:
        os.write(console_fds[1], warning.encode())
    log = RankLog(log_dir, rank, warn_fd=console_fds[1])
    prefix = str(node.get("prefix") or opts["prefix"]).format(
        rank=rank, node=node.get("node", ""), host=node.get("host") or socket.gethostname())
    wrapper = WrappedRank(rank, command, supervisor, console, log, opts["grace"], prefix.encode())
    wrapper.hold = float(node.get("hold") or 0)
    wrapper.strict_teardown = bool(node.get("strict_teardown"))
    wrapper.template = str(node.get("template") or "")
    wrapper.not_progress = tuple(str(text).encode() for text in node.get("not_progress") or () if text)
    if supervisor and path:
        wrapper.output_mark = watch_progress(os.path.dirname(path), rank)
        offer_faulthandler(os.path.dirname(path), rank)
        offer_flight_recorder(os.path.dirname(path), rank)
    return wrapper.run()


if __name__ == "__main__":
    sys.exit(main())
