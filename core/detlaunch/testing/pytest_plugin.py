"""pytest plugin (``pytest11`` entry point ``detlaunch``): the fixtures of detlaunch's test support.

- ``detlaunch_runner``: a :class:`~detlaunch.testing.runner.DetlaunchRunner` for the test. At
  teardown it kills any run still going and fails the test if any process of its jobs is
  still alive (each is killed by PID first).

At the end of the run, the checks a layer's declarations ruled out are listed (the
"declared by the layer" skips of :class:`~detlaunch.testing.LayerContract`), so that what a
layer cannot do is always in plain sight. This module is imported by every pytest run in an
environment where detlaunch is installed: it imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from detlaunch.testing.capabilities import DECLARED
from detlaunch.testing.runner import DetlaunchRunner


@pytest.fixture
def detlaunch_runner(tmp_path: Path) -> Iterator[DetlaunchRunner]:
    """Run the real ``detlaunch`` command; fail the test if a process of its jobs outlives it."""
    runner = DetlaunchRunner(tmp_path)
    try:
        yield runner
    finally:
        runner.close()
    runner.assert_no_leftovers()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    declared = []
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")
        if DECLARED in reason:
            declared.append(f"{report.nodeid}: {reason.removeprefix('Skipped: ')}")
    if declared:
        terminalreporter.section("detlaunch layer contract: checks ruled out by a layer's declarations")
        for line in declared:
            terminalreporter.write_line(line)
