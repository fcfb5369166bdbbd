"""Nothing escapes: the job's processes live in a PID namespace whose init is this node's supervisor.

The supervisor is started as pid 1 of a new PID namespace (with its own /proc), and dies with the
``detlaunch`` that started it (PR_SET_PDEATHSIG). When the init of a PID namespace dies, the
kernel SIGKILLs every process in it: a rank's daemon that double-forked, called setsid() and
ignores SIGTERM cannot outlive the job, even when ``detlaunch`` itself is SIGKILLed. What a
node's sshd starts for a rank is inside too, since sshd runs under the supervisor.

As root, a PID and a mount namespace are enough; an ordinary user also gets a user namespace
that maps only their own uid and gid (so every process keeps its real uid). Where the kernel
allows neither, the job runs as before, and one line says what is not guaranteed.

As root (one process fewer, ~1.5 MB a node; where it may go back to its own PID namespace, see
run_isolated):

    detlaunch (makes the namespace for its next child only; relays SIGINT/SIGTERM/SIGHUP, exits
      │        with the supervisor's code)
      └── detlaunch (pid 1 of the namespace, its own session: the node supervisor)
            └── launchers, daemons, rank wrappers, ranks, whatever they start

As an ordinary user (or uid 0 of a user namespace of its own), a child makes the namespaces (a
user namespace changes for good the credentials of the process that makes it, and needs a
single-threaded one):

    detlaunch (relays, exits with the supervisor's code)
      └── detlaunch (makes the namespaces, its own session; relays too)
            └── detlaunch (pid 1 of the namespace: the node supervisor)
                  └── ...
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import traceback
from collections.abc import Callable

# stdlib only: tests run this file as it is, as another user, with a Python that cannot see detlaunch.
# The two codes are detlaunch.exit_codes' (tests/test_exit_codes.py checks they agree).
INTERNAL = 70  # exit_codes.INTERNAL: the isolated child crashed
KILLED = 128 + signal.SIGKILL  # exit_codes.by_signal(SIGKILL)

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER = 0x00020000, 0x20000000, 0x10000000
MS_REC, MS_PRIVATE = 1 << 14, 1 << 18
PR_SET_PDEATHSIG = 1
RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_libc = ctypes.CDLL(None, use_errno=True)


class Unavailable(OSError):
    """The kernel (or its policy) does not let this user make the namespaces."""


def enter_new_pid_namespace() -> None:
    """Make the next child the init of a new PID namespace (with a user namespace when not root).

    Raises Unavailable with the reason.
    """
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWPID | (CLONE_NEWUSER if uid != 0 else 0)
    if _libc.unshare(flags) != 0:
        raise Unavailable(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
    if uid != 0:  # only our own ids, mapped to themselves: nothing changes for the processes
        try:
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        except OSError as e:
            raise Unavailable(e.errno or 0, f"user namespace id maps: {e.strerror}") from None


def _die_with_parent(parent_alive: int) -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([parent_alive], [], [], 0)[0]:  # EOF: the parent died before prctl took effect
        os._exit(KILLED)


_outer_proc: int | None = None


def outer_proc() -> int | None:
    """The /proc this process was started with, once it has mounted its namespace's own over it (else None).

    Its pids are those outside the job's namespace: the host's where detlaunch runs in the host's, as the GPU
    driver, and so nvidia-smi, reports them (procs.nspids reads a process's pids there)."""
    return _outer_proc


def _become_init() -> None:
    """pid 1 of the new namespace: see only the job's processes in /proc (psutil walks it)."""
    global _outer_proc
    if _libc.unshare(CLONE_NEWNS) == 0 and _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0:
        try:
            outer = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            outer = None
        if _libc.mount(b"proc", b"/proc", b"proc", 0, None) == 0:
            _outer_proc = outer
        elif outer is not None:
            os.close(outer)


def run_isolated(body: Callable[[], int], *, warn: Callable[[str], None],
                 enter: Callable[[], None] = enter_new_pid_namespace) -> int:
    """Run `body` as the init of a new PID namespace, in its own session; return its exit code.

    The caller stays as it was: it can fork again, and it never changes who it is. unshare()
    changes the process that calls it: its next child is the namespace's init, and once that init
    has exited it could fork no more. Where this process may go back to its own PID namespace
    (setns: root, not root inside a user namespace of its own), it makes the namespace itself and
    goes back once its child has ended; otherwise (an ordinary user, whose user namespace cannot be
    undone) a child of this process makes the namespaces. Signals that reach this process (a user's
    kill, the terminal's Ctrl-C) are relayed down. When the namespace cannot be made, `warn` says
    so in one line and `body` runs in a child, as before.
    """

    def init() -> int:
        _become_init()
        return body()

    def unisolated(e: Unavailable) -> int:
        warn(f"cannot isolate the job in a PID namespace ({e.strerror}): a process that escapes its "
             f"rank (setsid) can outlive a SIGKILL of detlaunch; see detlaunch doctor")
        return body()

    own = _own_pid_namespace() if os.getuid() == 0 else None
    if own is not None:  # a PID namespace only, made here: one process fewer between the user and the job
        ns: int = own

        def without_ns(run: Callable[[], int]) -> Callable[[], int]:
            def child() -> int:
                os.close(ns)  # this process's PID namespace: not for the job to hold
                return _in_own_session(run)
            return child

        try:
            try:
                enter()
            except Unavailable as e:  # it may have unshared before it failed: back first, then the child
                _libc.setns(ns, CLONE_NEWPID)
                why = e
                return _in_child(without_ns(lambda: unisolated(why)), warn)
            return _in_child(without_ns(init), warn)
        finally:  # also when the fork never came: this process's children are in its own namespace again
            _libc.setns(ns, CLONE_NEWPID)  # allowed: _own_pid_namespace tried it
            os.close(ns)

    def make_namespaces_and_run() -> int:
        # A user namespace's id maps are written after its unshare, and may then be refused (Ubuntu's
        # AppArmor: apparmor_restrict_unprivileged_userns): the process that unshared would make a
        # half-made namespace whose first child is its init (when that child exits, every other is
        # killed and no fork works). So try it in a throwaway child first, and never run the job in a
        # process that has unshared.
        why = probe(enter)
        if why is not None:
            return unisolated(Unavailable(0, why))
        try:
            enter()
        except Unavailable as e:  # the probe could, this process cannot: it must not fork the job now
            warn(f"cannot isolate the job in a PID namespace ({e.strerror}) although a moment ago it "
                 f"could: run it again; see detlaunch doctor")
            return INTERNAL
        return _in_child(init, warn)

    return _in_child(lambda: _in_own_session(make_namespaces_and_run), warn)


def _in_own_session(run: Callable[[], int]) -> int:
    os.setsid()  # the terminal's signals reach the outer detlaunch only, which relays each once
    return run()


def _own_pid_namespace() -> int | None:
    """A descriptor of this process's PID namespace if it may go back to it with setns, else None.

    As uid 0 inside a user namespace that does not own the PID namespace (unshare -Ur, a rootless
    container sharing the host's pids), unshare works but setns back is refused."""
    try:
        fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if _libc.setns(fd, CLONE_NEWPID) != 0:  # into the namespace it is in: changes nothing, checks the right
        os.close(fd)
        return None
    return fd


def _in_child(run: Callable[[], int], warn: Callable[[str], None]) -> int:
    """Run `run` in a child that dies with this process; relay stop signals to it; its exit code.

    A child killed by a signal this process did not relay died of something else (SIGKILL from outside the
    job, a crash): `warn` says so, since it could not say anything itself."""
    # Held until the child's supervisor catches them: as pid 1 an unhandled signal would be ignored.
    signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED)
    alive_r, alive_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(alive_w)
            _die_with_parent(alive_r)
            code = run()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:  # os._exit below would swallow it: say what broke
            traceback.print_exc()
            code = INTERNAL
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except OSError:
                    pass
            os._exit(code)
    os.close(alive_r)
    relayed: set[int] = set()
    old = {s: signal.signal(s, lambda signum, _frame: _relay(pid, signum, relayed)) for s in RELAYED}
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        os.close(alive_w)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) not in relayed:
        warn(_killed_line(pid, os.WTERMSIG(status)))
    return _shell_code(status)


