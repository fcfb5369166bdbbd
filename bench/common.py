"""What every measurement shares: paths, the environment, running one job and timing it, statistics.

The bench process makes itself a child subreaper: every process a job starts, even
one that double-forks or outlives its parent, stays a descendant of the bench. So
"every process of the job is gone" is exact (no live descendant left), it is noticed
at once (the last process to die is always re-parented to us, so its death is a
SIGCHLD here), and whatever a job leaves behind can be killed by PID.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil
from detlaunch.system import procs
from detlaunch.testing import free_port as free_port  # a port below the ephemeral range (see its docstring)
from detlaunch.testing.runner import processes_with_marker

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SCRIPTS = BENCH / "scripts"
VENV = Path(os.environ.get("DETLAUNCH_VENV", ROOT / ".venv"))
DET_VENV = Path(os.environ.get("DETERMINED_VENV", ROOT / ".venv-determined"))
PY = str(VENV / "bin" / "python")
DET_PY = str(DET_VENV / "bin" / "python")
DETLAUNCH = str(VENV / "bin" / "detlaunch")
WRAPPER = str(ROOT / "core" / "detlaunch" / "rank" / "run_wrapper.py")  # the wrapper as the supervisor starts it
MARKER = "DETLAUNCH_BENCH_RUN"  # every job's environment carries it: a safety net for leaks


class NotAvailable(Exception):
    """A case that cannot run here (a layer not built yet, a tool missing): reported as n/a."""


# -- the process side ------------------------------------------------------------------------

def become_subreaper() -> None:
    procs.become_subreaper()
    # SIGCHLD wakes the wait loop through this pipe (no polling for the end of a job).
    global _wake_r
    _wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)


_wake_r = -1


def base_env(tmp: Path) -> dict[str, str]:
    """The environment of every job: our venv first on PATH, a bench-owned TMPDIR, CPU DeepSpeed."""
    env = dict(os.environ)
    # PYTHONDONTWRITEBYTECODE would make every detlaunch recompile its own modules (~50 ms a start):
    # an installed detlaunch has its .pyc files, so the bench lets them be written (__pycache__ is ignored).
    for name in ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "DETLAUNCH_SUPERVISOR", "DETLAUNCH_SSHD_SUPERVISOR",
                 "DET_CHIEF_IP", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "VIRTUAL_ENV"):
        env.pop(name, None)
    env["PATH"] = f"{VENV / 'bin'}:{env.get('PATH', os.defpath)}"
    env["TMPDIR"] = str(tmp)
    env["DS_ACCELERATOR"] = "cpu"
    env["OMP_NUM_THREADS"] = "1"
    return env


@dataclasses.dataclass
class Run:
    """One job: when it started, when its top process's exit was seen, when its last process was gone."""

    argv: list[str]
    code: int | None  # exit code of the top process (128+N for a signal); None when it timed out
    start: float  # time.monotonic() (CLOCK_MONOTONIC, comparable across processes)
    exited: float
    gone: float
    maxrss_kb: int  # the top process's peak RSS, and its waited-for descendants' (wait4)
    stderr: str
    leaked: list[int]

    @property
    def end(self) -> float:
        """The job is over: exit code observed AND no process of it left."""
        return max(self.exited, self.gone)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def check(self, *codes: int) -> Run:
        if self.code is None:
            raise RuntimeError(f"timed out: {' '.join(self.argv)}\n{self.stderr[-2000:]}")
        if codes and self.code not in codes:
            raise RuntimeError(f"exit {self.code} (expected {codes}): {' '.join(self.argv)}\n{self.stderr[-2000:]}")
        if self.leaked:
            raise RuntimeError(f"left processes behind {self.leaked}: {' '.join(self.argv)}")
        return self


SESSION_VAR = "DETLAUNCH_BENCH_SESSION"  # every process the bench starts inherits it: the last leak check
_services: set[int] = set()
_libc = ctypes.CDLL(None, use_errno=True)  # processes the bench keeps up across jobs (a standalone sshd): not a job's


