"""The job directory: checked before anything starts, and locked for the job's life by each node.

Two jobs that would share a job directory would share its keys and its secret: the second
worker would join the first job's chief. Each node's detlaunch holds an flock on its own
file in the directory (``lock-node<N>``: one shared directory serves every node) from before
its supervisor starts until the process exits, so a second job with the same directory and
node rank is one clear line and exit 2, whether the first ends cleanly or is SIGKILLed (the
kernel drops the lock with the process).

The job secret lives here too: the job link's key, from DETLAUNCH_JOB_SECRET or a private file in
the shared job dir that the chief writes and the workers read.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Mapping

from detlaunch.errors import ConfigError, LaunchError
from detlaunch.system.safefs import ensure_private_dir, random_hex, read_private_file, write_private_file


def prepare_job_dir(path: str, given: bool) -> None:
    """Create the job dir (0700, ours) or explain in one line why it cannot be used."""
    flag = "--job-dir" if given else "the job dir"
    fix = "choose another --job-dir" if given else "give --job-dir DIR or another --job-id"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise ConfigError(f"cannot use {flag} {path}: {e.strerror}; {fix}") from None
    else:
        if stat.S_ISLNK(st.st_mode):
            raise ConfigError(f"{flag} {path} is a symlink: refusing to follow it for the job's keys; {fix}")
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{flag} {path} exists and is not a directory; {fix}")
        if st.st_uid != os.getuid():
            raise ConfigError(f"{flag} {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); {fix}")
    unsafe = unsafe_parent(path)
    if unsafe:
        raise ConfigError(f"{flag} {path} is inside {unsafe}: another user could swap the job's keys there; {fix}")
    try:
        ensure_private_dir(path)
    except LaunchError as e:
        raise ConfigError(f"{e}") from None
    except OSError as e:
        raise ConfigError(f"cannot create {flag} {path}: {e.strerror}; {fix}") from None


def unsafe_parent(path: str) -> str | None:
    """The first folder above `path` in which another user could replace it, and why; None when there is none.
    As ssh checks the folders above authorized_keys (StrictModes), from the real path up to /: each must be
    root's or yours, and not writable by its group or others, unless it is sticky (/tmp: nobody renames
    another's entry there). detlaunch checks this itself, so its per-job sshd keeps `StrictModes no` (which
    would refuse every job dir under /tmp)."""
    folder = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            st = os.stat(folder)
        except FileNotFoundError:  # not there yet: made below, ours
            folder = os.path.dirname(folder)
            continue
        except OSError:
            return None  # cannot be looked at: making the job dir will say why
        if st.st_uid not in (0, os.getuid()):
            return f"{folder}, which belongs to uid {st.st_uid}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{folder}, which others can write to (mode {stat.S_IMODE(st.st_mode):o}, not sticky)"
        if folder == os.path.dirname(folder):
            return None
        folder = os.path.dirname(folder)


class JobDirLock:
    """This node's flock on ``<job dir>/lock-node<N>``, held until release() or the process's exit."""

    def __init__(self, job_dir: str, node_rank: int, job_id: str) -> None:
        self.path = os.path.join(job_dir, f"lock-node{node_rank}")
        self.job_dir = job_dir
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise ConfigError(
                    f"job dir {job_dir} is in use by another job on node {node_rank}{holder} (job id {job_id}): "
                    "give this job another --master-port (its id is derived from it), --job-id or --job-dir"
                ) from None
            if _same_file(fd, self.path):  # not unlinked by a job that ended meanwhile
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd: int | None = fd

    def release(self) -> None:
        """Remove the lock file, then drop the lock; the job dir goes too when that leaves it empty."""
        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # while still locked: a job that opens it now sees it is gone and retries
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        try:
            os.rmdir(self.job_dir)
        except OSError:
            pass


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read_holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (detlaunch pid {pid})" if pid.isdigit() else ""


def lock_job_dir(job_dir: str, node_rank: int, job_id: str, given: bool) -> JobDirLock:
    """Check and create the job dir, then lock this node's file in it: before anything starts."""
    prepare_job_dir(job_dir, given)
    return JobDirLock(job_dir, node_rank, job_id)


SECRET_ENV = "DETLAUNCH_JOB_SECRET"
SECRET_FILE = "secret"


def create_secret(env: Mapping[str, str], shared_dir: str, secret: str = "") -> str:
    """Chief: the job secret from the environment, else a new one (or `secret`, a lost chief's successor's) in
    the shared job dir (0600), for the nodes that join it afresh."""
    if env.get(SECRET_ENV):
        return str(env[SECRET_ENV])
    ensure_private_dir(shared_dir)
    secret = secret or random_hex(32)
    write_private_file(os.path.join(shared_dir, SECRET_FILE), secret)
    return secret


def read_secret(env: Mapping[str, str], shared_dir: str) -> str:
    """Worker: the job secret from the environment, else the chief's file (once its listener answers)."""
    return env.get(SECRET_ENV) or read_private_file(os.path.join(shared_dir, SECRET_FILE))
