"""A rank's Python stack without ptrace: faulthandler, registered in the rank for one signal.

py-spy reads a rank from outside, which the kernel may refuse (a rank that made itself
undumpable with prctl(PR_SET_DUMPABLE, 0), a stricter ptrace policy, a container without
CAP_SYS_PTRACE), and py-spy may be missing or not know that Python. Then detlaunch asks the
rank itself: the wrapper creates a private file per rank in the node's run dir
(``stack-RANK``, 0600) and starts the rank with faultsite/ first on PYTHONPATH, whose
sitecustomize.py registers ``faulthandler.register(SIGNAL, file, all_threads=True)``, writes a
header line (its pid and main thread), takes itself off PYTHONPATH and sys.path again, and
imports the sitecustomize it shadows. faulthandler's handler is C: it writes every thread's
frames even while the rank is blocked in C (a collective).

The signal is SIGRTMIN+7 (41 on Linux): real-time, used by no common library. It is sent only
to a process whose header says it registered and whose /proc status says it catches that
signal, so it never kills a rank. DETLAUNCH_FAULTHANDLER=0 turns the registration off.

Stdlib only and cheap to import: the wrapper (``python -S``) imports it by file.
"""

from __future__ import annotations

import os

ENV = "DETLAUNCH_FAULTHANDLER_FILE"  # the rank's dump file, read (and removed) by faultsite/sitecustomize.py
SWITCH = "DETLAUNCH_FAULTHANDLER"  # "0": do not register (the script uses the signal, or site must stay as it is)
SIGNAL = 34 + 7  # SIGRTMIN+7; Python's signal.SIGRTMIN is 34 on Linux (glibc keeps 32 and 33)
HEADER = "detlaunch-faulthandler"
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faultsite")


def stack_path(directory: str, rank: int) -> str:
    """Where rank's dump file lives in its node's run dir (the supervisor reads it there)."""
    return os.path.join(directory, f"stack-{rank}")


def prepare(directory: str, rank: int, env: dict[str, str]) -> str | None:
    """For the wrapper, before it starts the rank: create the rank's dump file (0600, fresh) and set `env`
    so the rank's Python registers faulthandler into it; the path, or None when turned off."""
    if env.get(SWITCH) == "0":
        return None
    path = stack_path(directory, rank)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:  # an earlier attempt's
        os.unlink(path)
        fd = os.open(path, flags, 0o600)
    os.close(fd)
    env[ENV] = path
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = SITE_DIR if old is None else f"{SITE_DIR}:{old}"  # sitecustomize.py undoes exactly this
    return path


SETTLE = 0.02  # seconds without growth after the main thread's frames: the dump is whole
SETTLE_WITHOUT_MAIN = 0.2
STEP = 0.005
NOT_REGISTERED = (f"not registered in it (not Python, or Python run with -S, -E or -I, signal {SIGNAL} taken, "
                  f"or {SWITCH}=0)")


def request(path: str, rank_pid: int, deadline: float) -> tuple[str, str]:
    """Ask the rank for its stacks: (faulthandler's dump, '') or ('', why not, in words).

    For the supervisor, on the stack collector's thread (never the event loop). The dump is a
    regular file, which gives no event when it is whole: faulthandler writes it in microseconds
    from the signal handler, so this looks at its size every STEP seconds until it has stopped
    growing, at most until `deadline` (time.monotonic()). The rank's exit does give an event: a
    pidfd of the rank (and of the Python that registered) ends the wait at once, so a rank that
    dies while it is asked never holds the asker. A lock keeps two askers apart.
    """
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return "", f"no faulthandler file for it ({SWITCH}=0, or its wrapper is older)"
    except OSError as e:
        return "", f"cannot open its faulthandler file: {e.strerror}"
    exits: list[int] = []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        head = os.pread(fd, 200, 0).split(b"\n", 1)[0]
        fields = dict(f.split("=", 1) for f in head.decode(errors="replace").split()[1:] if "=" in f)
        if not head.startswith(HEADER.encode()) or "pid" not in fields:
            return "", NOT_REGISTERED
        pid, signum = int(fields["pid"]), int(fields.get("signal", SIGNAL))
        main = f"hread 0x{int(fields.get('main', '0'), 16):016x} ("  # faulthandler pads thread ids
        exits = _pidfds({pid, rank_pid})
        why = _cannot_signal(pid, rank_pid, signum) if exits else "the process that registered faulthandler has exited"
        if why:
            return "", why
        start = len(head) + 1
        os.ftruncate(fd, start)  # the rank appends (O_APPEND): its dump starts right after the header
        os.kill(pid, signum)
        return _await_dump(fd, start, main, exits, deadline)
    finally:
        os.close(fd)
        for exit_fd in exits:
            os.close(exit_fd)


