"""The heartbeat a training script sends: ``detlaunch.rank.progress(step)``.

Under detlaunch, the rank wrapper creates one small file per rank in the node's private
run dir and names it in DETLAUNCH_PROGRESS_FILE. The first call maps that file; every
call after writes (count, step, monotonic time, wall time) into the mapping with one
``struct.pack_into``: no system call, well under a microsecond. The node's supervisor
reads the file whenever it wants to know whether the rank is still moving.
Without detlaunch (no variable) a call does nothing.

This module is stdlib-only and imports nothing of detlaunch's launcher, so a training
script pays nothing for it; the wrapper (``python -S``) imports it by file for
`create_progress_file`. Training scripts reach it through its public face, ``detlaunch.progress``.

The record is a seqlock with two copies of the counter, written first and last in one
pack_into (which zeroes the record, then stores each field as one aligned 8-byte store, in
order); the reader loads the last copy, then the data, then the first copy, and trusts the
data only when the two copies agree (exact on x86's ordered stores and loads).
"""

from __future__ import annotations

import os
import struct
import sys
import time

ENV = "DETLAUNCH_PROGRESS_FILE"
NO_STEP = -(1 << 63)  # the step stored for progress() without one
# Native byte order and alignment, so each field is one 8-byte store or load.
_RECORD = struct.Struct("@qqddq")  # count (first copy), step, monotonic, wall, count (last copy)
SIZE = 64  # the heartbeat's record, rounded up: what progress() maps
OUTPUT_RECORD = 64  # offset of the second record: the wrapper's time of the rank's last output
ENDED_RECORD = 128  # the third: written once, by the rank's Python, when its script has ended (faultsite)
SECTIONS_OFFSET = 192  # then the table of detlaunch.section()'s figures (rank/sections.py)
SECTION_SLOT = 128  # one section: its name (written once), then its seqlocked figures
MAX_SECTIONS = 32
FILE_SIZE = SECTIONS_OFFSET + MAX_SECTIONS * SECTION_SLOT  # the three records and the sections' table
# How a script ended (OutputMark.script_end), besides "exit N" (sys.exit(N), N != 0):
SCRIPT_FINISHED = "finished"  # it returned (or sys.exit(0)); Python then ran its atexit handlers
SCRIPT_FINALIZING = "finalizing"  # the same, and every atexit handler had run: Python was finalizing
SCRIPT_RAISED = "raised"  # an uncaught exception
ENDED_RAISED, ENDED_FINALIZING = 1 << 8, 1 << 9  # the end record's flags beside the exit code (faultsite)
READ_ATTEMPTS = 100


class Beat:
    """One reading of a rank's heartbeat file (a plain class: dataclasses would cost the wrapper an import)."""

    __slots__ = ("count", "step", "at", "monotonic")

    def __init__(self, count: int, step: int | None, at: float, monotonic: float) -> None:
        self.count = count  # progress() calls so far
        self.step = step  # the step of the last call, if it gave one
        self.at = at  # wall-clock time of the last call (time.time()): comparable across nodes
        self.monotonic = monotonic  # the same moment on this node's monotonic clock

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Beat) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Beat(count={self.count}, step={self.step}, at={self.at}, monotonic={self.monotonic})"

    def _key(self) -> tuple[int, int | None, float, float]:
        return self.count, self.step, self.at, self.monotonic


_DISABLED = False  # a sentinel for _buf: no detlaunch, or the file could not be mapped
_buf: object = None  # None: not looked at yet; a mmap; or _DISABLED
_count = 0
_pack = _RECORD.pack_into
_monotonic = time.monotonic
_time = time.time


def progress(step: int | None = None) -> None:
    """Tell detlaunch this rank is making progress (optionally at which step); a no-op without detlaunch."""
    global _count
    buf = _buf
    if buf is None:
        buf = _open()
    if buf is _DISABLED:
        return
    _count += 1
    _pack(buf, 0, _count, NO_STEP if step is None else int(step), _monotonic(), _time(), _count)  # type: ignore[arg-type]


def _open() -> object:
    """Map the file named by DETLAUNCH_PROGRESS_FILE, once; on any problem, turn heartbeats off."""
    global _buf
    mapped = map_rank_file(SIZE, "heartbeats are off for this process")
    _buf = _DISABLED if mapped is None else mapped
    return _buf


