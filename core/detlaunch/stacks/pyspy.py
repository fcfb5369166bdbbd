"""Python stacks of running processes, taken with py-spy, many at once within a time budget.

py-spy reads a process's memory from outside (ptrace / process_vm_readv): it needs nothing
from the target, so it works on a rank busy in Python, one blocked in C (a collective), and
one that is SIGSTOPped. Such a stopped process cannot be paused again, so it is read without
pausing (``--nonblocking``); its stack cannot change while it is stopped anyway.

When py-spy cannot read a rank (missing, ptrace refused, a Python it does not know), the rank
is asked itself: faulthandler, registered in it for a signal (faultdump.py); such a stack says
so (`ProcessStack.via`). When neither works, the answer says why in one line (`Unavailable`):
py-spy is missing, the process is gone, it is not Python, ptrace is not allowed (and by which
policy), py-spy did not answer in time, and why faulthandler could not answer either.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import linecache
import os
import re
import selectors
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from detlaunch.rank import faultdump

if TYPE_CHECKING:
    import subprocess

YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"


@dataclasses.dataclass(frozen=True)
class Frame:
    """One Python frame; `code`: its source line (filled for each thread's innermost frame), or ''."""

    function: str
    file: str
    line: int
    code: str = ""


@dataclasses.dataclass(frozen=True)
class ThreadStack:
    """One thread; `frames` innermost first. `active`: running or runnable, not waiting (py-spy's view)."""

    name: str
    thread_id: int
    active: bool
    frames: tuple[Frame, ...]
    owns_gil: bool = False
    os_thread_id: int | None = None

    @property
    def is_main(self) -> bool:
        return self.name == "MainThread"


@dataclasses.dataclass(frozen=True)
class ProcessStack:
    """Every Python thread of one process; `stopped`: it was SIGSTOPped (state T).
    `via`: '' when py-spy read it; else how it was had instead, and why py-spy could not.
    `ended`: set by whoever knows the rank (stacks/query.py): its script had ended (Python shuts down)."""

    pid: int
    threads: tuple[ThreadStack, ...]
    stopped: bool = False
    via: str = ""
    ended: str = ""  # the rank's script had ended, Python was shutting down (rank.progress.script_end's values)

    @property
    def main(self) -> ThreadStack | None:
        """The main thread, or the first thread when the main one is not Python's (embedded interpreters)."""
        for t in self.threads:
            if t.is_main:
                return t
        return self.threads[0] if self.threads else None


@dataclasses.dataclass(frozen=True)
class Unavailable:
    """Why the stack of `pid` could not be had. kind: missing, gone, not-python, permission, timeout, error."""

    pid: int
    kind: str
    reason: str


StackResult = ProcessStack | Unavailable


def find_py_spy() -> str | None:
    """py-spy next to this interpreter (a venv whose bin is not on PATH), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def dump_argv(py_spy: str, pid: int, stopped: bool = False) -> list[str]:
    """The command that prints `pid`'s stacks as JSON; a stopped process is read without pausing it."""
    argv = [py_spy, "dump", "--pid", str(pid), "--json"]
    if stopped:
        argv.append("--nonblocking")  # pausing a stopped process fails ("Failed to suspend process")
    return argv


def parse_dump(pid: int, text: str, stopped: bool = False) -> ProcessStack:
    """py-spy's ``dump --json`` output as a ProcessStack; ValueError if it is not that."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"py-spy printed something that is not JSON: {e}") from None
    if not isinstance(data, list):
        raise ValueError("py-spy's JSON is not a list of threads")
    return ProcessStack(pid, tuple(_thread(t) for t in data), stopped)


TEMPLATE_FILE = os.path.join("detlaunch", "rank", "template.py")


def without_template(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """A thread's frames (innermost first) without the rank template's outermost ones: a warm rank (forked from
    the node's template, rank/template.py) runs its script under them, a cold rank under none, and the two must
    show, and group, as the same stack (a warm node's ranks were once told apart from a cold node's)."""
    end = len(frames)
    while end and frames[end - 1].file.endswith(TEMPLATE_FILE):
        end -= 1
    return frames[:end] if end else frames


def _thread(t: Mapping[str, Any]) -> ThreadStack:
    try:
        frames = without_template(tuple(Frame(str(f["name"]), str(f["filename"]), int(f["line"])) for f in t["frames"]))
        return ThreadStack(name=str(t.get("thread_name") or hex(int(t["thread_id"]))), thread_id=int(t["thread_id"]),
                           active=bool(t.get("active")), frames=frames, owns_gil=bool(t.get("owns_gil")),
                           os_thread_id=t.get("os_thread_id"))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"py-spy's JSON lacks a thread's {e}") from None


_FAULTHANDLER_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
_FAULTHANDLER_MAIN = re.compile(rf"^{faultdump.HEADER} .*\bmain=(0x[0-9a-f]+)", re.M)


def parse_faulthandler(pid: int, text: str) -> ProcessStack | None:
    """The stacks in a faulthandler dump (`PYTHONFAULTHANDLER` and a fatal signal, or
    `faulthandler.register`), for when py-spy cannot read a process; None if `text` holds none.

    faulthandler names threads by id only: the main thread is the one detlaunch's header names
    (faultdump.py), else the one that took the signal ("Current thread"), which is the main
    thread for a signal sent to the process unless it blocks signals.
    """
    threads: list[ThreadStack] = []
    frames: list[Frame] | None = None
    named = _FAULTHANDLER_MAIN.search(text)
    main = int(named.group(1), 16) if named else None
    for line in text.splitlines():
        head = re.match(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$", line)
        if head or line == "Stack (most recent call first):":
            frames = []
            tid = int(head.group(2), 16) if head else 0
            is_main = tid == main if main is not None else head is None or head.group(1) == "Current thread"
            threads.append(ThreadStack("MainThread" if is_main else hex(tid), tid, False, ()))
            continue
        m = _FAULTHANDLER_FRAME.match(line)
        if m and frames is not None:
            frames.append(Frame(m.group(3), m.group(1), int(m.group(2))))
            threads[-1] = dataclasses.replace(threads[-1], frames=without_template(tuple(frames)))
        elif not line.startswith("  "):
            frames = None
    return ProcessStack(pid, tuple(threads)) if threads else None


def process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, D, T, t, Z...), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:][:1].decode()  # the name in parentheses may hold anything


def ptrace_policy() -> str:
    """Why a same-machine ptrace may be refused here, in words (for the 'permission' reason)."""
    try:
        with open(YAMA_SCOPE) as f:
            scope = f.read().strip()
    except OSError:
        return "no Yama on this kernel: it belongs to another user, or a container withholds CAP_SYS_PTRACE"
    meaning = {"0": "any process of the same user", "1": "only descendants, or processes that allowed it "
               "(PR_SET_PTRACER)", "2": "only with CAP_SYS_PTRACE", "3": "nobody"}.get(scope, "unknown")
    return f"kernel.yama.ptrace_scope={scope}: {meaning}"


def undumpable(pid: int) -> bool:
    """A process of this user that even reading its environment is refused for: it made itself
    undumpable (or exec'd something setuid), which refuses ptrace to anyone without CAP_SYS_PTRACE.
    (Yama's policy refuses attaching only, not reading: that is the other reason py-spy is refused.)"""
    try:
        with open(f"/proc/{pid}/status") as f:
            uids = next((line.split()[1:] for line in f if line.startswith("Uid:")), [])
        if int(uids[0]) != os.getuid():
            return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            f.read(1)
    except PermissionError:
        return True
    except (OSError, IndexError, ValueError):
        return False
    return False


def classify_failure(pid: int, returncode: int, stderr: str) -> Unavailable:
    """Turn a failed py-spy run into a one-line reason."""
    state = process_state(pid)
    why = faultdump.dying(pid) if state not in (None, "Z") else ""
    if state is None or state == "Z" or why:
        return gone(pid, why)
    low = stderr.lower()
    if "permission denied" in low or "operation not permitted" in low or "os error 1)" in low:
        why = "it is not dumpable (prctl PR_SET_DUMPABLE 0)" if undumpable(pid) else ptrace_policy()
        return Unavailable(pid, "permission", f"permission denied: py-spy may not ptrace it ({why})")
    if "python version" in low or "python interpreter" in low or "python_version" in low:
        return Unavailable(pid, "not-python", "not a Python process (or an interpreter py-spy does not know)")
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith(" ")]
    first = next((ln for ln in lines if ln.startswith("Error:")), lines[0] if lines else "")
    return Unavailable(pid, "error", f"py-spy exited {returncode}: {first or 'no message'}")


@dataclasses.dataclass
class _Dump:
    pid: int
    stopped: bool
    proc: subprocess.Popen[bytes]
    target: int  # a pidfd of the process being read: it fires when that process exits
    out: bytearray = dataclasses.field(default_factory=bytearray)
    err: bytearray = dataclasses.field(default_factory=bytearray)
    open_fds: int = 3  # stdout, stderr, pidfd: done when all three have closed or fired
    pidfd: int | None = None
    gone: bool = False  # the process exited before py-spy was done: py-spy was stopped


MAX_PARALLEL = 64  # py-spy runs at once: three descriptors each, well under the usual limit of 1024


def collect_stacks(pids: Iterable[int], budget: float = 2.0, py_spy: str | None = None,
                   max_parallel: int = MAX_PARALLEL, fallback: Mapping[int, str] | None = None
                   ) -> dict[int, StackResult]:
    """Every pid's stacks, dumped in parallel (`max_parallel` at a time); what has not answered
    when `budget` seconds have passed since the call is killed.

    One selector waits on every py-spy's output pipes and on a pidfd for its exit: no polling.
    fallback: {pid: its faulthandler file} (faultdump.py), asked for the pids py-spy could not read.
    """
    deadline = time.monotonic() + budget
    pids = list(dict.fromkeys(pids))
    py_spy = py_spy or find_py_spy()
    results: dict[int, StackResult] = {}
    if py_spy is None:
        results = {p: Unavailable(p, "missing", "py-spy is not installed (pip install py-spy)") for p in pids}
    else:
        for i in range(0, len(pids), max_parallel):
            results.update(_dump_batch(py_spy, pids[i:i + max_parallel], deadline, budget))
    fallback = fallback or {}
    retry = {p: fallback[p] for p, r in results.items()
             if p in fallback and isinstance(r, Unavailable) and r.kind in FALLBACK_KINDS}
    if retry:
        results.update(_ask_faulthandlers(retry, results, deadline))
    return {p: results[p] for p in pids}


FALLBACK_KINDS = ("missing", "permission", "not-python", "error")  # what faulthandler may do instead of py-spy
FALLBACK_TIME = 0.5  # seconds faulthandler gets at least, whatever py-spy left of the budget


def _ask_faulthandlers(files: Mapping[int, str], failed: Mapping[int, StackResult],
                       deadline: float) -> dict[int, StackResult]:
    """Each rank's faulthandler, all at once (a thread each: each waits for its dump to end)."""
    deadline = max(deadline, time.monotonic() + FALLBACK_TIME)
    answers: dict[int, StackResult] = {}

    def ask(pid: int, path: str) -> None:
        spy = failed[pid]
        assert isinstance(spy, Unavailable)
        text, why = faultdump.request(path, pid, deadline)
        stack = parse_faulthandler(pid, text) if text else None
        if stack is None:
            answers[pid] = Unavailable(pid, spy.kind, f"{spy.reason}; faulthandler: {why or 'no frames in its dump'}")
        else:
            answers[pid] = dataclasses.replace(with_source(stack), via=f"faulthandler (py-spy: {spy.reason})")

    threads = [threading.Thread(target=ask, args=item, name="faulthandler", daemon=True) for item in files.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def _dump_batch(py_spy: str, pids: list[int], deadline: float, budget: float) -> dict[int, StackResult]:
    # Not at import: the supervisor loads this module once its ranks run (query.py), and subprocess
    # would cost each node ~1 MB while the job runs; importing it here takes ~2 ms, when stacks are asked for.
    import subprocess

    results: dict[int, StackResult] = {}
    dumps: list[_Dump] = []
    env = {**os.environ, "RUST_BACKTRACE": "0"}
    for pid in pids:
        state = process_state(pid)
        why = faultdump.dying(pid) if state not in (None, "Z", "T", "t") else ""
        if state is None or state == "Z" or why:
            results[pid] = gone(pid, why)
            continue
        try:
            target = os.pidfd_open(pid)
        except ProcessLookupError:
            results[pid] = gone(pid)
            continue
        stopped = state in ("T", "t")
        try:
            proc = subprocess.Popen(dump_argv(py_spy, pid, stopped), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        except OSError as e:
            os.close(target)
            kind = "missing" if e.errno in (errno.ENOENT, errno.EACCES, errno.ENOEXEC) else "error"
            results[pid] = Unavailable(pid, kind, f"cannot run {py_spy}: {e.strerror}")
            continue
        d = _Dump(pid, stopped, proc, target)
        try:  # at once: a supervisor reaps every child that exits (waitpid(-1)), and then there is no pid
            d.pidfd = os.pidfd_open(proc.pid)
        except ProcessLookupError:  # it has exited (and was reaped) already: its pipes say the rest
            d.open_fds -= 1
        dumps.append(d)
    with selectors.DefaultSelector() as sel:
        for d in dumps:
            assert d.proc.stdout and d.proc.stderr
            sel.register(d.proc.stdout, selectors.EVENT_READ, (d, d.out))
            sel.register(d.proc.stderr, selectors.EVENT_READ, (d, d.err))
            if d.pidfd is not None:
                sel.register(d.pidfd, selectors.EVENT_READ, (d, None))
            sel.register(d.target, selectors.EVENT_READ, (d, TARGET))
        pending = len(dumps)
        while pending:
            left = deadline - time.monotonic()
            events = sel.select(left) if left > 0 else []
            if not events:
                break
            for key, _ in events:
                d, buf = key.data
                if key.fileobj not in sel.get_map():
                    continue  # py-spy's own fds, dropped in this round when its target exited
                if buf is TARGET:  # the process py-spy reads exited: stop waiting for py-spy
                    sel.unregister(key.fd)
                    if d.open_fds:
                        pending -= 1
                        d.gone = True
                        for fileobj in (d.proc.stdout, d.proc.stderr, d.pidfd):
                            if fileobj is not None and fileobj in sel.get_map():
                                sel.unregister(fileobj)
                    continue
                data = os.read(key.fd, 1 << 16) if buf is not None else b""
                if data:
                    buf.extend(data)
                    continue
                sel.unregister(key.fileobj)
                d.open_fds -= 1
                pending -= d.open_fds == 0
    for d in dumps:
        os.close(d.target)
        if d.pidfd is not None:
            os.close(d.pidfd)
        if d.gone or d.open_fds:
            d.proc.send_signal(signal.SIGKILL)  # by its PID: it is our child
            d.proc.wait()
            results[d.pid] = (_finished_before(d) or gone(d.pid, "it exited while its stack was being taken")
                              if d.gone else
                              Unavailable(d.pid, "timeout", f"py-spy did not answer within {budget:g} s"))
        else:
            results[d.pid] = _result(d, d.proc.wait())
        for pipe in (d.proc.stdout, d.proc.stderr):
            if pipe:
                pipe.close()
    return results


TARGET = object()  # the selector's mark for a target's pidfd (py-spy's own fds carry their buffer, or None)


def gone(pid: int, why: str = "") -> Unavailable:
    """A process that is not there to be read: exited, or on its way out (faultdump.dying's words)."""
    return Unavailable(pid, "gone", why if why and why != "it has exited" else "the process has exited")


def _finished_before(d: _Dump) -> ProcessStack | None:
    """What py-spy had printed when its target exited, if it is a whole stack (it was read just before)."""
    try:
        return with_source(parse_dump(d.pid, d.out.decode(errors="replace"), d.stopped)) if d.out else None
    except ValueError:
        return None


def _result(d: _Dump, returncode: int) -> StackResult:
    # A supervisor reaps every child that exits (waitpid(-1)), py-spy included: Popen then sees 0.
    # A py-spy that printed nothing on stdout failed, whatever its code says; its stderr tells why.
    if returncode != 0 or (not d.out.strip() and d.err.strip()):
        return classify_failure(d.pid, returncode, d.err.decode(errors="replace"))
    try:
        stack = parse_dump(d.pid, d.out.decode(errors="replace"), d.stopped)
    except ValueError as e:
        return Unavailable(d.pid, "error", str(e))
    return with_source(stack)


def with_source(stack: ProcessStack) -> ProcessStack:
    """Add the source line of each thread's innermost frame: it names the call that blocks (time.sleep(30))."""
    threads = []
    for t in stack.threads:
        if t.frames and not t.frames[0].code:
            f = t.frames[0]
            t = dataclasses.replace(t, frames=(dataclasses.replace(f, code=linecache.getline(f.file, f.line).strip()),
                                               *t.frames[1:]))
        threads.append(t)
    return dataclasses.replace(stack, threads=tuple(threads))


def to_json(result: StackResult) -> dict[str, Any]:
    """A result as plain JSON data (to ship over the job link, or print)."""
    if isinstance(result, Unavailable):
        return {"pid": result.pid, "unavailable": result.kind, "reason": result.reason}
    return {"pid": result.pid, "stopped": result.stopped, "via": result.via, "ended": result.ended, "threads": [
        {"name": t.name, "thread_id": t.thread_id, "active": t.active, "owns_gil": t.owns_gil,
         "os_thread_id": t.os_thread_id, "frames": [dataclasses.asdict(f) for f in t.frames]}
        for t in result.threads]}


def from_json(data: Mapping[str, Any]) -> StackResult:
    """The inverse of to_json; ValueError on anything else."""
    try:
        if "unavailable" in data:
            return Unavailable(int(data["pid"]), str(data["unavailable"]), str(data["reason"]))
        threads = tuple(ThreadStack(str(t["name"]), int(t["thread_id"]), bool(t["active"]),
                                    tuple(Frame(str(f["function"]), str(f["file"]), int(f["line"]), str(f["code"]))
                                          for f in t["frames"]),
                                    bool(t["owns_gil"]), t["os_thread_id"]) for t in data["threads"])
        return ProcessStack(int(data["pid"]), threads, bool(data["stopped"]), str(data.get("via") or ""),
                            str(data.get("ended") or ""))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not a stack: {e!r}") from None