def live_descendants(services: bool = False) -> list[psutil.Process]:
    """Live processes below the bench; without `services`, not the services nor what they started."""
    skip: set[int] = set()
    if not services:
        for pid in _services:
            skip.add(pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                skip.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid not in skip and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def start_service(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a helper the jobs use (not part of any job), in a session of its own, for the bench's life.

    It gets SIGTERM if the bench dies, however it dies (PR_SET_PDEATHSIG); stop it with stop_service().
    """
    bench = os.getpid()

    def die_with_the_bench() -> None:
        _libc.prctl(procs.PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != bench:  # the bench died before the line above
            os._exit(1)

    with open(log, "wb") as out:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, preexec_fn=die_with_the_bench)
    _services.add(proc.pid)
    return proc


def stop_service(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the service's process group, SIGKILL it after 5 s, and reap it."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    _services.discard(proc.pid)


def kill_groups(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGKILL each process's group (each was started in a session of its own) and reap it: a bench's nodes."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def nothing_left() -> Iterator[None]:
    """Run the bench so that it leaves no process behind, however it ends.

    SIGTERM and SIGHUP end it as Ctrl-C does (through every finally block); at the end every process
    below the bench is SIGKILLed by PID, then any process that escaped the tree but carries this run's
    session variable (as the tests check with their marker).
    """
    session = uuid.uuid4().hex
    os.environ[SESSION_VAR] = session  # before any job's environment is made: everything inherits it

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        killed = kill_descendants(services=True)
        escaped = processes_with_marker(f"{SESSION_VAR}={session}")
        for pid in escaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if killed or escaped:
            say(f"killed leftover processes {sorted({*killed, *escaped})}")


def kill_descendants(services: bool = False) -> list[int]:
    """SIGKILL every live process below the bench (with `services`, those too), by PID; return their PIDs."""
    pids = []
    for p in live_descendants(services):
        try:
            p.kill()
            pids.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def _drain_wakeups() -> None:
    try:
        while os.read(_wake_r, 4096):
            pass
    except BlockingIOError:
        pass


def run(argv: Sequence[str], env: dict[str, str], *, timeout: float = 180, stdout: int | None = None,
        tick: Callable[[], None] | None = None, tick_every: float = 0.005, cwd: Path | None = None) -> Run:
    """Start `argv` in its own session and wait until it exited AND every process it started is gone.

    tick(), when given, is called every `tick_every` seconds while the job runs.
    """
    run_id = uuid.uuid4().hex
    env = {**env, MARKER: run_id}
    err_path = Path(env["TMPDIR"]) / f"stderr-{run_id}"
    _drain_wakeups()
    with open(err_path, "wb") as err:
        start = time.monotonic()
        proc = subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL, cwd=cwd,
                                stdout=subprocess.DEVNULL if stdout is None else stdout,
                                stderr=err, start_new_session=True)
    code: int | None = None
    exited = gone = 0.0
    maxrss = 0
    deadline = start + timeout
    look = False  # is it time to look for live descendants? (only after the top process exited)
    while True:
        # We reap everything that ends up as our child (the job's top process, and orphans).
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == proc.pid:
                code = _exit_code(status)
                proc.returncode = code
                exited = time.monotonic()
                maxrss = usage.ru_maxrss
                look = True
        if look and not live_descendants():
            gone = time.monotonic()
            break
        now = time.monotonic()
        if now >= deadline:
            _kill_job(proc)
            code, exited, gone = None, now, now
            break
        # Wait for a SIGCHLD (the last process of a job always dies as our child), a tick,
        # or, as a safety net after the top process exited, 50 ms.
        wait = deadline - now
        if tick is not None and proc.returncode is None:
            tick()
            wait = min(wait, tick_every)
        if proc.returncode is not None:
            wait = min(wait, 0.05)
        select.select([_wake_r], [], [], wait)
        _drain_wakeups()
        look = proc.returncode is not None
    leaked = _leaked(run_id)
    stderr = err_path.read_text(errors="replace")
    err_path.unlink()
    return Run(list(argv), code, start, exited, gone, maxrss, stderr, leaked)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _kill_job(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    kill_descendants()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == proc.pid:
            proc.returncode = -9


def _leaked(run_id: str) -> list[int]:
    """Processes carrying this run's marker that escaped the bench's tree (none should): killed by PID."""
    found = processes_with_marker(f"{MARKER}={run_id}")
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return found


# -- layers ------------------------------------------------------------------------------------

_layer_status: dict[str, str] | None = None
_layer_checked: dict[str, str] = {}  # layer -> "" (works) or why not


def detlaunch_layer(layer: str, env: dict[str, str], dry_run_args: Sequence[str]) -> None:
    """Raise NotAvailable unless `detlaunch layers` says the layer loaded and a dry run of a job works.

    Checked once per layer and bench run.
    """
    global _layer_status
    if layer not in _layer_checked:
        if _layer_status is None:
            out = subprocess.run([DETLAUNCH, "layers", "--format", "json"], env=env, capture_output=True, text=True)
            try:
                _layer_status = {e["name"]: e["status"] for e in json.loads(out.stdout)}
            except ValueError:
                _layer_status = {}
        why = ""
        if _layer_status.get(layer) != "loaded":
            why = f"layer not available ({_layer_status.get(layer, 'not installed')})"
        else:
            dry = subprocess.run([DETLAUNCH, "--layer", layer, "--dry-run", *dry_run_args], env=env,
                                 capture_output=True, text=True)
            if dry.returncode != 0:
                last = (dry.stderr.strip().splitlines() or ["dry run failed"])[-1]
                why = f"layer not available: {last.removeprefix('detlaunch: error: ')}"
        _layer_checked[layer] = why
    if _layer_checked[layer]:
        raise NotAvailable(_layer_checked[layer])


# -- statistics ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Stat:
    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def lo(self) -> float:
        return min(self.samples)

    @property
    def hi(self) -> float:
        return max(self.samples)

    def fmt(self, unit: str = "s", digits: int = 2) -> str:
        """'1.23 s (1.10-1.40)': the median, and the spread as min-max over the repetitions."""
        if len(self.samples) == 1:
            return f"{self.median:.{digits}f} {unit}".strip()
        return f"{self.median:.{digits}f} {unit} ({self.lo:.{digits}f}-{self.hi:.{digits}f})"


CASES_WITH: list[str] = []  # --cases TEXT: only the cases whose name holds TEXT (bench/__main__.py sets it)


def interleaved(reps: int, cases: Sequence[str]) -> list[tuple[int, str]]:
    """Every case once per repetition, the order rotated each time, so drift and load hit all alike."""
    cases = [c for c in cases if not CASES_WITH or any(text in c for text in CASES_WITH)]
    order = []
    for rep in range(reps):
        shift = rep % len(cases)
        order += [(rep, c) for c in [*cases[shift:], *cases[:shift]]]
    return order


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Table:
    """One Markdown table of the report."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Panel:
    """One panel of the PNG chart: bars (one per label) with min-max error bars, or lines over x."""

    title: str
    ylabel: str
    labels: list[str]
    stats: list[Stat | None]
    x: list[float] | None = None  # set: a line chart over x, one series per label
    series: dict[str, list[Stat | None]] | None = None
    goal: float | None = None  # a horizontal line


@dataclasses.dataclass
class Goal:
    what: str
    target: str
    measured: str
    met: bool | None  # None: not measured


@dataclasses.dataclass
class Section:
    name: str
    tables: list[Table]
    panels: list[Panel]
    goals: list[Goal]


def print_section(section: Section) -> None:
    """A measurement run on its own (`python -m bench.NAME`): its tables and goals as Markdown."""
    for t in section.tables:
        print(f"\n## {t.title}\n\n| {' | '.join(t.columns)} |\n|{'---|' * len(t.columns)}")
        for r in t.rows:
            print(f"| {' | '.join(r)} |")
        for note in t.notes:
            print(f"- {note}")
    for g in section.goals:
        met = "met" if g.met else "not met" if g.met is False else "-"
        print(f"- goal: {g.what}: {g.target}: {g.measured} ({met})")
