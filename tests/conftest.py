"""Shared test machinery: run detlaunch for real, and fail any test that leaves a process behind.

Every detlaunch a test starts carries DETLAUNCH_TEST_ID=<unique> in its environment;
every process of the job inherits it (through torchrun, horovodrun's ssh exports,
deepspeed's env file). After each test, any live process still carrying the test's id
is a leak: the test fails and those processes are killed by PID.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from detlaunch.testing.runner import describe_processes, processes_with_marker

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
DETLAUNCH = [sys.executable, "-m", "detlaunch"]


@dataclasses.dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    duration: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def lines(self, stream: str = "stdout") -> list[str]:
        return getattr(self, stream).splitlines()


class Job:
    """One detlaunch process started by a test, in its own process group."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], cwd: Path, log_dir: Path):
        self.argv = list(argv)
        self.out_path = log_dir / f"out-{uuid.uuid4().hex[:8]}"
        self.err_path = self.out_path.with_suffix(".err")
        self.started = time.monotonic()
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(self.argv, env=env, cwd=cwd, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait(self, timeout: float = 120) -> Result:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"detlaunch did not finish within {timeout} s:\n{self.read()}") from None
        return Result(self.proc.returncode, self.out_path.read_text(errors="replace"),
                      self.err_path.read_text(errors="replace"), time.monotonic() - self.started)

    def read(self) -> str:
        return self.out_path.read_text(errors="replace") + self.err_path.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 60) -> None:
        """Wait until `text` appears in the job's output (inotify is overkill for a test: 20 ms steps)."""
        deadline = time.monotonic() + timeout
        while text not in self.read():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never saw {text!r}; output so far:\n{self.read()}")
            time.sleep(0.02)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


class Launcher:
    """Starts detlaunch jobs for one test and knows that test's marker."""

    def __init__(self, tmp_path: Path):
        self.marker = f"DETLAUNCH_TEST_ID={uuid.uuid4().hex}"
        self.tmp_path = tmp_path
        self.jobs: list[Job] = []
        tmp = tmp_path / "tmp"
        tmp.mkdir()
        key, value = self.marker.split("=")
        self.env = {**os.environ, key: value, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1",
                    "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def start(self, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT,
              prefix: Sequence[str] = ()) -> Job:
        """Start detlaunch; `prefix` runs it through another command (runuser, ip netns exec)."""
        job = Job([*prefix, *DETLAUNCH, *args], {**self.env, **(env or {})}, cwd, self.tmp_path)
        self.jobs.append(job)
        return job

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Result:
        return self.start(*args, env=env).wait(timeout)

    def leftovers(self, settle: float = 2.0) -> list[int]:
        """Processes of this test's jobs still alive, allowing `settle` s for in-flight exits."""
        deadline = time.monotonic() + settle
        while True:
            pids = processes_with_marker(self.marker)
            if not pids or time.monotonic() > deadline:
                return pids
            time.sleep(0.05)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    """Run detlaunch for real; fail the test if any process of its jobs outlives it."""
    launcher = Launcher(tmp_path)
    yield launcher
    for job in launcher.jobs:
        if job.proc.poll() is None:
            job.kill()
    left = launcher.leftovers()
    if left:
        text = describe_processes(left)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"processes of the job were left running:\n{text}")
