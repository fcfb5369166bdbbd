"""The wrapper's messages and a rank's status as JSON, written and read in one module (milliseconds)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from detlaunch.outcome import RankStatus
from detlaunch.rank import protocol as rank_protocol

WRAPPER_DIR = Path(rank_protocol.__file__).parent


def test_a_status_round_trips_through_json() -> None:
    s = RankStatus(rank=3, node_rank=1, exit_code=137, signal=signal.SIGKILL, tail=("a", "b"), lost=True,
                   wall=12.5, host="127.0.0.2", stopped=True, killed=True)
    assert RankStatus.from_json(rank_protocol.status_to_json(s)) == s


def test_a_bad_status_is_refused() -> None:
    with pytest.raises((KeyError, ValueError, TypeError)):
        RankStatus.from_json({"rank": "x", "node": 0})


def test_messages_are_one_json_object_per_line() -> None:
    line = rank_protocol.encode(rank_protocol.exit_message(3, None, ["boom"], 1.5))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert rank_protocol.decode(line[:-1]) == {"t": "exit", "code": 3, "signal": None, "tail": ["boom"], "wall": 1.5}
    with pytest.raises(ValueError):
        rank_protocol.decode(b"[1, 2]")


def test_exit_codes_and_tails() -> None:
    assert rank_protocol.exit_code_of(-signal.SIGTERM) == 143
    assert rank_protocol.exit_code_of(3) == 3
    data = b"one\n\n  \nprogress 10%\rprogress 90%\rtwo\n" + b"x\n" * (rank_protocol.TAIL_LINES + 10)
    assert rank_protocol.last_lines(data, 3) == ["x", "x", "x"]
    assert rank_protocol.last_lines(data) == ["x"] * rank_protocol.TAIL_LINES  # the last TAIL_LINES, blanks skipped
    assert rank_protocol.last_lines(b"one\rtwo\n") == ["one", "two"]


def test_the_wrapper_imports_it_as_a_script_and_nothing_heavy(real_processes: None) -> None:
    """python -S wrapper.py: the module loads from the wrapper's folder, and pulls in no typing/dataclasses."""
    out = subprocess.run([sys.executable, "-S", "-X", "importtime", str(WRAPPER_DIR / "wrapper.py"),
                          "--rank", "0", "--", "true"], capture_output=True, text=True, check=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "protocol" in imported
    assert not imported & {"typing", "dataclasses", "json", "detlaunch"}, sorted(imported)


def test_the_supervisor_starts_the_wrapper_as_an_imported_module_so_its_bytecode_is_cached(
        real_processes: None) -> None:
    """The plan's wrapper command runs run_wrapper.py, which imports the wrapper (compiled once,
    kept in __pycache__) rather than running it as a script (compiled on every rank's start: ~1.6 MB)."""
    from detlaunch.planning.plan import WRAPPER_PATH

    assert Path(WRAPPER_PATH) == WRAPPER_DIR / "run_wrapper.py"
    out = subprocess.run([sys.executable, "-S", "-X", "importtime", WRAPPER_PATH, "--rank", "0", "--",
                          sys.executable, "-c", "print('hi')"], capture_output=True, text=True, check=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    parts = {"wrapper", "protocol", "options", "connection", "output", "wrapped_rank"}  # by file, from its folder
    assert parts <= imported and not imported & {"typing", "detlaunch"}, sorted(imported)
    assert out.stdout == "[rank=0] hi\n"
    bad = subprocess.run([sys.executable, "-S", WRAPPER_PATH, "--rank"], capture_output=True, text=True)
    assert (bad.returncode, bad.stderr) == (2, "detlaunch rank wrapper: error: --rank needs a value\n")


@pytest.mark.parametrize(("status", "ended", "strict", "forgiven"), [
    (6, "finalizing", False, 6),  # SIGABRT once Python finalized, its work done
    (6 | 0x80, "finalizing", False, 6),  # the same, with a core dumped
    (11, "finalizing", False, 11),
    (6, "finalizing", True, None),  # --strict-teardown
    (6, "finished", False, None),  # in an atexit handler: not all done
    (6, "exit 3", False, None),  # the script asked for a failure
    (6, "raised", False, None),
    (6, "", False, None),  # no mark: in the middle of its script
    (9, "finalizing", False, None),  # SIGKILL comes from outside (the OOM killer)
    (15, "finalizing", False, None),
    (0, "finalizing", False, None),  # exit 0: nothing to forgive
    (3 << 8, "finalizing", False, None),
])
def test_only_a_crash_once_python_finalizes_after_its_work_is_counted_as_finished(
        status: int, ended: str, strict: bool, forgiven: int | None) -> None:
    assert rank_protocol.teardown_signal(status, ended, strict) == forgiven
