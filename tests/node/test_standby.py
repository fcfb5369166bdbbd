"""A launcher started ahead of time (standby.py): it imports its module first, runs the entry point
with the command's arguments on its go, and is never used for a command it was not started for.
Real processes (a plain Python module stands in for torchrun's), a fraction of a second each."""

from __future__ import annotations

import os
import select
import sys
from pathlib import Path

import pytest
from detlaunch.node.standby import Standby, entry_argv

pytestmark = pytest.mark.timeout(30)

LAUNCHER = """
import sys
print("imported", flush=True)
def main():
    print("argv", sys.argv, flush=True)
    return 3
"""


def read_all(fd: int) -> str:
    """Everything the process wrote, until it closed its output (it exited)."""
    data = b""
    while select.select([fd], [], [], 10)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data.decode()


def launcher_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "fake_launcher.py").write_text(LAUNCHER)
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}


def test_the_standby_imports_first_then_runs_the_entry_point_with_the_commands_arguments(real_processes: None,
                                                                                         tmp_path: Path) -> None:
    env = launcher_env(tmp_path)
    argv = (sys.executable, "-m", "fake_launcher", "--nproc-per-node", "2", "train.py")
    standby = Standby.spawn(argv, env, "fake_launcher:main")
    assert standby is not None
    assert os.read(standby.output_fd, 100) == b"imported\n"  # past its imports, before its go
    assert standby.fits(argv, env) and not standby.fits(argv, {**env, "X": "1"})
    assert not standby.fits((*argv, "more"), env)
    assert standby.go()
    out = read_all(standby.output_fd)
    assert out == "argv ['fake_launcher', '--nproc-per-node', '2', 'train.py']\n", out
    _, status = os.waitpid(standby.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3  # the entry point's return value is the exit code
    os.close(standby.output_fd)


def test_a_standby_not_needed_is_stopped_and_runs_nothing(real_processes: None, tmp_path: Path) -> None:
    env = launcher_env(tmp_path)
    standby = Standby.spawn((sys.executable, "-m", "fake_launcher"), env, "fake_launcher:main")
    assert standby is not None
    fd = os.dup(standby.output_fd)
    standby.stop()
    assert read_all(fd) in ("", "imported\n")
    os.close(fd)
    _, status = os.waitpid(standby.pid, 0)
    assert os.waitstatus_to_exitcode(status) == -9


def test_a_standby_that_died_idle_says_so_and_the_command_starts_cold(real_processes: None, tmp_path: Path) -> None:
    env = launcher_env(tmp_path)
    (tmp_path / "fake_launcher.py").write_text("raise SystemExit(5)\n")  # its import fails
    standby = Standby.spawn((sys.executable, "-m", "fake_launcher"), env, "fake_launcher:main")
    assert standby is not None
    _, status = os.waitpid(standby.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 5
    assert not standby.go()  # EPIPE: nobody reads the go
    os.close(standby.output_fd)


def test_only_a_python_dash_m_command_of_that_module_gets_a_standby() -> None:
    assert entry_argv(("python", "-m", "torch.distributed.run", "a"), "torch.distributed.run:main") == \
        ["torch.distributed.run", "a"]
    assert entry_argv(("torchrun", "a"), "torch.distributed.run:main") is None
    assert entry_argv(("python", "-m", "other", "a"), "torch.distributed.run:main") is None
    assert Standby.spawn(("torchrun", "a"), {}, "torch.distributed.run:main") is None
