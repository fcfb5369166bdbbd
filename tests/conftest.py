"""Shared test machinery: run detlaunch for real, and fail any test that leaves a process behind.

The suite uses the runner the package ships to plugin authors (detlaunch.testing.runner): every
detlaunch a test starts carries a unique marker variable in its environment; every process of the
job inherits it (through torchrun, horovodrun's ssh exports, deepspeed's env file). After each
test, any live process still carrying the test's marker is a leak: the test fails and those
processes are killed by PID.
"""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from detlaunch.testing.runner import DETLAUNCH, DetlaunchRunner, Running

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCRIPTS = Path(__file__).resolve().parent / "scripts"

Job = Running  # one detlaunch started by a test, in a session of its own


class Launcher(DetlaunchRunner):
    """The shipped runner, with the suite's habits: jobs run from the repository root, and `prefix`
    runs detlaunch through another command (runuser, ip netns exec)."""

    def start(self, *args: str, env: Mapping[str, str] | None = None, cwd: Path | str | None = None,
              command: Sequence[str] = DETLAUNCH, prefix: Sequence[str] = ()) -> Running:
        return super().start(*args, env=env, cwd=cwd or ROOT, command=(*prefix, *command))


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    """Run detlaunch for real; fail the test if any process of its jobs outlives it."""
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.close()
    launcher.assert_no_leftovers()


@pytest.fixture
def throwaway_user() -> Iterator[pwd.struct_passwd]:
    """An ordinary user of the test's own (root only), removed after. Ask for it before `launcher`, so
    that the leftover check runs first (pytest ends fixtures in reverse order)."""
    if os.getuid() != 0:
        pytest.skip("needs root to create a test user")
    name = f"dlspy{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Why each rerun test failed the first time (pytest-rerunfailures only names it): a flake that
    passes on its second run must still be diagnosable from one CI log."""
    reruns = terminalreporter.stats.get("rerun", [])
    if not reruns:
        return
    terminalreporter.section("first failures of the tests that were run again")
    for report in reruns:
        text = report.longreprtext
        if len(text) > 6000:  # the assertion and the job's output are at the end
            text = "...\n" + text[-6000:]
        terminalreporter.write_line(f"--- {report.nodeid}")
        terminalreporter.write_line(text)
