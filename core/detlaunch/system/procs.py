"""Starting and stopping the processes a supervisor owns.

Every process the supervisor starts gets its own session (so its whole group can
be signalled) and PR_SET_PDEATHSIG=SIGKILL (so a SIGKILLed detlaunch leaves
nothing behind). The supervisor is a child subreaper: anything its processes
orphan is re-parented to it, so it can find and stop every descendant.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
from collections.abc import Collection, Mapping, Sequence

import detlaunch.exit_codes as exit_codes
from detlaunch.errors import LaunchError
from detlaunch.outcome import ProcessEnd

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)


def become_subreaper() -> None:
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def spawn(argv: Sequence[str], env: Mapping[str, str], *, output_fd: int | None = None,
          error_fd: int | None = None) -> int:
    """Fork and exec `argv` in a new session, dying with its parent; return its pid.

    stdin is /dev/null; stdout and stderr go to `output_fd` when given (stderr to `error_fd` if given).

    Raises LaunchError when the program cannot be found or executed.
    """
    path = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", os.defpath))
    if not path:
        raise LaunchError(f"cannot start {argv[0]}: not found on PATH")
    err_r, err_w = os.pipe()  # close-on-exec: EOF at exec, an error message otherwise
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # child: only async-signal-safe-ish work until exec
        try:
            os.close(err_r)
            os.setsid()
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(exit_codes.by_signal(signal.SIGKILL))
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            if output_fd is not None:
                os.dup2(output_fd, 1)
                os.dup2(output_fd if error_fd is None else error_fd, 2)
            os.execve(path, list(argv), dict(env))
        except BaseException as e:  # report to the parent, never return into its code
            try:
                os.write(err_w, f"{getattr(e, 'strerror', None) or e}".encode())
            finally:
                os._exit(exit_codes.NOT_FOUND)
    os.close(err_w)
    with os.fdopen(err_r, "rb") as f:
        message = f.read()
    if message:
        os.waitpid(pid, 0)
        raise LaunchError(f"cannot start {argv[0]}: {message.decode(errors='replace')}")
    return pid


def children_files() -> bool:
    """Does this kernel list a task's children in /proc (CONFIG_PROC_CHILDREN, usual)?"""
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def tree_pids(root: int) -> list[int]:
    """`root` and its descendants, reading only the tree's own /proc files; [] when `root` has gone."""
    out: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # it has gone
        out.append(pid)
        for tid in tids:  # a child is listed under the thread that forked it
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    todo.extend(map(int, f.read().split()))
            except OSError:
                continue  # the thread has gone
    return out


def descendants(pid: int | None = None) -> list[int]:
    """The pids below `pid` (this process by default), zombies too; psutil only where /proc does not list
    children (it costs every detlaunch process about 1 MB and 15 ms to import)."""
    root = pid or os.getpid()
    if children_files():
        return tree_pids(root)[1:]
    import psutil

    try:
        return [c.pid for c in psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def is_zombie(pid: int) -> bool:
    """Whether `pid` has exited and waits to be reaped (or is gone already)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def task_states(pid: int, proc: str = "/proc") -> dict[int, bytes]:
    """Each task (thread) of process `pid` with its state letter (R, S, D, Z...); {} once it has gone."""
    states: dict[int, bytes] = {}
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return states
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/stat", "rb") as f:
                states[int(tid)] = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError, ValueError):
            continue  # this thread has gone
    return states


def alive(pid: int, proc: str = "/proc") -> bool:
    """Whether a task of `pid` still runs. A zombie leader whose other threads live is alive: a rank killed
    while a thread was stuck in a driver, whose thread still holds the device (is_zombie says "exited" for
    it); a zombie with no other task is not: it only waits to be reaped."""
    return any(state not in (b"Z", b"X") for state in task_states(pid, proc).values())


def cpu_wait(pid: int, proc: str = "/proc") -> float | None:
    """Seconds task `pid` has spent runnable but waiting for a CPU (the second field of its schedstat), or
    None where the kernel does not say or the task has gone: on a loaded machine a process that is only
    slow is told from one that is stuck by this."""
    try:
        with open(f"{proc}/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def parse_nspid(text: str) -> tuple[int, ...]:
    """The pids on the `NSpid:` line of a /proc status or pidfd fdinfo text, outermost namespace first;
    () when there is none or the process has gone (a pidfd's fdinfo then says -1)."""
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            try:
                pids = tuple(int(p) for p in line.split()[1:])
            except ValueError:
                return ()
            return pids if pids and all(p > 0 for p in pids) else ()
    return ()


def nspids(pidfd: int, proc_fd: int | None = None) -> tuple[int, ...]:
    """The pid of the process `pidfd` refers to in every PID namespace, from that of the /proc open at
    `proc_fd` (default: this process's /proc) down to its own; () once it has gone.

    Inside the job's PID namespace /proc is the namespace's own, whose NSpid lines show only its own pids;
    read through the /proc detlaunch was started with (isolation.outer_proc), a pidfd's fdinfo also gives the
    pid outside, the one the GPU driver, and so nvidia-smi, reports where that /proc is the host's."""
    try:
        fd = os.open(f"self/fdinfo/{pidfd}", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc_fd) if proc_fd is not None \
            else os.open(f"/proc/self/fdinfo/{pidfd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ()
    try:
        return parse_nspid(os.read(fd, 4096).decode(errors="replace"))
    except OSError:
        return ()
    finally:
        os.close(fd)


def signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_tree(pid: int, sig: int) -> None:
    """Signal a process and everything below it (sshd and its per-connection children)."""
    for target in [*descendants(pid), pid]:
        signal_pid(target, sig)


def kill_descendants(spare: Collection[int] = ()) -> int:
    """SIGKILL every process below this one but `spare`; return how many were signalled."""
    pids = [pid for pid in descendants() if pid not in spare]
    for pid in pids:
        signal_pid(pid, signal.SIGKILL)
    return len(pids)


def reap() -> list[tuple[int, ProcessEnd]]:
    """Collect every exited child (ours or re-parented orphans): [(pid, how it ended)]."""
    done: list[tuple[int, ProcessEnd]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        except OSError as e:  # pragma: no cover - EINTR is retried by Python
            if e.errno == errno.EINTR:
                continue
            raise
        if pid == 0:
            return done
        done.append((pid, ProcessEnd.from_wait_status(status)))
