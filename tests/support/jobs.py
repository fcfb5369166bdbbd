"""Running detlaunch for real in tests: the shipped runner, with the suite's habits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from detlaunch.testing.runner import DETLAUNCH, DetlaunchRunner, Running

from support.paths import EXAMPLES, ROOT, SCRIPTS

__all__ = ["EXAMPLES", "ROOT", "SCRIPTS", "Job", "Launcher"]

Job = Running  # one detlaunch started by a test, in a session of its own


class Launcher(DetlaunchRunner):
    """The shipped runner, with the suite's habits: jobs run from the repository root, and `prefix`
    runs detlaunch through another command (runuser, ip netns exec)."""

    def start(self, *args: str, env: Mapping[str, str] | None = None, cwd: Path | str | None = None,
              command: Sequence[str] = DETLAUNCH, prefix: Sequence[str] = ()) -> Running:
        return super().start(*args, env=env, cwd=cwd or ROOT, command=(*prefix, *command))
