"""The shell's side of `detlaunch status`: finding the job's socket and loading little, in milliseconds."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from detlaunch.link import control


def fake_job(base: Path, name: str, job: str) -> socket.socket:
    """A run dir as a supervisor makes it: the job file and a listening socket."""
    run_dir = base / f"detlaunch-{name}"
    run_dir.mkdir(mode=0o700)
    (run_dir / "job").write_text(json.dumps({"job": job, "node": 0}))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(run_dir / "supervisor.sock"))
    sock.listen(4)
    sock.setblocking(False)
    return sock


def was_asked(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
        return True
    except BlockingIOError:
        return False


@pytest.mark.timeout(10)
def test_a_named_job_is_found_without_knocking_on_the_other_jobs_sockets(tmp_path: Path) -> None:
    a, b = fake_job(tmp_path, "aaaa", "job-a"), fake_job(tmp_path, "bbbb", "job-b")
    (tmp_path / "detlaunch-stale").mkdir()  # a run dir without a job file: skipped
    try:
        assert control.running_jobs((str(tmp_path),), only="job-b") == {"job-b": str(tmp_path / "detlaunch-bbbb" /
                                                                                     "supervisor.sock")}
        assert was_asked(b) and not was_asked(a)
        assert set(control.running_jobs((str(tmp_path),))) == {"job-a", "job-b"}
        assert was_asked(a) and was_asked(b)
    finally:
        a.close()
        b.close()


def test_the_temp_dirs_are_every_place_tempfile_may_pick(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile caches its choice
    assert control.temp_dirs()[0] == str(tmp_path) == tempfile.gettempdir()
    assert "/tmp" in control.temp_dirs()
    monkeypatch.delenv("TMPDIR")
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert tempfile.gettempdir() in control.temp_dirs()


@pytest.mark.timeout(30)
def test_the_status_command_loads_none_of_the_launchers_parts(real_processes: None, tmp_path: Path) -> None:
    """`python -m detlaunch status` answers fast because it imports only the client: no options,
    plugins, event loop or tempfile (each costs more than the answer itself)."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "detlaunch", "status", "no-such-job"],
                          env=env, capture_output=True, text=True, timeout=20)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("detlaunch: job no-such-job is not running on this node")
    loaded = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "detlaunch.cli.control" in loaded and "detlaunch.link.control" in loaded
    heavy = {m for m in loaded if m in ("detlaunch.cli.main", "detlaunch.system.eventloop", "detlaunch.observe.events",
                                        "detlaunch.outcome", "tempfile", "pluggy")
             or m.startswith(("detlaunch.planning", "detlaunch.node"))}
    assert not heavy, heavy


def test_the_installed_commands_path_and_bad_input_are_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`detlaunch status` (the script: cli.main) reaches the same client; bad input is one line, exit 2."""
    from detlaunch.cli.main import main

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    a = fake_job(tmp_path, "aaaa", "job-a")
    try:
        assert main(["status", "no-such-job"], {}) == 1
        err = capsys.readouterr().err  # (other jobs of this user in /tmp may be listed too)
        assert err.startswith("detlaunch: job no-such-job is not running on this node (running here: ")
        assert "job-a" in err
        assert main(["status", "--watch", "nan"], {}) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--watch" in err and "0.1..3600 s" in err, err
        assert main(["status"], {"DETLAUNCH_FORMAT": "yaml"}) == 2
        assert capsys.readouterr().err == "detlaunch: error: DETLAUNCH_FORMAT='yaml': choose text or json\n"
    finally:
        a.close()
