"""The bench leaves nothing behind, however it ends: run for real (its multi-node piece, one repetition of
its horovod cases, with the standalone sshd of the bare-horovodrun baseline), to the end and interrupted.

Every process the bench starts inherits this test's marker variable (the bench copies its environment
into every job's), so after the bench has exited any live process carrying it is a leak. sshd rewrites
its environment (its process title), so a process whose command line names the bench's temp dir (the
sshd's config lies there) is one of the bench's too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from detlaunch.testing.runner import describe_processes, processes_with_marker
from support.helpers import wait_until
from support.jobs import ROOT

MARKER = "DETLAUNCH_BENCH_TEST"


class Bench:
    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.tmp = tmp_path
        self.marker = f"{MARKER}={uuid.uuid4().hex}"
        self.out = tmp_path / "results"
        env = {**os.environ, MARKER: self.marker.split("=", 1)[1], "DETLAUNCH_VENV": sys.prefix,
               "TMPDIR": str(tmp_path)}
        # SIGINT as a terminal gives it, whatever this test inherited (a shell's background job starts
        # with SIGINT ignored, and Python then keeps it ignored).
        start = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                 "sys.argv[0] = 'bench'; runpy.run_module('bench', run_name='__main__', alter_sys=True)")
        self.proc = subprocess.Popen([sys.executable, "-c", start, "--only", "multinode", "--cases", "horovod",
                                      "--reps", "1", "--out", str(self.out), *args], cwd=ROOT, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.lines: list[str] = []

    def wait_for_line(self, start: str) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith(start):
                return
        raise AssertionError(f"the bench ended before {start!r}:\n{''.join(self.lines)}")

    def finish(self, timeout: float) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, "".join(self.lines) + err

    def processes(self) -> list[int]:
        """Live processes of this bench: with the marker, or naming its temp dir (not the bench itself)."""
        named = [pid for pid in _pids() if pid != self.proc.pid and str(self.tmp) in " ".join(_cmdline(pid))
                 and _alive(pid)]
        return sorted({*processes_with_marker(self.marker), *named} - {self.proc.pid})

    def leftovers(self, settle: float) -> list[int]:
        try:
            wait_until(lambda: not self.processes(), settle, "the bench's processes to end")
        except AssertionError:
            pass
        return self.processes()

    def kill_all(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def bench_run(tmp_path: Path) -> Iterator[list[Bench]]:
    started: list[Bench] = []
    yield started
    for b in started:
        b.kill_all()


@pytest.mark.timeout(400)
def test_a_short_bench_run_leaves_nothing(real_processes: None, tmp_path: Path, bench_run: list[Bench]) -> None:
    bench = Bench(tmp_path)
    bench_run.append(bench)
    code, out, err = bench.finish(360)
    assert code == 0, err[-3000:]
    assert "Multi-node start: 2 nodes" in out
    assert "bare horovodrun, 2x2" in (bench.out / "results.md").read_text()
    assert "killed leftover" not in err, err[-3000:]  # nothing needed killing: every case stopped its own
    left = bench.leftovers(settle=5)
    assert left == [], describe_processes(left)
    assert [p.name for p in tmp_path.iterdir()] == ["results"]  # its temp dir (the sshd's keys) is gone


@pytest.mark.timeout(200)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_bench_leaves_nothing(real_processes: None, tmp_path: Path, bench_run: list[Bench],
                                             sig: signal.Signals) -> None:
    bench = Bench(tmp_path)
    bench_run.append(bench)
    bench.wait_for_line("[bench] multinode: ")  # the standalone sshd is up, a job is starting
    running = bench.processes()
    assert any("sshd" in " ".join(_cmdline(pid)) for pid in running), describe_processes(running)
    bench.proc.send_signal(sig)
    code, _, err = bench.finish(120)
    assert code == (-sig if sig == signal.SIGKILL else 128 + sig), err[-3000:]
    if sig != signal.SIGKILL:
        assert "Traceback" not in err, err[-3000:]
    # SIGKILL cannot be caught: the sshd goes by its death signal; a job already started ends by itself.
    left = bench.leftovers(settle=60 if sig == signal.SIGKILL else 5)
    assert left == [], describe_processes(left)


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
