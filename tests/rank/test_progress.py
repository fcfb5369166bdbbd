"""detlaunch.progress, the heartbeat: real files and real processes, milliseconds each."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from detlaunch.progress import FILE_SIZE, Beat, create_progress_file, read_progress
from support import paths

CORE = str(paths.CORE)


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "DETLAUNCH_PROGRESS_FILE"}
    full.update(env or {}, PYTHONPATH=CORE)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=30)


def test_the_file_is_private_sized_and_reads_as_no_beat_yet(tmp_path: Path) -> None:
    path = create_progress_file(str(tmp_path), 3)
    assert path == str(tmp_path / "progress-3")
    st = os.lstat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == FILE_SIZE
    assert read_progress(path) is None


def test_a_planted_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "progress-0").symlink_to(target)
    path = create_progress_file(str(tmp_path), 0)
    assert not os.path.islink(path) and target.read_text() == "keep"


def test_missing_and_short_files_read_as_none(tmp_path: Path) -> None:
    assert read_progress(str(tmp_path / "nope")) is None
    (tmp_path / "short").write_bytes(b"\1" * 10)
    assert read_progress(str(tmp_path / "short")) is None


def test_a_script_beats_through_the_file_and_the_reader_sees_count_step_and_time(real_processes: None,
                                                                                 tmp_path: Path) -> None:
    path = create_progress_file(str(tmp_path), 0)
    before = time.time()
    r = run_python("import detlaunch\nfor i in range(5): detlaunch.progress(i * 10)\ndetlaunch.progress()\n",
                   {"DETLAUNCH_PROGRESS_FILE": path})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    beat = read_progress(path)
    assert beat is not None and beat.count == 6 and beat.step is None
    assert before <= beat.at <= time.time()
    assert 0 < beat.monotonic <= time.monotonic()
    r = run_python("from detlaunch.progress import progress\nprogress(7)\n", {"DETLAUNCH_PROGRESS_FILE": path})
    assert read_progress(path) == Beat(1, 7, read_progress(path).at, read_progress(path).monotonic)  # type: ignore[union-attr]


def test_all_import_forms_are_callable(real_processes: None) -> None:
    r = run_python("import detlaunch.progress\ndetlaunch.progress(1)\nimport detlaunch\ndetlaunch.progress()\n"
                   "from detlaunch import progress\nprogress(2)\nfrom detlaunch.progress import progress\nprogress()\n")
    assert r.returncode == 0, r.stderr


def test_without_detlaunch_it_does_nothing_and_with_a_bad_path_it_says_so_once(real_processes: None,
                                                                               tmp_path: Path) -> None:
    r = run_python("import detlaunch\nfor i in range(3): detlaunch.progress(i)\nprint('ok')")
    assert (r.returncode, r.stdout, r.stderr) == (0, "ok\n", "")
    r = run_python("import detlaunch\nfor i in range(3): detlaunch.progress(i)\nprint('ok')",
                   {"DETLAUNCH_PROGRESS_FILE": str(tmp_path / "missing")})
    assert r.returncode == 0 and r.stdout == "ok\n"
    assert r.stderr.count("heartbeats are off") == 1, r.stderr


def test_a_forked_child_does_not_beat_for_the_rank(real_processes: None, tmp_path: Path) -> None:
    path = create_progress_file(str(tmp_path), 0)
    code = ("import os, detlaunch\ndetlaunch.progress(1)\npid = os.fork()\n"
            "if pid == 0:\n    [detlaunch.progress(99) for _ in range(10)]\n    os._exit(0)\nos.waitpid(pid, 0)\n")
    assert run_python(code, {"DETLAUNCH_PROGRESS_FILE": path}).returncode == 0
    beat = read_progress(path)
    assert beat is not None and (beat.count, beat.step) == (1, 1)


def test_importing_it_pulls_in_none_of_the_launcher(real_processes: None) -> None:
    r = run_python("import sys\nimport detlaunch.progress\nimport json\nprint(json.dumps(sorted(sys.modules)))")
    mods = set(json.loads(r.stdout))
    heavy = {m for m in mods if m.split(".")[0] in ("pluggy", "psutil", "stevedore", "requests")
             or m.startswith(("detlaunch.planning", "detlaunch.node", "detlaunch.cli", "detlaunch.link"))}
    assert not heavy, heavy


@pytest.mark.timeout(60)
def test_the_reader_never_sees_a_torn_record_while_a_rank_beats_flat_out(real_processes: None, tmp_path: Path) -> None:
    path = create_progress_file(str(tmp_path), 0)
    env = {**os.environ, "PYTHONPATH": CORE, "DETLAUNCH_PROGRESS_FILE": path}
    writer = subprocess.Popen([sys.executable, "-c", "from detlaunch.progress import progress\n"
                               "i = 0\nwhile True:\n    i += 1\n    progress(i)\n"], env=env)
    try:
        seen = starved = 0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            beat = read_progress(path)
            if beat is None:  # no whole record in READ_ATTEMPTS tries
                starved += 1
                continue
            assert beat.step == beat.count, beat  # the writer writes step == count: a torn read would differ
            seen += 1
        assert seen > 100, (seen, starved)  # a million beats a second: some reads find no whole record
    finally:
        writer.kill()
        writer.wait()
