"""deepspeed's runner (the ``deepspeed`` command), as ``python -m detlaunch_deepspeed.runner ARGS``.

The runner spends its start importing deepspeed, and so torch (seconds a start); as a module, a
standby of it (``Command.standby``, see detlaunch's standby.py) is the next attempt's runner,
waiting past those imports while an attempt runs. A run here is the ``deepspeed`` console
script's: the same arguments, environment, output and exit code (argparse's name included).

On one node the runner's whole work is to start ``python -u -m deepspeed.launcher.launch ARGS``
(its command line is fixed in deepspeed) and wait for it; that new interpreter imports deepspeed,
and so torch, again before it starts any rank (~2 s, on every start). Here that launch runs in the
runner's own process instead, where those imports are done: the same arguments and environment,
unbuffered output, the same exit code, one process fewer. Any other command the runner starts
(pdsh, mpirun, ssh for several nodes) is started as deepspeed starts it.

deepspeed puts ``cd DIR;`` unquoted in the line pdsh runs on every node: where the directory holds a
space or a quote, the layer sets RUNNER_CWD (``/``) and the runner runs from there, the rank shim
going to the real directory on every node (rank_shim.py).
"""

import io
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import deepspeed.launcher.launch as launch
import deepspeed.launcher.runner as runner

LAUNCH = [sys.executable, "-u", "-m", "deepspeed.launcher.launch"]
RUNNER_CWD = "DETLAUNCH_DS_RUNNER_CWD"  # layer.runner_cwd_env()


class _LaunchHere:
    """`python -u -m deepspeed.launcher.launch ARGS` with `env`, run in this process when waited for
    (deepspeed's runner waits for it at once, and reads nothing of it but wait() and returncode)."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str]):
        self.args, self.env = list(args), dict(env)
        self.returncode: int | None = None

    def wait(self) -> int:
        os.environ.clear()
        os.environ.update(self.env)
        sys.argv = [launch.__file__, *self.args]
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, io.TextIOWrapper):  # -u: every line out at once, even if SIGKILLed next
                stream.reconfigure(write_through=True, line_buffering=True)
        try:
            launch.main()
            self.returncode = 0
        except SystemExit as e:
            self.returncode = exit_status(e.code)
        return self.returncode


def exit_status(code: object) -> int:
    """What a parent sees of an interpreter that ends with SystemExit(code): the low byte of an
    int (sys.exit(-15) is 241); any other object is printed to stderr, and the status is 1."""
    if code is None or isinstance(code, int):
        return (code or 0) & 0xFF
    print(code, file=sys.stderr)
    return 1


class _RunnersSubprocess:
    """The `subprocess` deepspeed's runner sees: its one-node launch runs here; all else is subprocess's."""

    def Popen(self, cmd: Sequence[str], *args: Any, **kwargs: Any) -> Any:  # noqa: N802 (subprocess's name)
        if list(cmd[:len(LAUNCH)]) == LAUNCH and not args and set(kwargs) <= {"env"}:
            return _LaunchHere(cmd[len(LAUNCH):], kwargs.get("env") or os.environ)
        return subprocess.Popen(cmd, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


def main() -> None:
    sys.argv[0] = "deepspeed"  # what argparse names in its messages, as under the console script
    cwd = os.environ.pop(RUNNER_CWD, None)
    if cwd:
        os.chdir(cwd)
    runner.subprocess = _RunnersSubprocess()
    runner.main()


if __name__ == "__main__":
    main()
