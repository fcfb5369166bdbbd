"""A Python launcher started ahead of time, past its imports: the next attempt's launcher without them.

A launcher such as torchrun spends most of its start importing (torch: 1-2 s a start); bare torchrun
keeps its agent between restarts, detlaunch starts a new one for each attempt. A Command with
``standby="pkg.module:function"`` (its argv ``python -m pkg.module ARGS...``) lets the supervisor
start, while an attempt runs, ``python -c STANDBY FD pkg.module:function``: it imports pkg.module,
then blocks reading its go on FD (an inherited pipe; stdin stays /dev/null). When the command is
due, the supervisor writes the argv to it and the standby calls ``function()`` with ``sys.argv =
[pkg.module, ARGS...]``, as ``python -m pkg.module ARGS...`` (or the module's console script) would.
EOF on FD (the job ends, no restart) ends it with 0, having run nothing.

Same environment, same interpreter, same working directory: a standby is used only for a command
whose argv and environment are the ones it was started for; otherwise it is stopped and the command
starts cold, as without one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Mapping

from detlaunch.system import procs

# Run by the standby's interpreter: `python -c STANDBY FD module:function`. Only its go comes on FD.
STANDBY = """\
import importlib, json, os, sys
fd, entry = int(sys.argv[1]), sys.argv[2]
module_name, _, function = entry.partition(":")
module = importlib.import_module(module_name)
with os.fdopen(fd, "rb") as go:
    line = go.readline()
if not line:
    sys.exit(0)
sys.argv = json.loads(line)["argv"]
del go, line, fd, entry
sys.exit(getattr(module, function)())
"""


def entry_argv(argv: tuple[str, ...], entry: str) -> list[str] | None:
    """The sys.argv the entry point sees for a command `argv` (`python -m module ARGS`); None: not that shape."""
    module = entry.partition(":")[0]
    if len(argv) < 3 or argv[1:3] != ("-m", module):
        return None
    return [module, *argv[3:]]


@dataclasses.dataclass
class Standby:
    """One idle launcher: its pid, the pipe that starts it, and what it was started for."""

    pid: int
    output_fd: int
    go_fd: int | None
    argv: tuple[str, ...]
    env: dict[str, str]
    entry: str

    @classmethod
    def spawn(cls, argv: tuple[str, ...], env: Mapping[str, str], entry: str) -> Standby | None:
        """Start the standby for a command (None: its argv is not `python -m module ...`)."""
        if entry_argv(argv, entry) is None:
            return None
        go_r, go_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            os.set_inheritable(go_r, True)  # only this one child gets it: spawn forks right here
            pid = procs.spawn((argv[0], "-c", STANDBY, str(go_r), entry), env, output_fd=out_w)
        except BaseException:
            for fd in (go_w, out_r):
                os.close(fd)
            raise
        finally:
            os.close(go_r)
            os.close(out_w)
        return cls(pid, out_r, go_w, tuple(argv), dict(env), entry)

    def fits(self, argv: tuple[str, ...], env: Mapping[str, str]) -> bool:
        """It was started for exactly this command, and still waits."""
        return self.go_fd is not None and tuple(argv) == self.argv and dict(env) == self.env

    def go(self) -> bool:
        """Run the command in it now; False: it is gone (the caller starts the command cold)."""
        assert self.go_fd is not None
        message = json.dumps({"argv": entry_argv(self.argv, self.entry)}).encode() + b"\n"
        try:
            os.write(self.go_fd, message)  # far below PIPE_BUF: all or nothing
        except OSError:  # EPIPE: it died idle
            return False
        finally:
            os.close(self.go_fd)
            self.go_fd = None
        return True

    def stop(self) -> None:
        """Not needed after all: SIGKILL it (it runs nothing) and let it be reaped."""
        if self.go_fd is not None:
            os.close(self.go_fd)
            self.go_fd = None
        os.close(self.output_fd)
        procs.signal_pid(self.pid, signal.SIGKILL)