def map_rank_file(size: int, otherwise: str) -> object:
    """The first `size` bytes of the file named by DETLAUNCH_PROGRESS_FILE, mapped for writing; None without
    detlaunch, or (said once on stderr, with `otherwise`) when it cannot be mapped."""
    path = os.environ.get(ENV)
    if not path:
        return None
    import mmap

    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
    except (OSError, ValueError) as e:
        print(f"detlaunch: cannot map the progress file {path} ({e}): {otherwise}", file=sys.stderr)
        return None


def _forget_in_child() -> None:
    # A forked child (a DataLoader worker) is not the rank: its calls must not count as the rank's.
    global _buf
    _buf = _DISABLED


os.register_at_fork(after_in_child=_forget_in_child)


def progress_path(directory: str, rank: int) -> str:
    """Where rank's heartbeat file lives in its node's run dir (the supervisor reads it there)."""
    return os.path.join(directory, f"progress-{rank}")


def create_progress_file(directory: str, rank: int) -> str:
    """Create rank's heartbeat file in the node's private run dir (0600, fresh, sized); return its path.

    For the rank wrapper, before it starts the rank. A file left by an earlier attempt of the
    same rank is replaced; O_EXCL|O_NOFOLLOW makes sure the one we size is the one we made.
    """
    path = progress_path(directory, rank)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        os.unlink(path)
        fd = os.open(path, flags, 0o600)
    try:
        os.ftruncate(fd, FILE_SIZE)  # zeros: count 0, no beat yet
    finally:
        os.close(fd)
    return path


class OutputMark:
    """The wrapper's half of "progress is any output line": the monotonic time of the rank's last
    output, written into the file's second record (the same seqlock) on every read of its pipes.

    One pack_into, no system call: the wrapper's throughput does not change.
    """

    def __init__(self, path: str) -> None:
        import mmap

        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self.buf = mmap.mmap(fd, FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.count = 0

    def touch(self) -> None:
        self.count += 1
        _pack(self.buf, OUTPUT_RECORD, self.count, NO_STEP, _monotonic(), _time(), self.count)

    def script_end(self) -> str:
        """How the rank's script ended (see `script_end`), read by the wrapper once the rank has exited."""
        return _script_end(self.buf[ENDED_RECORD:ENDED_RECORD + _RECORD.size])


def script_end(path: str) -> str:
    """How the rank's script ended, if its Python got as far as shutting down (faultsite/sitecustomize.py
    marks it in the file's third record): SCRIPT_FINISHED, SCRIPT_FINALIZING (finished, and its atexit
    handlers too), SCRIPT_RAISED (an uncaught exception), "exit N" (sys.exit(N)), or '' (no mark: its script
    runs, it died before its end, left by os._exit or exec, or DETLAUNCH_FAULTHANDLER=0)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return _script_end(os.pread(fd, _RECORD.size, ENDED_RECORD))
    except OSError:
        return ""
    finally:
        os.close(fd)


def _script_end(record: bytes) -> str:
    """The end record: written once, with one pwrite; whole when both counter copies are 1."""
    if len(record) != _RECORD.size:
        return ""
    first, how, _monotonic, _wall, last = _RECORD.unpack(record)
    if first != 1 or last != 1:
        return ""
    if how & ENDED_RAISED:
        return SCRIPT_RAISED
    if how & 0xFF:
        return f"exit {how & 0xFF}"
    return SCRIPT_FINALIZING if how & ENDED_FINALIZING else SCRIPT_FINISHED


def read_progress(path: str, record: int = 0) -> Beat | None:
    """The rank's last heartbeat; None when there is none yet, the file is missing or short, or no
    whole record could be read (the rank stopped in the middle of a write): keep the previous reading.
    record: 0 for the heartbeat, OUTPUT_RECORD for the wrapper's time of the last output.

    A read that races a write sees the two counter copies disagree and is retried.
    """
    import mmap

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < record + SIZE:
            return None
        buf = mmap.mmap(fd, record + SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    with buf, memoryview(buf)[record:] as view, view.cast("q") as q, view.cast("d") as d:
        for _ in range(READ_ATTEMPTS):  # _RECORD in 8-byte slots: first, step, monotonic, wall, last
            last = q[4]  # written last; then the data; then the copy written first
            step, mono, wall = q[1], d[2], d[3]
            first = q[0]
            if first == last != 0:  # 0 in both: no beat yet, or pack_into's zeroing caught mid-write
                return Beat(last, None if step == NO_STEP else step, wall, mono)
    return None
