"""The rank template: one process per node that imported torch once, from which each rank is forked.

Started by the node's supervisor as ``PYTHON [FLAGS] template.py FD PYTHON`` (the ranks' own
interpreter, found on PATH, and flags, the ranks' environment for what is read at import: warm.import_time), with
FD a listening Unix socket the supervisor bound in its private run dir. It imports DETLAUNCH_PRELOAD's
modules (torch and torch.distributed when the script mentions torch, and --preload: planning/warm_ranks.py),
then serves one wrapper at a time (warm.ask).

Safe or not used: before every fork it checks that it runs one thread only (/proc/self/task) and
that CUDA is not initialised, that the command is its own interpreter's (warm.python_command), that
the rank's import-time variables are its own (warm.env_difference) and that the rank's resource
limits can be set. Otherwise it answers why, says so once on the console, and the wrapper starts
the rank cold. A preload that fails ends it with exit code 3, having said why in one line.

Who owns the rank. The wrapper must still learn the rank's exit status, and the rank must survive
this template's death (a template killed mid-job leaves the job fine). A process's status goes to
its parent only, and a process cannot adopt another. So the template double-forks: the middle
process forks the rank, writes its pid to the wrapper and exits at once; the rank is re-parented to
the nearest subreaper, the node's supervisor (it is also the PID namespace's init). The supervisor
reaps it, as it reaps every orphan, and tells the rank's wrapper how it ended over the wrapper's
connection (rank_registry.py); the wrapper also holds a pidfd of the rank, which wakes it at the
rank's end even without its supervisor. CLONE_PARENT (clone(2)) would make the supervisor the
rank's parent with one fork instead of two, but Python's os.fork runs the interpreter's fork
handlers, which a raw clone through ctypes would skip. A rank killed with its wrapper is killed
by the wrapper's supervisor, as a cold one is (its process group).

The forked rank is a fresh interpreter for its script: argv, ``__main__`` (its ``__file__``,
loader and spec), sys.path[0], sys.orig_argv, its command line in ps (retitle), the environment,
cwd, umask, resource limits, signal dispositions and mask, stdin/stdout/stderr (the wrapper's), its
own process group, its random seeds (random's and numpy's) and tempfile's folder. What differs: its
parent (the supervisor, not its wrapper), its session (its own), str hashes (the template's seed)
and sys.modules (torch is already there). docs/RESTARTS.md, "Warm ranks".
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
import warm  # noqa: E402  (this folder, sys.path[0]: the template is run as a script)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Request = dict[str, Any]

SITE_DIR = os.path.join(HERE, "faultsite")  # faultdump.SITE_DIR
PRELOAD_FAILED = 3


def say_once(said: set[str], why: str) -> None:
    if why not in said:
        said.add(why)
        os.write(2, f"detlaunch: warm ranks: {why}: ranks start cold\n".encode())


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def own_flags() -> list[str]:
    """The interpreter options this template was started with (they are the ranks')."""
    return list(sys.orig_argv[1:len(sys.orig_argv) - len(sys.argv)])


def refusal(request: Request, base_env: dict[str, str], exe: str) -> str:
    """Why this request cannot be forked here ('' : it can)."""
    if threads() > 1:
        return (f"the rank template runs {threads()} threads after its imports (OpenMP's pool when OMP_NUM_THREADS "
                "is not 1, or a thread a preloaded module started)")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised in the rank template (by a preloaded module)"
    parsed = warm.python_command(request["argv"])
    if parsed is None:
        return "the command is not `python SCRIPT` or `python -m MODULE`"
    interpreter, kind, target = parsed
    import shutil

    env = request["env"]
    if shutil.which(interpreter[0], path=env.get("PATH", os.defpath)) != exe or interpreter[1:] != own_flags():
        return "the command's interpreter or its options are not the rank template's"
    key = warm.env_difference(base_env, env, SITE_DIR)
    if key:
        return f"the ranks' {key} is not the rank template's (torch reads it at import)"
    if kind == "script" and not os.path.isfile(os.path.join(request["cwd"], target)):
        return f"no script {target}"
    import resource

    for name, (_soft, hard) in request["limits"].items():
        have = resource.getrlimit(getattr(resource, name))[1]
        if hard != have and (have != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > have)):
            return f"the ranks' {name} hard limit is above the rank template's"
    return ""


