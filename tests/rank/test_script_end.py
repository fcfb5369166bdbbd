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
    ENDED_FINALIZING,
    ENDED_RAISED,
    ENDED_RECORD,
    SCRIPT_FINALIZING,
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


# A crash once Python has finalized: the C library's exit handlers (on_exit(3)) run after Python's.
ABORT_IN_TEARDOWN = "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.on_exit(libc.abort, None)\n"


@pytest.mark.parametrize(("code", "returncode", "ended"), [
    ("print('done')", 0, SCRIPT_FINALIZING),
    ("import sys\nsys.exit(3)", 3, "exit 3"),
    ("import sys\nsys.exit(0)", 0, SCRIPT_FINALIZING),
    ("import sys\nsys.exit('a message')", 1, "exit 1"),
    ("import sys\nsys.exit(259)", 3, "exit 3"),  # as the process's exit code is: the low 8 bits
    ("exit(4)", 4, "exit 4"),  # site's exit and quit
    ("quit(5)", 5, "exit 5"),
    ("import sys\ntry:\n    sys.exit(2)\nexcept SystemExit:\n    pass", 0, "exit 2"),  # caught: the strict reading
    ("raise ValueError('boom')", 1, SCRIPT_RAISED),
    (ABORT_IN_TEARDOWN + "print('done')", -signal.SIGABRT, SCRIPT_FINALIZING),  # its work was done
    (ABORT_IN_TEARDOWN + "import sys\nsys.exit(3)", -signal.SIGABRT, "exit 3"),
    (ABORT_IN_TEARDOWN + "raise ValueError('boom')", -signal.SIGABRT, SCRIPT_RAISED),
    (ABORT_AT_EXIT + "print('done')", -signal.SIGABRT, SCRIPT_FINISHED),  # in an atexit handler: not all done
    (ABORT_AT_EXIT + "raise ValueError('boom')", -signal.SIGABRT, SCRIPT_RAISED),
    ("import threading, time\nthreading.Thread(target=time.sleep, args=(0.2,)).start()", 0, SCRIPT_FINALIZING),
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
    assert run_rank(tmp_path, ABORT_IN_TEARDOWN, switch="0")[:2] == (-signal.SIGABRT, "")


def test_a_bare_raise_of_system_exit_reads_as_a_return_in_a_cold_rank(real_processes: None, tmp_path: Path) -> None:
    """What Python does not show: the code of a SystemExit raised by the script itself (not through sys.exit)
    is kept in C once it has ended the script. Said in docs/RESTARTS.md; a warm rank sees it (template.py)."""
    assert run_rank(tmp_path, "raise SystemExit(3)")[:2] == (3, SCRIPT_FINALIZING)


def test_the_mark_is_the_progress_records_layout(tmp_path: Path) -> None:
    """sitecustomize.py cannot import detlaunch (the rank's Python may not have it): it packs the record itself."""
    path = create_progress_file(str(tmp_path), 0)
    mark = OutputMark(path)
    assert mark.script_end() == ""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, struct.pack("@qqddq", 1, ENDED_RAISED | 1, 1.0, 2.0, 1), ENDED_RECORD)
        assert mark.script_end() == SCRIPT_RAISED
        os.pwrite(fd, struct.pack("@qqddq", 1, 0, 1.0, 2.0, 1), ENDED_RECORD)
        assert mark.script_end() == SCRIPT_FINISHED
        os.pwrite(fd, struct.pack("@qqddq", 1, ENDED_FINALIZING, 1.0, 2.0, 1), ENDED_RECORD)
        assert mark.script_end() == SCRIPT_FINALIZING
        os.pwrite(fd, struct.pack("@qqddq", 1, ENDED_FINALIZING | 3, 1.0, 2.0, 1), ENDED_RECORD)
        assert mark.script_end() == "exit 3"
        os.pwrite(fd, struct.pack("@qqddq", 1, 0, 1.0, 2.0, 0), ENDED_RECORD)  # torn: not a mark
        assert mark.script_end() == ""
    finally:
        os.close(fd)
    site = (Path(faultdump.SITE_DIR) / "sitecustomize.py").read_text()
    assert f', {ENDED_RECORD})' in site and '"@qqddq"' in site and progress_module._RECORD.format == "@qqddq"
    assert f"RAISED, FINALIZING = 1 << {ENDED_RAISED.bit_length() - 1}, 1 << {ENDED_FINALIZING.bit_length() - 1}" \
        in site
