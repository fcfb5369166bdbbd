"""Run the real ``detlaunch`` command in a sandbox, and find every process it left behind.

Each :class:`DetlaunchRunner` puts a unique marker variable into the environment of the
``detlaunch`` processes it starts. Every process of the job inherits it (through the
launcher, the rank wrappers, the ranks), so after the job a scan of ``/proc/*/environ``
finds anything still alive that belongs to it. Leftovers are killed by PID and reported.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

MARKER_VAR = "DETLAUNCH_CONTRACT_ID"
DETLAUNCH = (sys.executable, "-m", "detlaunch")


def processes_with_marker(marker: str) -> list[int]:
    """PIDs of live (not zombie) processes whose environment holds `marker` (``NAME=value``)."""
    needle = marker.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def describe_processes(pids: Sequence[int]) -> str:
    lines = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "(gone)"
        lines.append(f"  pid {pid}: {cmd[:200]}")
    return "\n".join(lines)


def rank_lines(text: str, rank: int) -> list[str]:
    """The lines of `rank` in `text`, ``[rank=N] `` prefix removed, in the order they arrived."""
    prefix = f"[rank={rank}] "
    return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]


@dataclasses.dataclass(frozen=True)
class Completed:
    """One finished ``detlaunch`` run."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration: float

    @property
    def output(self) -> str:
        return f"$ {' '.join(self.argv)}\n--- stdout ---\n{self.stdout}--- stderr ---\n{self.stderr}"

    def rank_lines(self, rank: int) -> list[str]:
        """stdout lines of `rank`, without their ``[rank=N] `` prefix."""
        return rank_lines(self.stdout, rank)


class DetlaunchRunner:
    """Starts ``detlaunch`` (the installed command, through this Python) for one test.

    - ``env``: this process's environment, plus the marker, a private TMPDIR and
      XDG_CACHE_HOME (so the shared job directory lands under `tmp_path`);
    - each run is its own session, killed as a whole group if it outlives its timeout;
    - :meth:`assert_no_leftovers` fails, after killing them by PID, when any process
      carrying the marker is still alive.
    """

    def __init__(self, tmp_path: Path):
        self.marker_value = uuid.uuid4().hex
        self.marker = f"{MARKER_VAR}={self.marker_value}"
        self.root = tmp_path
        self.tmpdir = tmp_path / "detlaunch-tmp"
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self.cache = tmp_path / "detlaunch-cache"
        env = {k: v for k, v in os.environ.items() if k != MARKER_VAR}
        self.env: dict[str, str] = {**env, MARKER_VAR: self.marker_value, "TMPDIR": str(self.tmpdir),
                                    "XDG_CACHE_HOME": str(self.cache), "PYTHONUNBUFFERED": "1"}
        self._live: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, env: Mapping[str, str] | None = None, cwd: Path | str | None = None,
              command: Sequence[str] = DETLAUNCH) -> Running:
        """Start ``detlaunch ARGS`` in its own session (stdin closed); see :class:`Running`."""
        running = Running(self, (*command, *args), {**self.env, **(env or {})}, Path(cwd or self.root))
        self._live.append(running.proc)
        return running

    def run(self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120,
            cwd: Path | str | None = None, command: Sequence[str] = DETLAUNCH) -> Completed:
        """Run ``detlaunch ARGS`` to completion; kill its whole session if it outlives `timeout`."""
        return self.start(*args, env=env, cwd=cwd, command=command).wait(timeout)

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def forget(self, proc: subprocess.Popen[bytes]) -> None:
        if proc in self._live:
            self._live.remove(proc)

    def leftovers(self, settle: float = 2.0) -> list[int]:
        """Processes of this runner's jobs still alive, allowing `settle` s for exits in flight."""
        deadline = time.monotonic() + settle
        while True:
            pids = processes_with_marker(self.marker)
            if not pids or time.monotonic() > deadline:
                return pids
            time.sleep(0.05)

    def assert_no_leftovers(self, settle: float = 2.0) -> None:
        """Fail when a process of this runner's jobs is alive; kill each one by PID first."""
        left = self.leftovers(settle)
        if not left:
            return
        text = describe_processes(left)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise AssertionError(f"processes of the job were left running (now killed):\n{text}")

    def close(self) -> None:
        """Kill any run still going (its session), e.g. after a test failed half-way."""
        for proc in self._live:
            if proc.poll() is None:
                self._kill(proc)
        self._live.clear()


class Running:
    """One ``detlaunch`` started by a :class:`DetlaunchRunner`, its output going to files."""

    def __init__(self, runner: DetlaunchRunner, argv: tuple[str, ...], env: Mapping[str, str], cwd: Path):
        self.runner, self.argv = runner, argv
        self.out_path = runner.root / f"run-{uuid.uuid4().hex[:8]}.out"
        self.err_path = self.out_path.with_suffix(".err")
        self.started = time.monotonic()
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(argv, env=dict(env), cwd=cwd, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def read(self) -> str:
        return self.out_path.read_text(errors="replace") + self.err_path.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 60) -> None:
        """Wait until `text` appears in the output (tests only: 20 ms steps)."""
        deadline = time.monotonic() + timeout
        while text not in self.read():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never saw {text!r}; output so far:\n{self.read()}")
            time.sleep(0.02)

    def supervisor_pid(self) -> int:
        """The pid of this node's supervisor: the first process below detlaunch in another PID
        namespace when the job runs in one of its own (detlaunch.system.isolation), else detlaunch itself."""
        try:
            own = os.readlink(f"/proc/{self.proc.pid}/ns/pid")
        except OSError:
            return self.proc.pid
        queue = [self.proc.pid]
        while queue:
            pid = queue.pop(0)
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") != own:
                    return pid
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    queue += [int(c) for c in f.read().split()]
            except OSError:
                continue
        return self.proc.pid

    def host_pid(self, pid: int) -> int:
        """A pid that a process of this job printed about itself, as this test sees it.

        The job's processes live in a PID namespace of their own, so the pid a rank prints
        (os.getpid()) is that namespace's; signals and /proc here need this machine's.
        """
        from detlaunch.link.control import host_pids

        return host_pids(self.supervisor_pid()).get(pid, pid)

    def send_signal(self, signum: int) -> None:
        """Signal ``detlaunch`` itself (as a user's kill would; a terminal's Ctrl-C also reaches only it,
        since everything it starts runs in sessions of its own)."""
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 120) -> Completed:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            DetlaunchRunner._kill(self.proc)
            self.runner.forget(self.proc)
            raise AssertionError(f"{' '.join(self.argv)} did not finish within {timeout:g} s; "
                                 f"output:\n{self.read()}") from None
        self.runner.forget(self.proc)
        return Completed(self.argv, self.proc.returncode, self.out_path.read_text(errors="replace"),
                         self.err_path.read_text(errors="replace"), time.monotonic() - self.started)
