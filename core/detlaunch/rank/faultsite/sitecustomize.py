"""detlaunch's stack fallback and end mark, run by site in a rank's Python (see detlaunch/rank/faultdump.py).

The rank wrapper put this folder first on PYTHONPATH and named a private file in
DETLAUNCH_FAULTHANDLER_FILE. Here: register faulthandler for SIGRTMIN+7 into that file (unless the
signal has a handler already), write a header line saying so; arrange for the rank's progress file
(DETLAUNCH_PROGRESS_FILE) to be marked once the script has ended and once its atexit handlers have run
(`_mark_the_end`); arrange for a
thread that answers detlaunch's questions to torch's Flight Recorder to start once the rank imports
torch.distributed (`_listen_for_flight_questions`, see detlaunch/rank/flightrec.py); then undo the
wrapper's changes (this folder off PYTHONPATH and sys.path, the variables gone: the rank's children do
not register) and import the sitecustomize this one shadows (the user's, or the distribution's), as
site would.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # never at run time: a rank's start pays for no typing import
    from typing import NoReturn


def _register() -> None:
    path = os.environ.pop("DETLAUNCH_FAULTHANDLER_FILE", None)
    if not path:
        return
    import _signal
    import _thread
    import faulthandler

    signum = 34 + 7  # faultdump.SIGNAL
    if _signal.getsignal(signum) not in (_signal.SIG_DFL, None):
        return  # someone's handler: leave it alone (the file stays empty: detlaunch says why)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    faulthandler.register(signum, file=fd, all_threads=True, chain=False)  # fd stays open for faulthandler
    os.write(fd, f"detlaunch-faulthandler pid={os.getpid()} signal={signum} main={_thread.get_ident():#x}\n".encode())


RAISED, FINALIZING = 1 << 8, 1 << 9  # the end record's flags beside the exit code (rank/progress.py: ENDED_*)


def _mark_the_end() -> None:
    """Mark the rank's progress file (rank/progress.py: ENDED_RECORD) at two moments of Python's shutdown, so
    that a rank killed after them (torch's gloo threads abort it while Python finalizes) is reported as such:

    1. its script has ended (returned, sys.exit, or an uncaught exception, its traceback printed): threading's
       atexit calls run first in Python's shutdown, before the atexit module's handlers;
    2. every atexit handler the script registered has run too (logging's flush, a final save): this one was
       registered before the script ran, so it runs after them. Only the interpreter's finalization (and the C
       library's exit) is left: "finalizing", the only end detlaunch may count as finished despite a signal.

    Each record holds the exit code the script asked for as far as Python shows it: 0 when it returned, N for
    sys.exit(N), exit(N) or quit(N) (wrapped here, see `_ExitCode`), 1 and RAISED for an uncaught exception; a
    rank forked from a rank template also reports a bare `raise SystemExit(N)` (template.py catches it).
    Only this process writes it (not a forked child that returns through Python); os._exit, exec and a fatal
    signal before the end write nothing."""
    path = os.environ.get("DETLAUNCH_PROGRESS_FILE")
    if not path:
        return
    pid = os.getpid()
    exit_code = _ExitCode.install()

    def mark(flags: int) -> None:
        if os.getpid() != pid:
            return
        import struct
        import time

        if flags & FINALIZING:  # let a thread that waits for the GIL have it now, not once Python finalizes:
            time.sleep(0)  # gloo's, releasing a finished collective, would then be ended (docs/RESTARTS.md)
        if hasattr(sys, "last_exc") or hasattr(sys, "last_value"):  # set for an uncaught exception's traceback
            flags |= RAISED | 1
        else:
            flags |= exit_code.code
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:  # progress.ENDED_RECORD: (1, flags | exit code, monotonic, wall, 1), as the heartbeat's record
            os.pwrite(fd, struct.pack("@qqddq", 1, flags, time.monotonic(), time.time(), 1), 128)
        except OSError:
            pass
        finally:
            os.close(fd)

    import atexit
    import threading

    atexit.register(mark, FINALIZING)  # first registered: the last atexit handler to run
    register = getattr(threading, "_register_atexit", None)  # Python 3.9+
    if register is None:
        atexit.register(mark, 0)  # after the script's own atexit handlers: later, but still before the teardown
    else:
        register(mark, 0)


class _ExitCode:
    """The code the script passed to sys.exit, exit or quit (0 until then): Python keeps a SystemExit's code
    to itself once the exception has ended the script, so the calls that raise it note it first. A script
    that catches that SystemExit and goes on keeps the noted code: the strict reading, never a looser one."""

    code = 0

    @classmethod
    def install(cls) -> type[_ExitCode]:
        import builtins

        real_exit = sys.exit

        def exit(status: str | int | None = None) -> NoReturn:  # noqa: A001 - sys.exit's own name
            cls.note(status)
            real_exit(status)

        exit.__doc__, exit.__wrapped__ = real_exit.__doc__, real_exit  # type: ignore[attr-defined]
        sys.exit = exit
        for name in ("exit", "quit"):  # site's Quitter objects (python -S has none)
            quitter = getattr(builtins, name, None)
            if quitter is not None and not isinstance(quitter, _NotingQuitter):
                setattr(builtins, name, _NotingQuitter(quitter))
        return cls

    @classmethod
    def note(cls, status: object) -> None:
        """What the process's exit code will be, as Python computes it from a SystemExit's code."""
        if status is None:
            cls.code = 0
        elif isinstance(status, int):
            cls.code = status & 0xFF
        else:  # a message: printed, exit code 1
            cls.code = 1


class _NotingQuitter:
    """builtins.exit and quit, noting the code first (see _ExitCode); they print and repr as before."""

    def __init__(self, quitter: object) -> None:
        self._quitter = quitter

    def __repr__(self) -> str:
        return repr(self._quitter)

    def __call__(self, code: object = None) -> None:
        _ExitCode.note(code)
        self._quitter(code)  # type: ignore[operator]


class _FlightWatch:
    """On sys.meta_path until the rank's first import of torch.distributed: then it starts the thread that
    answers (and leaves). It finds no module itself; until then each import costs one call of it."""

    def __init__(self, fifo: str) -> None:
        self.fifo = fifo

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name != "torch.distributed" or self not in sys.meta_path:
            return
        sys.meta_path.remove(self)
        self.start()

    def start(self) -> None:
        try:
            import _thread

            fd = os.open(self.fifo, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)  # read-write: open() never blocks
            os.register_at_fork(after_in_child=lambda: os.close(fd))  # a forked child (a DataLoader worker): not it
            _thread.start_new_thread(_answer_flight_questions, (fd, self.fifo))
        except Exception:  # noqa: BLE001 - never break the rank's import for it: detlaunch then says it is absent
            pass


def _listen_for_flight_questions() -> None:
    fifo = os.environ.pop("DETLAUNCH_FLIGHT_FIFO", None)  # flightrec.ENV
    if fifo and "torch.distributed" in sys.modules:  # a rank forked from a template that imported it
        _FlightWatch(fifo).start()
    elif fifo:
        sys.meta_path.insert(0, _FlightWatch(fifo))


def _answer_flight_questions(fd: int, fifo: str) -> None:
    """The thread: blocked in read(2) (the GIL released) until the supervisor writes `NONCE\\n`; then torch's
    Flight Recorder dumps into the reply FIFO `fifo.NONCE`, which the supervisor made and reads. SIGPIPE is
    blocked in this thread: a reply whose asker gave up fails with EPIPE, even where the script set SIGPIPE's
    default action (which would end the rank)."""
    try:
        import _signal

        _signal.pthread_sigmask(_signal.SIG_BLOCK, [13])  # SIGPIPE, for this thread only
    except Exception:  # noqa: BLE001
        return  # without it, an answer could kill the rank: rather none
    while True:
        try:
            questions = os.read(fd, 4096)
        except OSError:
            return
        for nonce in questions.split():
            if not nonce.isalnum() or len(nonce) > 32:
                continue
            try:  # the reply FIFO first: a question whose asker gave up (no reader, or gone) costs no dump
                out = os.open(f"{fifo}.{nonce.decode()}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                os.set_blocking(out, True)
                answer = memoryview(_flight_dump())
                while answer:
                    answer = answer[os.write(out, answer):]
            except Exception:  # noqa: BLE001 - the asker gave up meanwhile (EPIPE): never break the rank
                pass
            finally:
                os.close(out)


def _flight_dump() -> bytes:
    """torch's dumps as one JSON object, {"fr": ..., "nccl": ...}, or {"error": why}. Never imports torch."""
    dist = sys.modules.get("torch.distributed")
    c10d = sys.modules.get("torch._C._distributed_c10d")
    if dist is None or c10d is None:
        return b'{"error": "torch.distributed is not imported"}'
    try:
        if not dist.is_available() or not dist.is_initialized():
            return b'{"error": "torch.distributed is not initialized (no process group yet)"}'
    except Exception:  # noqa: BLE001 - a half-imported torch.distributed
        return b'{"error": "torch.distributed is not ready"}'
    parts = []
    for key, name in ((b"fr", "_dump_fr_trace_json"), (b"nccl", "_dump_nccl_trace_json")):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            try:
                body = dump(True, False)  # includeCollectives, onlyActive
            except TypeError:  # a torch whose dump takes no arguments
                body = dump()
            parts.append(b'"' + key + b'": ' + (body.encode() if isinstance(body, str) else bytes(body)))
        except Exception as e:  # noqa: BLE001
            parts.append(b'"' + key + b'": {"error": "' + type(e).__name__.encode() + b'"}')
    return b"{" + b", ".join(parts) + b"}"


def _undo_path() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    old = os.environ.get("PYTHONPATH")
    if old == here:
        del os.environ["PYTHONPATH"]
    elif old is not None and old.startswith(here + ":"):
        os.environ["PYTHONPATH"] = old[len(here) + 1:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]


def start() -> None:
    """All but the path: also what a rank forked from a rank template runs (rank/template.py)."""
    try:
        _register()
    except Exception as e:  # never break the rank for a fallback
        sys.stderr.write(f"detlaunch: faulthandler fallback not registered: {e!r}\n")
    try:
        _mark_the_end()
    except Exception:  # noqa: BLE001 - never break the rank for a mark; without it, its end reads as before
        pass
    try:
        _listen_for_flight_questions()
    except Exception:  # noqa: BLE001 - never break the rank for it; without it, the hang report has stacks only
        pass


if __name__ == "sitecustomize":  # run by site (not by a rank template, which calls start itself)
    start()
    _undo_path()
    _this = sys.modules.pop("sitecustomize")
    try:
        import sitecustomize  # noqa: F401  (the next one on sys.path: the one this file shadows)
    except ImportError as e:
        if e.name != "sitecustomize":
            raise
    finally:
        sys.modules.setdefault("sitecustomize", _this)  # none further on: the import system expects this one