def _killed_line(pid: int, signum: int) -> str:
    if signum == signal.SIGKILL:
        return (f"the job's supervisor (pid {pid}) was killed by SIGKILL, not by detlaunch: the kernel (its OOM "
                "killer: see dmesg) or a process outside the job; everything the job ran on this node ended with it")
    name = signal.Signals(signum).name if signum in signal.valid_signals() else f"signal {signum}"
    return f"the job's supervisor (pid {pid}) died of {name}; everything the job ran on this node ended with it"


def _relay(pid: int, signum: int, relayed: set[int]) -> None:
    relayed.add(signum)
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def probe(enter: Callable[[], None] = enter_new_pid_namespace) -> str | None:
    """Whether this user can make the namespaces here: None if so, else why not (for detlaunch doctor)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # try in a throwaway child: unshare changes the process that calls it
        os.close(r)
        code = 1
        try:
            enter()
            code = 0
        except Unavailable as e:
            os.write(w, str(e.strerror).encode())
        except BaseException as e:  # never let the throwaway child return into its parent's code
            os.write(w, repr(e).encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        why = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    return None if _shell_code(status) == 0 else (why or "unknown reason")


def _shell_code(status: int) -> int:
    """os.waitpid's status as a shell reports it (128+N for a signal), like outcome.ProcessEnd's code."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code
