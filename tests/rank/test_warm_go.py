"""A rank forked from the rank template runs its script only once its wrapper has its pid (warm.ask's go).

A wrapper stopped while the template still imports leaves at once (warm.STOPPED); the template answers its
request later, and the rank it forks then must not run the job's script: its wrapper is gone, nobody would
report or stop it, and after a restart it would run beside the next attempt. A real template process here,
without preloads, asked by warm.ask in this process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from detlaunch.node.rank_template import TEMPLATE_PATH, TITLE_ROOM
from detlaunch.rank import stopping, warm
from support.helpers import wait_until

pytestmark = pytest.mark.timeout(60)
SCRIPT = "import sys\nopen(sys.argv[1], 'w').close()\n"


@pytest.fixture
def template(tmp_path: Path, real_processes: None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A rank template serving on a socket in `tmp_path`: the socket's path, and the process."""
    path = str(tmp_path / "template.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    env = {k: v for k, v in os.environ.items() if k != "DETLAUNCH_PRELOAD"}
    proc = subprocess.Popen([sys.executable, TEMPLATE_PATH, str(listener.fileno()), sys.executable, TITLE_ROOM],
                            pass_fds=[listener.fileno()], env=env, cwd=tmp_path, start_new_session=True)
    listener.close()
    try:
        yield path, proc
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def ask_with(template: str, tmp_path: Path, name: str, wake_with: int | None) -> tuple[int, str]:
    """warm.ask for a rank that creates tmp_path/name, a signal number already waiting on its wake pipe."""
    script = tmp_path / "touch.py"
    script.write_text(SCRIPT)
    wake_r, wake_w = os.pipe()
    null = os.open(os.devnull, os.O_RDWR)
    try:
        if wake_with is not None:
            os.write(wake_w, bytes([wake_with]))
        return warm.ask(template, [sys.executable, str(script), str(tmp_path / name)], (null, null, null), (),
                        wake_r, stopping.STOP_SIGNALS)
    finally:
        for fd in (wake_r, wake_w, null):
            os.close(fd)


def test_a_rank_forked_for_a_wrapper_stopped_meanwhile_never_runs_its_script(
        tmp_path: Path, template: tuple[str, subprocess.Popen[bytes]]) -> None:
    path, proc = template
    proc.send_signal(signal.SIGSTOP)  # busy (importing, as it may be): the stop comes before its answer
    try:
        assert ask_with(path, tmp_path, "stopped", signal.SIGTERM) == (0, warm.STOPPED)
    finally:
        proc.send_signal(signal.SIGCONT)  # it answers the request now, for an asker that has left
    pid, why = ask_with(path, tmp_path, "asked", None)
    assert pid > 0 and why == "", why  # the template answered the first request before this one
    wait_until((tmp_path / "asked").exists, 20, "the asked rank's script")
    assert not (tmp_path / "stopped").exists()
    wait_until(lambda: not forks_waiting(proc.pid), 20, "the rank forked for the wrapper that left to end")


def forks_waiting(template: int) -> list[int]:
    """Ranks forked by the template that have not had their go: still in its session (a rank leaves it, setsid,
    once it has its go), other than the template itself."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == template and int(entry) != template and fields[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def test_a_signal_that_is_no_stop_does_not_end_the_wait(tmp_path: Path,
                                                        template: tuple[str, subprocess.Popen[bytes]]) -> None:
    pid, why = ask_with(template[0], tmp_path, "ran", signal.SIGUSR1)
    assert pid > 0 and why == "", why
    wait_until((tmp_path / "ran").exists, 20, "its script")
