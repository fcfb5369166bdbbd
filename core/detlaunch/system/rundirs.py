"""Private run dirs (``$TMPDIR/detlaunch-<random>``) that say whether their owner is alive.

A SIGKILLed detlaunch cannot remove its run dir and socket. Each run dir therefore holds a
lock file that its supervisor flocks for its whole life; the kernel drops the lock when the
process dies, however it dies. The next detlaunch of the same user removes the dirs whose
lock is free: no pid files (pids are reused), no timeouts, no guessing.

No race: a run dir appears at its final name only once its lock is held (it is made under a
hidden name, locked, then renamed into place), and a dir is removed only while the remover
holds its lock. Only dirs named like ours, owned by this uid, mode 0700, are considered.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat

from detlaunch.system.safefs import random_hex

LOCK_NAME = "owner.lock"
RUN_DIR_NAME = re.compile(r"detlaunch-[0-9a-f]{16}")


class RunDir:
    """A run dir and the lock that marks it in use; close() releases it (the dir stays until removed)."""

    def __init__(self, path: str, lock_fd: int) -> None:
        self.path = path
        self.lock_fd: int | None = lock_fd

    def close(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def create_run_dir(path: str) -> RunDir:
    """Make `path` (0700) holding a held lock; fails (FileExistsError) if anything sits at `path`."""
    parent, name = os.path.split(path)
    staging = os.path.join(parent, f".{name}.{random_hex(4)}")
    os.mkdir(staging, 0o700)
    try:
        fd = os.open(os.path.join(staging, LOCK_NAME),
                     os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.path.lexists(path):  # rename() would replace an empty dir planted there
            raise FileExistsError(17, "File exists", path)
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return RunDir(path, fd)


def remove_stale_run_dirs(tmpdir: str) -> list[str]:
    """Remove this user's run dirs in `tmpdir` whose owner is gone; return the paths removed."""
    try:
        names = os.listdir(tmpdir)
    except OSError:
        return []
    removed = []
    for name in names:
        if RUN_DIR_NAME.fullmatch(name) and _remove_if_stale(os.path.join(tmpdir, name)):
            removed.append(os.path.join(tmpdir, name))
    return removed


def _remove_if_stale(path: str) -> bool:
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # gone, a symlink, not a dir, not ours to open
    try:
        st = os.fstat(dir_fd)
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700:
            return False
        try:
            lock_fd = os.open(LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            return False  # no lock file: not made by create_run_dir, so we cannot tell; leave it
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            return False  # its owner is alive
        try:
            if os.stat(path, follow_symlinks=False).st_ino != st.st_ino:
                return False  # replaced meanwhile
            shutil.rmtree(path, ignore_errors=True)  # fd-based: never follows a symlink inside
        finally:
            os.close(lock_fd)
        return not os.path.lexists(path)
    finally:
        os.close(dir_fd)