def _await_dump(fd: int, start: int, main: str, exits: list[int], deadline: float) -> tuple[str, str]:
    """The dump once it has stopped growing; or why not: the rank exited first, or the deadline came."""
    import select
    import time

    size, changed, gone = start, time.monotonic(), False
    while True:
        now = time.monotonic()
        new = os.fstat(fd).st_size
        if new != size:
            size, changed = new, now
        quiet = now - changed
        if size > start and (gone or quiet >= SETTLE):
            text = os.pread(fd, size - start, start).decode(errors="replace")
            if main in text or quiet >= SETTLE_WITHOUT_MAIN:
                return text, ""
        if gone:
            return "", "it exited before its faulthandler answered" if size == start else (
                "it exited before its faulthandler's dump ended")
        if now >= deadline:
            return "", "its faulthandler did not answer in time" if size == start else (
                "its faulthandler's dump did not end in time")
        # Instead of a sleep: the rank's exit wakes this at once (then one last look at the file).
        gone = bool(select.select(exits, [], [], min(STEP, deadline - now))[0])


def _pidfds(pids: set[int]) -> list[int]:
    """A pidfd for each of `pids` (readable once that process has exited); [] when one is gone already."""
    fds: list[int] = []
    try:
        for pid in pids:
            fds.append(os.pidfd_open(pid))
    except ProcessLookupError:
        for fd in fds:
            os.close(fd)
        return []
    return fds


PF_EXITING = 0x4  # linux/sched.h: the thread is in do_exit()


def dying(pid: int, status: dict[str, str] | None = None) -> str:
    """Why `pid` is on its way out, in words ('' when it is not): it has exited, it is dumping core, or its
    main thread is exiting (a fatal signal, exit()). Such a process answers neither py-spy nor a signal.
    status: its /proc status, if read already."""
    status = _proc_status(pid) if status is None else status
    if status is None or status.get("State", "").startswith(("Z", "X")):
        return "it has exited"
    if status.get("CoreDumping", "").strip() == "1":
        return "it is dying (dumping core)"
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        flags = int(stat[stat.rfind(b")") + 2:].split()[6])  # field 9, after the state and 5 numbers
    except (OSError, ValueError, IndexError):
        return ""
    return "it is exiting" if flags & PF_EXITING else ""


def _cannot_signal(pid: int, rank_pid: int, signum: int) -> str:
    """Why `pid` must not get `signum` ('' when it may): it is not the rank (or its child), is
    stopped or dying, or does not catch the signal (the default action would kill it)."""
    status = _proc_status(pid)
    if status is None or status.get("State", "").startswith(("Z", "X")):
        return "the process that registered faulthandler has exited"
    if pid != rank_pid and not _descends(pid, rank_pid):
        return f"its faulthandler file names pid {pid}, which is not the rank's"
    if status.get("State", "").startswith(("T", "t")):
        return "it is stopped (SIGSTOP): its faulthandler runs only once it continues"
    why = dying(pid, status)
    if why:
        return why
    try:
        caught = int(status.get("SigCgt", "0"), 16)
    except ValueError:
        caught = 0
    if not caught >> (signum - 1) & 1:
        return f"it no longer catches signal {signum} (the script replaced or removed detlaunch's handler)"
    return ""


def _proc_status(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return None


def _descends(pid: int, ancestor: int) -> bool:
    for _ in range(8):  # the rank is a shell, env or launcher in front of Python: a few levels at most
        status = _proc_status(pid)
        if status is None:
            return False
        pid = int(status.get("PPid", "0"))
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False
