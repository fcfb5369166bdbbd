"""A file whose read a SIGKILL cannot end: a thread stuck in a driver, without a GPU.

A FUSE file system served by a thread of the test (the kernel's protocol over /dev/fuse, as root): a
read of its one file, `stuck`, is answered only `hold` seconds after it came in. Once the server has
taken a request, the reading task waits for the answer uninterruptibly, SIGKILL or not (the kernel's
fuse request_wait_answer), as a thread inside the NVIDIA driver does: a rank killed meanwhile is a
zombie leader whose thread still lives. Closing /dev/fuse (the test's end, or the test process dying)
aborts the connection and frees any reader, so nothing is left stuck.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

LOOKUP, FORGET, GETATTR, OPEN, READ, RELEASE, FLUSH, INIT, INTERRUPT, DESTROY, BATCH_FORGET = \
    1, 2, 3, 14, 15, 18, 25, 26, 36, 38, 42
NO_REPLY = {FORGET, BATCH_FORGET, INTERRUPT}  # the kernel waits for no answer to these
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # ino size blocks [amc]time [amc]timensec mode nlink uid gid rdev blksize ...
ENTRY = struct.Struct("<QQQQII")  # nodeid generation entry_valid attr_valid entry_valid_nsec attr_valid_nsec
ATTR_OUT = struct.Struct("<QII")  # attr_valid attr_valid_nsec dummy
OPEN_OUT = struct.Struct("<QIi")  # fh open_flags backing_id
INIT_IN = struct.Struct("<IIII")  # major minor max_readahead flags
INIT_OUT = struct.Struct("<IIIIHHIIHHIIH22x")  # ... max_write time_gran max_pages map_alignment flags2 ...
READ_IN = struct.Struct("<QQI")  # fh offset size
FOPEN_DIRECT_IO = 1  # every read reaches the server: none is served from the page cache
ROOT, FILE, NAME = 1, 2, b"stuck"
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2

_libc = ctypes.CDLL(None, use_errno=True)

# The suite runs as root; a container without /dev/fuse cannot serve the file.
needs_fuse = pytest.mark.skipif(not os.path.exists("/dev/fuse") or os.getuid() != 0,
                                reason="a stuck read needs FUSE (/dev/fuse) and root")


class StuckFile:
    """Mounted at `mount`; `path` is the file. Each read is held `hold` seconds from its arrival; the first
    one's arrival makes the file `arrived` (beside the mount), for a process that must know it waits."""

    def __init__(self, mount: Path, hold: float) -> None:
        self.mount, self.hold = mount, hold
        self.path = mount / NAME.decode()
        self.arrived = mount.parent / f"{mount.name}.read"
        self.read_at: float | None = None  # time.time() the first read came in
        self.answered_at: float | None = None  # ... and was answered
        self._held: list[tuple[float, int]] = []  # (due, unique)
        self._stop = False
        mount.mkdir(parents=True, exist_ok=True)
        self.fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        options = f"fd={self.fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
        if _libc.mount(b"detlaunch-test", str(mount).encode(), b"fuse", MS_NOSUID | MS_NODEV, options) != 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, f"mount fuse on {mount}: {os.strerror(err)}")
        self.thread = threading.Thread(target=self._serve, name="stuck-fs", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Answer what is held, unmount, and close /dev/fuse (whatever still waits is freed)."""
        self._stop = True
        self.thread.join(5)
        _libc.umount2(str(self.mount).encode(), MNT_DETACH)
        os.close(self.fd)

    # -- the server ---------------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            now = time.time()
            for due, unique in [h for h in self._held if h[0] <= now or self._stop]:
                self._held.remove((due, unique))
                self._reply(unique, b"x" * 16)
                self.answered_at = time.time()
            if self._stop:
                return
            if not select.select([self.fd], [], [], 0.02)[0]:
                continue
            try:
                request = os.read(self.fd, 1 << 17)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.EINTR, errno.EAGAIN):  # a request interrupted before it was read
                    continue
                return  # ENODEV: unmounted
            self._handle(request)

    def _handle(self, request: bytes) -> None:
        _, opcode, unique, node, *_ = IN_HEADER.unpack_from(request)
        body = request[IN_HEADER.size:]
        if opcode in NO_REPLY:
            return
        if opcode == INIT:
            major, minor, readahead, _flags = INIT_IN.unpack_from(body)
            self._reply(unique, INIT_OUT.pack(7, 31, readahead, 0, 1, 1, 4096, 1, 0, 0, 0, 0, 0))
        elif opcode == LOOKUP and node == ROOT and body.rstrip(b"\0") == NAME:
            self._reply(unique, ENTRY.pack(FILE, 0, 1, 1, 0, 0) + self._attr(FILE))
        elif opcode == GETATTR and node in (ROOT, FILE):
            self._reply(unique, ATTR_OUT.pack(1, 0, 0) + self._attr(node))
        elif opcode == OPEN and node == FILE:
            self._reply(unique, OPEN_OUT.pack(1, FOPEN_DIRECT_IO, 0))
        elif opcode == READ:
            if self.read_at is None:
                self.read_at = time.time()
                self.arrived.touch()
            self._held.append((time.time() + self.hold, unique))
        elif opcode in (FLUSH, RELEASE, DESTROY):
            self._reply(unique, b"")
        else:
            self._reply(unique, b"", -(errno.ENOENT if opcode == LOOKUP else errno.ENOSYS))

    @staticmethod
    def _attr(node: int) -> bytes:
        mode, nlink, size = (0o40755, 2, 0) if node == ROOT else (0o100444, 1, 1 << 20)
        return ATTR.pack(node, size, 0, 0, 0, 0, 0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0)

    def _reply(self, unique: int, data: bytes, error: int = 0) -> None:
        try:
            os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(data), error, unique) + data)
        except OSError:
            pass  # the request was interrupted and dropped meanwhile (ENOENT)


@contextlib.contextmanager
def stuck_file(mount: Path, hold: float) -> Iterator[StuckFile]:
    fs = StuckFile(mount, hold)
    try:
        yield fs
    finally:
        fs.close()
