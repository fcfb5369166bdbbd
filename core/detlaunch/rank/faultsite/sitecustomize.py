"""detlaunch's stack fallback and end mark, run by site in a rank's Python (see detlaunch/rank/faultdump.py).

The rank wrapper put this folder first on PYTHONPATH and named a private file in
DETLAUNCH_FAULTHANDLER_FILE. Here: register faulthandler for SIGRTMIN+7 into that file (unless the
signal has a handler already), write a header line saying so; arrange for the rank's progress file
(DETLAUNCH_PROGRESS_FILE) to be marked once the script has ended (`_mark_the_end`); then undo the
wrapper's changes (this folder off PYTHONPATH and sys.path, the variable gone: the rank's children do
not register) and import the sitecustomize this one shadows (the user's, or the distribution's), as
site would.
"""

import os
import sys


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


def _mark_the_end() -> None:
    """When the script has ended (returned, sys.exit, or an uncaught exception, its traceback printed) and
    Python starts shutting down, write the progress file's end record (rank/progress.py: ENDED_RECORD),
    so that a rank killed after that (SIGABRT from a library's destructor at exit) is reported as such.

    threading's atexit calls run first in Python's shutdown, before the atexit module's (a handler
    that aborts) and the interpreter's teardown; only this process writes it (not a forked child that
    returns through Python); os._exit, exec and a fatal signal before the end write nothing."""
    path = os.environ.get("DETLAUNCH_PROGRESS_FILE")
    if not path:
        return
    pid = os.getpid()

    def ended() -> None:
        if os.getpid() != pid:
            return
        import struct
        import time

        raised = hasattr(sys, "last_exc") or hasattr(sys, "last_value")  # set for an uncaught exception's traceback
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:  # progress.ENDED_RECORD: (1, 1 if it raised else 0, monotonic, wall, 1), as the heartbeat's record
            os.pwrite(fd, struct.pack("@qqddq", 1, int(raised), time.monotonic(), time.time(), 1), 128)
        except OSError:
            pass
        finally:
            os.close(fd)

    import threading

    register = getattr(threading, "_register_atexit", None)  # Python 3.9+
    if register is None:
        import atexit

        atexit.register(ended)  # after the script's own atexit handlers: later, but still before the teardown
    else:
        register(ended)


def _undo_path() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    old = os.environ.get("PYTHONPATH")
    if old == here:
        del os.environ["PYTHONPATH"]
    elif old is not None and old.startswith(here + ":"):
        os.environ["PYTHONPATH"] = old[len(here) + 1:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]


try:
    _register()
except Exception as e:  # never break the rank for a fallback
    sys.stderr.write(f"detlaunch: faulthandler fallback not registered: {e!r}\n")
try:
    _mark_the_end()
except Exception:  # noqa: BLE001 - never break the rank for a mark; without it, its end reads as before
    pass
_undo_path()
_this = sys.modules.pop("sitecustomize")
try:
    import sitecustomize  # noqa: F401  (the next one on sys.path: the one this file shadows)
except ImportError as e:
    if e.name != "sitecustomize":
        raise
finally:
    sys.modules.setdefault("sitecustomize", _this)  # none further on: the import system expects this one
