"""Timed sections of a training script: ``with detlaunch.section("step"): ...`` (or ``@detlaunch.section("fwd")``).

A straggler hides in a synchronous job: every rank's step takes as long as the slowest one's, the
fast ranks waiting in the collective. A section times the work a script wraps (not the wait), so
the chief can compare the ranks' work and name the slow one (observe/stragglers.py).

Each section's cumulative figures (calls, total seconds, the last call's seconds) live in a slot
of the rank's progress file (rank/progress.py: the table after its three records): the first use
of a name writes the name into the next free slot (its length last, so a reader never sees half a
name); every call after writes the figures with one ``struct.pack_into`` into the mapping, a
seqlock as the heartbeat's: no system call, about a microsecond a call. The supervisor reads the
table (`read_sections`) when the chief asks. Without detlaunch (no DETLAUNCH_PROGRESS_FILE) a
section does nothing but call what it wraps. A forked child (a DataLoader worker) does not count.

Stdlib only, like progress.py: a training script pays nothing for importing it.
"""

from __future__ import annotations

import functools
import os
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from detlaunch.rank.progress import FILE_SIZE, MAX_SECTIONS, SECTION_SLOT, SECTIONS_OFFSET, map_rank_file

_NAME = struct.Struct("@q56s")  # the name's length (written last), its UTF-8 bytes
_FIGURES = struct.Struct("@qddq")  # calls (first copy), total seconds, last call's seconds, calls (last copy)
_Q, _D = struct.Struct("@q"), struct.Struct("@d")
FIGURES_AT = 64  # the figures' offset in a slot
NAME_BYTES = 56
READ_ATTEMPTS = 100
F = TypeVar("F", bound=Callable[..., Any])

_DISABLED = False
_buf: Any = None  # None: not looked at yet; a mmap; or _DISABLED
_slots: dict[str, list[Any]] = {}  # name -> [offset of its figures, calls, total]
_pack = _FIGURES.pack_into
_clock = time.perf_counter


class section:  # noqa: N801 - used as a function: detlaunch.section("step")
    """Time what runs inside it as the section `name` of this rank; also a decorator."""

    __slots__ = ("name", "_start")

    def __init__(self, name: str) -> None:
        self.name = name
        self._start = 0.0

    def __enter__(self) -> section:
        self._start = _clock()
        return self

    def __exit__(self, kind: object, error: object, tb: object) -> None:
        took = _clock() - self._start
        slot = _slots.get(self.name)
        if slot is None:
            if _buf is _DISABLED:  # without detlaunch: nothing more than this
                return
            slot = _new_slot(self.name)
            if slot is None:
                return
        calls = slot[1] = slot[1] + 1
        total = slot[2] = slot[2] + took
        _pack(_buf, slot[0], calls, total, took, calls)

    def __call__(self, func: F) -> F:
        name = self.name

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with section(name):
                return func(*args, **kwargs)

        return timed  # type: ignore[return-value]


def _new_slot(name: str) -> list[Any] | None:
    """The first call of a section `name`: its slot in the file, or None (no detlaunch, the table is full)."""
    buf = _buf if _buf is not None else _open()
    if buf is _DISABLED:
        return None
    if len(_slots) >= MAX_SECTIONS:
        if len(_slots) == MAX_SECTIONS:
            print(f"detlaunch: more than {MAX_SECTIONS} section names: {name!r} and later ones are not timed",
                  file=sys.stderr)
            _slots[""] = [0, 0, 0.0]  # said once
        return None
    offset = SECTIONS_OFFSET + len(_slots) * SECTION_SLOT
    encoded = name.encode("utf-8", "replace")[:NAME_BYTES].decode("utf-8", "ignore").encode()
    buf[offset + 8:offset + 8 + len(encoded)] = encoded
    struct.pack_into("@q", buf, offset, len(encoded) or -1)  # last: a reader sees the whole name or none
    slot = _slots[name] = [offset + FIGURES_AT, 0, 0.0]
    return slot


def _open() -> Any:
    """Map the rank's progress file, once; on any problem sections are off for this process."""
    global _buf
    mapped = map_rank_file(FILE_SIZE, "sections are not timed in this process")
    _buf = _DISABLED if mapped is None else mapped
    return _buf


def _forget_in_child() -> None:
    global _buf
    _buf = _DISABLED


os.register_at_fork(after_in_child=_forget_in_child)


def read_sections(path: str) -> dict[str, tuple[int, float]]:
    """{name: (calls, total seconds)} of a rank's sections, from its progress file; {} when there are none.

    A slot caught mid-write is retried until its two counter copies agree (see progress.read_progress).
    """
    import mmap

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        if os.fstat(fd).st_size < FILE_SIZE:
            return {}
        buf = mmap.mmap(fd, FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    found: dict[str, tuple[int, float]] = {}
    with buf:
        for i in range(MAX_SECTIONS):
            offset = SECTIONS_OFFSET + i * SECTION_SLOT
            length, raw = _NAME.unpack_from(buf, offset)
            if length == 0:
                break  # slots are taken in order: the rest are free
            name = raw[:max(length, 0)].decode("utf-8", "replace")
            at = offset + FIGURES_AT
            for _ in range(READ_ATTEMPTS):  # the copy written last, then the data, then the one written first
                last = _Q.unpack_from(buf, at + 24)[0]
                total = _D.unpack_from(buf, at + 8)[0]
                first = _Q.unpack_from(buf, at)[0]
                if first == last:
                    if first:
                        found[name] = (first, total)
                    break
    return found
