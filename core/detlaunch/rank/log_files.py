"""Log files in --log-dir (each rank's, each launcher's): never written through a link, readable by the job's user
only, unless the directory says its group reads them.

A directory says so when it is setgid (a team's folder: its files take its group), or when it belongs to the job's
user and lets its group read and enter it: the user chose that. Then a new file is 0640 and a new folder 0750;
otherwise 0600 and 0700. A file or folder that is a symlink, or not a plain file or folder, or another user's, is
refused with one line saying so (the console still has every line of output); of folders, only another user's
symlink is refused (yours, to a scratch disk, is followed).

Part of the per-rank wrapper (``python -S``, stdlib only: see wrapper.py); the node's supervisor uses it too.
"""

from __future__ import annotations

import errno
import os

SETGID = 0o2000  # stat.S_ISGID, without importing stat into every rank's wrapper
GROUP_READS = 0o050  # group read and search (stat.S_IRGRP | stat.S_IXGRP)
REGULAR, DIRECTORY, LINK = 0o100000, 0o040000, 0o120000  # stat.S_IFREG, S_IFDIR, S_IFLNK
KIND = 0o170000  # stat.S_IFMT


def group_reads(directory: str) -> bool:
    """Whether `directory` says its group reads the logs in it (see the module's docstring)."""
    try:
        st = os.stat(directory)
    except OSError:
        return False
    return bool(st.st_mode & SETGID) or (st.st_uid == os.getuid() and st.st_mode & GROUP_READS == GROUP_READS)


def make_log_dir(path: str) -> None:
    """Create `path` and its missing parents for logs (0700 each, 0750 under a folder whose group reads the logs);
    OSError with a plain reason when `path` is another user's symlink (your own, to a scratch disk, is followed)
    or not a folder."""
    if not os.path.lexists(path):
        parent = os.path.dirname(os.path.abspath(path))
        if parent != path:
            make_log_dir(parent)
        try:
            os.mkdir(path, 0o750 if group_reads(parent) else 0o700)
        except FileExistsError:  # made meanwhile (another rank's wrapper): checked below
            pass
    st = os.lstat(path)
    if st.st_mode & KIND == LINK and st.st_uid != os.getuid():
        raise OSError(errno.ELOOP, f"{path} is a symlink of uid {st.st_uid}: not followed (detlaunch writes no "
                                   "log through another user's link)")
    if not os.path.isdir(path):
        raise OSError(errno.ENOTDIR, f"{path} is not a directory")


def open_log(path: str) -> int:
    """Open `path` to append to it (created 0600, or 0640 where its folder's group reads the logs): never through
    a symlink, never a FIFO or a device, never another user's file; an existing file that others could read is
    narrowed to that mode. OSError with a plain reason (its strerror) otherwise."""
    mode = 0o640 if group_reads(os.path.dirname(os.path.abspath(path))) else 0o600
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(path, flags, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symlink: not followed (detlaunch writes no log through a link)") \
                from None
        if e.errno == errno.ENXIO:  # a FIFO nobody reads (O_NONBLOCK: no wait)
            raise OSError(errno.ENXIO, "it is a FIFO, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if st.st_mode & KIND != REGULAR:
            raise OSError(errno.EINVAL, "it is not a regular file")
        if st.st_uid != os.getuid():
            raise OSError(errno.EPERM, f"it belongs to uid {st.st_uid}, not to you")
        if st.st_mode & 0o777 & ~mode:
            os.fchmod(fd, mode)
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        raise
    return fd


def reason(e: OSError) -> str:
    """Why a log could not be opened or written: its own words (above), or the system's ("permission denied")."""
    text = e.strerror or os.strerror(e.errno or 0)
    return text[:1].lower() + text[1:]
