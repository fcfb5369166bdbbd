"""Warm ranks, the wrapper's side: ask the node's rank template (template.py) for the rank, forked.

A rank template is one process per node that has imported torch (and --preload) once; a rank forked
from it skips those imports (docs/RESTARTS.md, "Warm ranks"). The wrapper does not exec Python: it
connects to the template's socket (its node's private run dir, 0700), sends the rank's argv,
environment, cwd, umask, resource limits and signal mask with its stdin and the write ends of its
output pipes (SCM_RIGHTS), and gets the rank's pid. The rank is not the wrapper's child (see
template.py for why and who reaps it): its supervisor tells the wrapper how it ended.

Whatever cannot be warm (no template, one that refuses or died) is None: the wrapper starts the rank
cold, as without a template; the template or the supervisor says why, once for the job.

Also the one rule both sides share: which commands can be forked (`python_command`) and which
variables a rank must share with its template (`import_time`). Stdlib only, cheap to import (the
wrapper, ``python -S``).
"""

from __future__ import annotations

import _socket as socket  # the C module under socket (see connection.py)
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # never at run time
    from typing import Any

SOCKET_NAME = "template.sock"  # in the node's run dir, next to the supervisor's
WAIT = 600.0  # seconds the wrapper waits for the template's answer (it may still be importing)
GO = b"go\n"  # the wrapper has the forked rank's pid: the rank may run its script (ask, template.fork_rank)
STOPPED = "a stop signal came before the rank template answered"
# Interpreter options a template can share with its ranks (it is started with the same ones); any
# other (-c, -I, -P, -S, -i, -x, combined letters) makes the command one that starts cold.
FLAGS = frozenset({"-u", "-B", "-O", "-OO", "-b", "-bb", "-q", "-s", "-E"})
WITH_VALUE = ("-X", "-W")
# Variables read while torch and its libraries are imported, found by logging getenv() and os.environ
# during `import torch, torch.distributed` (torch 2.13, docs/RESTARTS.md): a rank whose value differs from
# its template's starts cold. Not among them: what torch reads later (CUDA_* when CUDA initialises, which
# never happens in the template; TORCH_NCCL_*, TORCH_FR_*, MASTER_*, RANK... when a process group is made).
IMPORT_TIME_PREFIXES = ("PYTHON", "OMP_", "GOMP_", "KMP_", "MKL", "DNNL_", "ONEDNN_", "OPENBLAS_", "GOTO_", "NPY_",
                        "NUMPY_", "KINETO_", "LD_", "LC_", "TORCH_LOGS", "TORCH_COMPILE_", "TORCHDYNAMO_",
                        "TORCHEXPORT_", "PYTORCH_JIT", "COMPILE_STROBELIGHT", "FX_", "TORCH_BLAS_",
                        "TORCH_LINALG_")
IMPORT_TIME_NAMES = frozenset({
    "LANG", "LANGUAGE", "HOME", "PATH", "VIRTUAL_ENV", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_CPP_LOG_LEVEL",
    "TORCH_DISTRIBUTED_DEBUG", "TORCH_CUSTOM_TERMINATE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "TORCH_ROCM_FA_PREFER_CK", "PYTORCH_API_USAGE_STDERR", "PYTORCH_MATCHER_LOGLEVEL", "TORCH_TRACE", "TORCH_DTRACE",
    "TORCH_USE_RTLD_GLOBAL", "TORCH_DEVICE_BACKEND_AUTOLOAD", "TORCH_DISTRIBUTED_USE_TORCHCOMMS",
    "TORCH_DISTRIBUTED_COMPILE_ON_ONE_RANK", "TORCH_CUDA_SANITIZER", "TORCH_FAKE_TENSOR_DEBUG", "TORCH_CUDAGRAPH_GC",
    "TORCHINDUCTOR_FORCE_DISABLE_CACHES", "TORCH_PYTHON_NATIVE_USER_GRAPH_ORDER_FN"})


def python_command(argv: list[str] | tuple[str, ...]) -> tuple[list[str], str, str] | None:
    """`python [FLAGS] SCRIPT ARGS` or `python [FLAGS] -m MODULE ARGS` as (interpreter and flags, "script"
    or "module", its target); None for anything else (it starts cold)."""
    if not argv or not os.path.basename(argv[0]).startswith("python") or argv[0].endswith("-config"):
        return None
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return (list(argv[:i]), "module", argv[i + 1]) if i + 1 < len(argv) else None
        if arg in FLAGS:
            i += 1
        elif arg in WITH_VALUE and i + 1 < len(argv):
            i += 2
        elif arg[:2] in WITH_VALUE and len(arg) > 2:
            i += 1
        elif arg.startswith("-"):
            return None
        else:
            return list(argv[:i]), "script", arg
    return None