def serve(listener: socket.socket, exe: str) -> tuple[Request, list[int]]:
    """Answer wrappers until one is a forked rank: returns (in the rank only) its request and fds."""
    base_env, said = dict(os.environ), set[str]()
    while True:
        conn, _ = listener.accept()
        fds: list[int] = []
        try:
            request, fds = receive(conn)
            why = "" if len(fds) == 3 and "argv" in request else "a request it did not understand"
            why = why or refusal(request, base_env, exe)
            if why:
                say_once(said, why)
                conn.sendall(warm.request_bytes({"why": why}))
            elif fork_rank(listener, conn) == 0:
                return request, fds  # the rank
        except OSError:
            pass  # the wrapper went away: it starts nothing, or starts its rank cold
        conn.close()
        for fd in fds:
            os.close(fd)


def receive(conn: socket.socket) -> tuple[Request, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while data and not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            break
        data += more
    return warm.decode(data), fds


def fork_rank(listener: socket.socket, conn: socket.socket) -> int:
    """Fork the rank through a middle process that tells the wrapper its pid and exits (it is re-parented
    to the supervisor): 0 in the rank, its pid in the template.

    gc.freeze() first (the gc module's advice for a fork without exec): the rank's collections then skip the
    template's objects (torch's, ~1M), so they touch none of its pages, which stay shared, and its exit
    costs a third of the CPU (torch 2.13 with torch._dynamo: 0.4 s, not 1.4)."""
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()
    middle = os.fork()
    if middle:
        os.waitpid(middle, 0)
        return middle
    try:
        rank = os.fork()
    except BaseException:  # noqa: BLE001 - the wrapper reads EOF: cold
        os._exit(1)
    if rank == 0:
        listener.close()
        try:
            go = conn.recv(len(warm.GO), socket.MSG_WAITALL)  # short only at the connection's end
        except OSError:
            go = b""
        conn.close()
        if go != warm.GO:  # its wrapper has left (a stop before it had the pid): no rank to run, nobody to tell
            os._exit(0)
        return 0
    try:
        conn.sendall(warm.request_bytes({"pid": rank}))
    finally:
        os._exit(0)


def become(request: Request, fds: list[int]) -> None:
    """This forked process becomes the rank's fresh interpreter, but for running its script."""
    os.setsid()  # its own process group (and session): signalled as a group, as a cold rank is
    for name in ("warm", "protocol"):  # this folder's, imported by file: the script's own may have these names
        module = sys.modules.get(name)
        if module is not None and os.path.dirname(getattr(module, "__file__", "") or "") == HERE:
            del sys.modules[name]
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    ignored = set(request.get("ignored") or ())
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler: Any = signal.SIG_IGN if signum in ignored else signal.SIG_DFL
        if signum in (signal.SIGPIPE, signal.SIGXFSZ):  # what Python sets at start
            handler = signal.SIG_IGN
        elif signum == signal.SIGINT and handler == signal.SIG_DFL:
            handler = signal.default_int_handler
        try:
            signal.signal(signum, handler)
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, request.get("blocked") or ())
    import resource

    for name, (soft, hard) in request["limits"].items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (OSError, ValueError):
            pass
    os.umask(int(request["umask"]))
    if request.get("cpus"):  # the CPUs a cold rank would inherit from its wrapper (rank/affinity.py)
        try:
            os.sched_setaffinity(0, [int(c) for c in request["cpus"]])
        except (OSError, ValueError):
            pass
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):  # a terminal's stdout is line-buffered
        if stream is not None and not getattr(stream, "write_through", True):
            stream.reconfigure(line_buffering=fd == 2 or os.isatty(fd))  # type: ignore[union-attr]
    if "tempfile" in sys.modules:
        sys.modules["tempfile"].tempdir = None  # type: ignore[attr-defined]  # the rank's TMPDIR, when first asked
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()  # a fresh interpreter's numpy seeds itself from the OS: so does each rank
    path = os.environ.get("PYTHONPATH", "")
    if path == SITE_DIR or path.startswith(SITE_DIR + ":"):  # the wrapper's faulthandler site: run it now
        import runpy

        site = runpy.run_path(os.path.join(SITE_DIR, "sitecustomize.py"), run_name="detlaunch_faultsite")
        site["start"]()
        site["_undo_path"]()


