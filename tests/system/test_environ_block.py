"""A value taken out of a process's environment for good (system/environ_block.py): gone from os.environ and from
/proc/PID/environ, for the process and for every fork of it, the other variables untouched. Real processes,
milliseconds each."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(30)

PROBE = """
import os, sys
from detlaunch.system.environ_block import take_out
value = take_out("DETLAUNCH_JOB_SECRET")
pid = os.fork()
if pid == 0:  # a fork, as the node's supervisor is
    os.read(int(sys.argv[1]), 1)
    os._exit(0)
with open(f"/proc/{pid}/environ", "rb") as f:
    child = f.read()
with open("/proc/self/environ", "rb") as f:
    mine = f.read()
os.write(int(sys.argv[2]), b"x")
os.waitpid(pid, 0)
print(value, "DETLAUNCH_JOB_SECRET" in os.environ, os.environ.get("KEPT"))
for block in (mine, child):
    print(sorted(e.decode() for e in block.split(b"\\0") if e.startswith((b"DETLAUNCH_JOB_SECRET", b"KEPT"))))
"""


def test_a_taken_out_value_is_gone_from_the_process_and_its_forks(real_processes: None) -> None:
    go_r, go_w = os.pipe()
    try:
        env = {**os.environ, "DETLAUNCH_JOB_SECRET": "s3cret", "KEPT": "kept"}
        r = subprocess.run([sys.executable, "-c", PROBE, str(go_r), str(go_w)], env=env, capture_output=True,
                           text=True, timeout=20, pass_fds=(go_r, go_w))
    finally:
        os.close(go_r)
        os.close(go_w)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["s3cret False kept",
                                     "['DETLAUNCH_JOB_SECRET=', 'KEPT=kept']",
                                     "['DETLAUNCH_JOB_SECRET=', 'KEPT=kept']"], r.stdout


def test_the_command_names_the_secret_as_the_job_dir_does() -> None:
    """cli/main.py keeps its own copy of the name (importing system/jobdir at every start costs what it saves)."""
    from detlaunch.cli import main
    from detlaunch.system import jobdir

    assert main.SECRET_ENV == jobdir.SECRET_ENV
