"""Files and directories only the job's user can touch, safe against planted symlinks.

The seed kept its pid_server socket and hostfile at predictable /tmp paths; anyone on the
machine could have put something there first. Here: random names in shared temp dirs,
0700 directories checked for ownership, files created with O_EXCL|O_NOFOLLOW and renamed
into place, and reads that refuse a symlink or a file others can write.
"""

from __future__ import annotations

import os
import stat

from detlaunch.errors import LaunchError


def random_hex(nbytes: int) -> str:
    """secrets.token_hex(nbytes), the same os.urandom, without importing secrets: it imports hmac, and so
    OpenSSL's libcrypto (~3 MB in every process of the job that has it)."""
    return os.urandom(nbytes).hex()


def ensure_private_dir(path: str) -> None:
    """Create `path` (and missing parents) as 0700; refuse an existing one that is not private."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise LaunchError(f"{path} is a symlink or not a directory: refusing to use it for the job's files")
    if st.st_uid != os.getuid():
        raise LaunchError(f"{path} belongs to uid {st.st_uid}, not to you: choose another --job-dir")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours, but too open (an old umask): tighten it


def write_private_file(path: str, content: str | bytes, mode: int = 0o600) -> None:
    """Write atomically: a fresh O_EXCL|O_NOFOLLOW temp file, renamed over `path`."""
    tmp = f"{path}.{random_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
        os.chmod(tmp, mode)  # the umask may have narrowed it
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_private_file(path: str) -> str:
    """Read a file that must be ours and not readable or writable by anyone else."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(1, f"{path} is not a private file of yours")
        return f.read().decode().strip()


def read_regular_file(path: str) -> bytes:
    """Read a file the user named (--config, --hostfile): never block on a FIFO or a device.

    Opened non-blocking, then checked to be a regular file before a single byte is read;
    anything else raises OSError (EINVAL) with a message saying what the path is.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(22, f"{_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        return f.read()


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a plain file"