def retitle(argv: list[str]) -> None:
    """The rank's command line in /proc/PID/cmdline (ps, top, nvidia-smi), over the template's: written in
    place, as setproctitle(3) does, in the room the supervisor's padding argument left; '' when it does not fit."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49 of stat)
        title = " ".join(argv).encode(errors="replace")[:end - start - 2]
        import ctypes

        # A last byte that is not NUL tells the kernel to read the title up to its first NUL.
        ctypes.memmove(start, title + b"\0" * (end - start - 1 - len(title)) + b" ", end - start)
    except (OSError, ValueError, IndexError):
        pass


def run(request: Request) -> None:
    """Run the script or module as `__main__`, as ``python SCRIPT`` or ``python -m MODULE`` would."""
    import builtins
    import types

    parsed = warm.python_command(request["argv"])
    assert parsed is not None  # refusal() checked it
    interpreter, kind, target = parsed
    at = len(interpreter)
    sys.orig_argv = list(request["argv"])
    retitle(sys.orig_argv)
    if kind == "module":
        sys.argv = ["-m", *request["argv"][at + 2:]]
        sys.path[0] = os.getcwd()
        import runpy

        runpy._run_module_as_main(target)  # type: ignore[attr-defined]  # what `python -m` calls
        return
    from importlib.machinery import SourceFileLoader

    path = os.path.abspath(target)
    sys.argv = list(request["argv"][at:])
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins, __spec__=None,
                         __loader__=SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def uncaught(e: BaseException) -> None:
    """What the interpreter does with an exception the script did not catch, without this file's frames."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    e.with_traceback(tb)  # what the interpreter's hook prints
    sys.last_exc = sys.last_value = e  # type: ignore[attr-defined]
    sys.last_type, sys.last_traceback = type(e), tb
    sys.excepthook(type(e), e, tb)
    if isinstance(e, KeyboardInterrupt):  # Python ends by SIGINT then, once it has shut down
        import atexit

        def by_sigint() -> None:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001
                    pass
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)

        atexit.register(by_sigint)


def start() -> tuple[Request, list[int]]:
    listener = socket.socket(fileno=int(sys.argv[1]))
    exe = sys.argv[2]
    names = [m for m in os.environ.pop("DETLAUNCH_PRELOAD", "").split(",") if m]  # planning/warm_ranks.py
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001 - whatever a preload raises: the ranks start cold
            os.write(2, f"detlaunch: warm ranks: importing {name} failed ({type(e).__name__}: {e}): "
                        "ranks start cold\n".encode())
            sys.exit(PRELOAD_FAILED)
    return serve(listener, exe)


if __name__ == "__main__":
    _request, _fds = start()
    become(_request, _fds)
    del _fds
    try:
        run(_request)
    except SystemExit as _exit:  # through sys.exit: the end mark notes its code (faultsite/sitecustomize.py)
        sys.exit(_exit.code)
    except BaseException as _e:  # noqa: BLE001
        uncaught(_e)
        sys.exit(1)
