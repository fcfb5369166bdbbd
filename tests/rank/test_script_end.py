"""The end mark: a rank's Python, started as the wrapper starts it, marks its progress file once its script
has ended (faultsite/sitecustomize.py), and the wrapper reads it (OutputMark.script_end), so a rank killed
after its work was done (a library's abort at exit) is reported as such. Real processes, milliseconds each."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from detlaunch.rank import faultdump
from detlaunch.rank import progress as progress_module
from detlaunch.rank.progress import (
    ENDED_RECORD,
    SCRIPT_FINISHED,
    SCRIPT_RAISED,
    OutputMark,
    create_progress_file,
)

ABORT_AT_EXIT = "import atexit, os\natexit.register(os.abort)\n"


def run_rank(tmp_path: Path, code: str, switch: str | None = None) -> tuple[int, str, str]:
    """Run `code` as the wrapper runs a rank (progress file, faulthandler file, faultsite first on PYTHONPATH);
    (its wait code, how its script ended as the wrapper reads it, its stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", faultdump.SWITCH)}
    if switch is not None:
        env[faultdump.SWITCH] = switch
    path = create_progress_file(str(tmp_path), 0)
    env[progress_module.ENV] = path
    faultdump.prepare(str(tmp_path), 0, env)
    mark = OutputMark(path)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    return r.returncode, mark.script_end(), r.stderr


@pytest.mark.parametrize(("code", "returncode", "ended"), [
    ("print('done')", 0, SCRIPT_FINISHED),
    ("import sys\nsys.exit(3)", 3, SCRIPT_FINISHED),
    ("raise ValueError('boom')", 1, SCRIPT_RAISED),
    (ABORT_AT_EXIT + "print('done')", -signal.SIGABRT, SCRIPT_FINISHED),  # an abort at exit: its work was done
    (ABORT_AT_EXIT + "raise ValueError('boom')", -signal.SIGABRT, SCRIPT_RAISED),
    ("import threading, time\nthreading.Thread(target=time.sleep, args=(0.2,)).start()", 0, SCRIPT_FINISHED),
    ("import os\nos.abort()", -signal.SIGABRT, ""),  # killed in the middle of its script: no mark
    ("import os\nos._exit(3)", 3, ""),  # left without shutting down
    # a forked child that returns through Python is not the rank: only the rank's own end is marked
    ("import os, time\nif os.fork() == 0:\n    raise SystemExit(0)\nos.wait()\nos.abort()", -signal.SIGABRT, ""),
])
def test_the_rank_marks_its_end_once_its_script_has_ended(real_processes: None, tmp_path: Path, code: str,
                                                          returncode: int, ended: str) -> None:
    got = run_rank(tmp_path, code)
    assert got[:2] == (returncode, ended), got


def test_without_the_faulthandler_fallback_there_is_no_mark(real_processes: None, tmp_path: Path) -> None:
    assert run_rank(tmp_path, ABORT_AT_EXIT, switch="0")[:2] == (-signal.SIGABRT, "")


def test_the_mark_is_the_progress_records_layout(tmp_path: Path) -> None:
    """sitecustomize.py cannot import detlaunch (the rank's Python may not have it): it packs the record itself."""
    path = create_progress_file(str(tmp_path), 0)
    mark = OutputMark(path)
    assert mark.script_end() == ""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, struct.pack("@qqddq", 1, 1, 1.0, 2.0, 1), ENDED_RECORD)
        assert mark.script_end() == SCRIPT_RAISED
        os.pwrite(fd, struct.pack("@qqddq", 1, 0, 1.0, 2.0, 1), ENDED_RECORD)
        assert mark.script_end() == SCRIPT_FINISHED
        os.pwrite(fd, struct.pack("@qqddq", 1, 0, 1.0, 2.0, 0), ENDED_RECORD)  # torn: not a mark
        assert mark.script_end() == ""
    finally:
        os.close(fd)
    site = (Path(faultdump.SITE_DIR) / "sitecustomize.py").read_text()
    assert f', {ENDED_RECORD})' in site and '"@qqddq"' in site and progress_module._RECORD.format == "@qqddq"
