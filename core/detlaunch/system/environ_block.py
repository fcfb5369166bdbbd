"""A value taken out of this process's environment for good: os.environ, and the block /proc/PID/environ shows.

/proc/PID/environ is not os.environ: it is the memory the kernel laid out when the process was exec'd, and a
fork keeps it. The node's supervisor is a fork of detlaunch and pid 1 of the job's PID namespace, where any rank
(the same user) can read /proc/1/environ: a job secret given in the environment (DETLAUNCH_JOB_SECRET, set by
the user or a scheduler) would be there for every rank to read. So detlaunch takes it out at its start, before
it forks anything: unset (libc no longer points into the block), then its value overwritten with NUL bytes in
the block itself, as setproctitle(3) overwrites the arguments' block.
"""

from __future__ import annotations

import ctypes
import os


def take_out(name: str) -> str | None:
    """Remove `name` from os.environ and blank its value in this process's initial environment block; its value,
    or None when it was not set. A block that cannot be read or written (a kernel without the fields) leaves
    os.environ's removal alone in force."""
    value = os.environ.pop(name, None)
    if value is not None:
        blank_in_block(name)
    return value


def blank_in_block(name: str) -> bool:
    """Overwrite every `name=VALUE` entry's VALUE in the initial environment block with NUL bytes; whether one was."""
    start, end = _block()
    if not start or end <= start:
        return False
    block = ctypes.string_at(start, end - start)
    key, found = name.encode() + b"=", False
    at = 0
    while at < len(block):
        stop = block.find(b"\0", at)
        stop = len(block) if stop < 0 else stop
        if block.startswith(key, at):
            ctypes.memset(start + at + len(key), 0, stop - at - len(key))
            found = True
        at = stop + 1
    return found


def _block() -> tuple[int, int]:
    """(env_start, env_end) of this process, from /proc/self/stat (fields 50 and 51); (0, 0) when unknown."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold anything
        return int(fields[47]), int(fields[48])  # field N is fields[N - 3]
    except (OSError, ValueError, IndexError):
        return 0, 0