def import_time(key: str) -> bool:
    return (key in IMPORT_TIME_NAMES or key.startswith(IMPORT_TIME_PREFIXES))


def import_time_env(env: dict[str, str], site_dir: str = "") -> dict[str, str]:
    """The variables of `env` a template must share; detlaunch's faulthandler folder (`site_dir`, put first
    on a rank's PYTHONPATH by its wrapper and taken off in the rank) does not count."""
    out = {k: v for k, v in env.items() if import_time(k)}
    path = out.get("PYTHONPATH")
    if site_dir and path is not None and (path == site_dir or path.startswith(site_dir + ":")):
        rest = path[len(site_dir) + 1:]
        if rest:
            out["PYTHONPATH"] = rest
        else:
            del out["PYTHONPATH"]
    return out


def env_difference(template: dict[str, str], rank: dict[str, str], site_dir: str = "") -> str:
    """The first import-time variable the two environments disagree on ('' : none)."""
    a, b = import_time_env(template, site_dir), import_time_env(rank, site_dir)
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            return key
    return ""


def ask(path: str, command: list[str], fds: tuple[int, int, int], reset: tuple[int, ...], wake: int = -1,
        stops: frozenset[int] = frozenset()) -> tuple[int, str]:
    """Ask the template at `path` to fork the rank running `command` with this process's environment, cwd,
    umask, limits and signal mask, and `fds` as its stdin, stdout and stderr: (pid, '') or (0, why not).
    `reset`: the signals a cold rank gets at their default action (the ones this process ignores, it keeps).

    The template may still be importing (seconds; many under load). A stop signal meanwhile must not wait for
    it: a byte on `wake` (signal.set_wakeup_fd's, a signal number) in `stops` ends the wait with (0, STOPPED).
    A rank the template forks runs only once it has our go, sent with its pid in hand: one it forks for an
    asker that has left sees the connection close, and ends before its script starts (template.fork_rank)."""
    import _signal as signal
    import resource  # only a warm start needs them
    import select

    umask = os.umask(0)
    os.umask(umask)
    limits = {}
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            try:
                limits[name] = list(resource.getrlimit(getattr(resource, name)))
            except (OSError, ValueError):
                pass
    request = {"argv": list(command), "env": dict(os.environ), "cwd": os.getcwd(), "umask": umask,
               "limits": limits, "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
               "ignored": [s for s in ignored_signals() if s not in reset],
               "cpus": sorted(os.sched_getaffinity(0))}  # the wrapper's: --numa-binding bound it (affinity.py)
    from_wrapper = request_bytes(request)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(WAIT)
        sock.connect(path)
        fd_bytes = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
        sock.sendmsg([from_wrapper], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd_bytes)])
        answer = b""
        poller = select.poll()
        for fd in (sock.fileno(), wake):
            if fd >= 0:
                poller.register(fd, select.POLLIN)
        while not answer.endswith(b"\n"):
            ready = [fd for fd, _ in poller.poll(WAIT * 1000)]
            if not ready:
                return 0, f"the rank template did not answer within {WAIT:g} s"
            if sock.fileno() in ready:  # an answer first: with its pid in hand, a stop goes to the rank
                data = sock.recv(4096)
                if not data:
                    return 0, "the rank template ended before it answered"
                answer += data
            elif any(signum in stops for signum in os.read(wake, 64)):
                return 0, STOPPED
        reply = decode(answer)
        pid = int(reply.get("pid") or 0)
        if pid:
            sock.sendall(GO)
    except OSError as e:
        return 0, f"the rank template cannot be reached: {e.strerror or e}"
    finally:
        sock.close()
    return pid, str(reply.get("why") or "")


def ignored_signals() -> list[int]:
    """The signals this process ignores (SIG_IGN), which a rank started from it would inherit."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    mask = int(line.split()[1], 16)
                    return [n for n in range(1, 65) if mask & (1 << (n - 1))]
    except OSError:
        pass
    return []


def request_bytes(message: dict[str, Any]) -> bytes:
    try:
        from . import protocol
    except ImportError:  # by file
        import protocol  # type: ignore[no-redef]
    return protocol.encode(message)


def decode(line: bytes) -> dict[str, Any]:
    try:
        from . import protocol
    except ImportError:  # by file
        import protocol  # type: ignore[no-redef]
    try:
        return protocol.decode(line)
    except ValueError:
        return {"why": "the rank template's answer was not understood"}
