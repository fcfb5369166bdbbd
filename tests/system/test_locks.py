"""Run dirs and job dirs held by a live process are never taken; those of a dead one are (real processes).

Each owner is a real Python process that takes the lock and is then SIGKILLed: the kernel drops its flock,
which is the only thing the next detlaunch trusts (no pid files, no timeouts).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from detlaunch.errors import ConfigError
from detlaunch.system.jobdir import lock_job_dir
from detlaunch.system.rundirs import LOCK_NAME, create_run_dir, remove_stale_run_dirs
from support import paths

pytestmark = pytest.mark.timeout(30)
CORE = str(paths.CORE)


@pytest.fixture
def owners() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def owner(owners: list[subprocess.Popen[str]], code: str) -> subprocess.Popen[str]:
    """A process that runs `code`, says 'ready', and waits to be killed."""
    p = subprocess.Popen([sys.executable, "-c", f"{code}\nprint('ready', flush=True)\nimport time\ntime.sleep(60)"],
                         stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": CORE})
    owners.append(p)
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


def kill(p: subprocess.Popen[str]) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait(10)


def test_a_run_dir_is_removed_only_once_its_owner_is_gone(real_processes: None, tmp_path: Path,
                                                          owners: list[subprocess.Popen[str]]) -> None:
    path = tmp_path / "detlaunch-0123456789abcdef"
    p = owner(owners, f"from detlaunch.system.rundirs import create_run_dir\nd = create_run_dir({str(path)!r})\n"
                      f"open({str(path / 'sock')!r}, 'w').close()")
    assert sorted(os.listdir(path)) == [LOCK_NAME, "sock"]
    assert (os.stat(path).st_mode & 0o777) == 0o700
    assert remove_stale_run_dirs(str(tmp_path)) == [] and path.is_dir()  # alive: kept
    kill(p)
    assert remove_stale_run_dirs(str(tmp_path)) == [str(path)]
    assert not path.exists()
    assert os.listdir(tmp_path) == []  # no staging dir left either


def test_a_closed_handle_frees_the_dir(tmp_path: Path) -> None:
    d = create_run_dir(str(tmp_path / "detlaunch-00000000000000aa"))
    assert remove_stale_run_dirs(str(tmp_path)) == []
    d.close()
    assert remove_stale_run_dirs(str(tmp_path)) == [d.path]


def test_create_refuses_an_existing_path(tmp_path: Path) -> None:
    (tmp_path / "detlaunch-00000000000000bb").mkdir()
    with pytest.raises(FileExistsError):
        create_run_dir(str(tmp_path / "detlaunch-00000000000000bb"))
    assert os.listdir(tmp_path) == ["detlaunch-00000000000000bb"]


def test_what_is_not_a_stale_run_dir_of_ours_is_never_touched(tmp_path: Path) -> None:
    def stale(name: str) -> Path:
        d = create_run_dir(str(tmp_path / name))
        d.close()
        return Path(d.path)

    other_name = stale("detlaunch-run-of-another-tool")  # not our name pattern
    opened = stale("detlaunch-00000000000000c1")
    opened.chmod(0o755)  # not 0700: not made by us
    no_lock = tmp_path / "detlaunch-00000000000000c2"
    no_lock.mkdir(mode=0o700)  # no lock file: we cannot tell, so we leave it
    target = stale("detlaunch-00000000000000c3")
    link = tmp_path / "detlaunch-00000000000000c4"
    link.symlink_to(target)
    keep = {other_name, opened, no_lock}
    if os.getuid() == 0:
        theirs = stale("detlaunch-00000000000000c5")
        os.chown(theirs, 65534, 65534)
        keep.add(theirs)
    assert remove_stale_run_dirs(str(tmp_path)) == [str(target)]
    assert all(p.exists() for p in keep) and link.is_symlink() and not target.exists()


def test_a_second_job_on_the_same_job_dir_and_node_is_one_line(real_processes: None, tmp_path: Path,
                                                               owners: list[subprocess.Popen[str]]) -> None:
    job_dir = tmp_path / "jobs" / "dl-x"
    p = owner(owners, "from detlaunch.system.jobdir import lock_job_dir\n"
                      f"lock = lock_job_dir({str(job_dir)!r}, 1, 'dl-x', False)")
    with pytest.raises(ConfigError) as e:
        lock_job_dir(str(job_dir), 1, "dl-x", given=False)
    assert str(e.value) == (f"job dir {job_dir} is in use by another job on node 1 (detlaunch pid {p.pid}) "
                            "(job id dl-x): give this job another --master-port (its id is derived from it), "
                            "--job-id or --job-dir")
    other_node = lock_job_dir(str(job_dir), 0, "dl-x", given=False)  # a shared dir: each node its own lock
    kill(p)  # SIGKILLed: the kernel drops its lock, its file stays
    again = lock_job_dir(str(job_dir), 1, "dl-x", given=False)
    again.release()
    other_node.release()
    assert not job_dir.exists()  # the last one out removes the lock files and the empty dir
