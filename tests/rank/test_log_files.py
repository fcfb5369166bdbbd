"""Log files in --log-dir: never through a planted link, never into a FIFO, private unless the folder says its group
reads them (security round 2, item 2). In-process: the wrapper's RankLog and the node's ProcessTable use these."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from detlaunch.rank import log_files
from detlaunch.rank.output import RankLog

pytestmark = pytest.mark.timeout(10)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def warnings() -> tuple[int, int]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    yield r, w
    os.close(r)
    os.close(w)


def said(warnings: tuple[int, int]) -> list[str]:
    try:
        return os.read(warnings[0], 65536).decode().splitlines()
    except BlockingIOError:
        return []


def test_a_symlink_planted_in_the_log_dir_is_not_followed_and_said_once(tmp_path: Path,
                                                                         warnings: tuple[int, int]) -> None:
    logs, target = tmp_path / "logs", tmp_path / "elsewhere"
    logs.mkdir(mode=0o700)
    target.write_text("precious\n")
    (logs / "rank-0.log").symlink_to(target)
    log = RankLog(str(logs), 0, warn_fd=warnings[1])
    log.write(b"[rank=0] a line\n")
    assert target.read_text() == "precious\n"
    assert said(warnings) == [f"detlaunch: warning: {logs}/rank-0.log could not be opened: it is a symlink: not "
                              "followed (detlaunch writes no log through a link); the console has every line"]
    assert log.error.endswith("it is a symlink: not followed (detlaunch writes no log through a link)")


def test_a_fifo_in_the_log_dir_is_refused_at_once(tmp_path: Path, warnings: tuple[int, int]) -> None:
    os.mkfifo(tmp_path / "rank-1.log")
    log = RankLog(str(tmp_path), 1, warn_fd=warnings[1])  # would block for ever in open() without O_NONBLOCK
    assert log.fd is None and log.error.endswith("it is a FIFO, not a regular file")
    reader = os.open(tmp_path / "rank-1.log", os.O_RDONLY | os.O_NONBLOCK)
    try:  # with a reader, the FIFO opens: still refused
        log = RankLog(str(tmp_path), 1, warn_fd=warnings[1])
        assert log.fd is None and log.error.endswith("it is not a regular file")
    finally:
        os.close(reader)


def test_logs_are_the_users_own_in_a_private_folder(tmp_path: Path, warnings: tuple[int, int]) -> None:
    tmp_path.chmod(0o700)
    logs = tmp_path / "new" / "attempt-1"
    log = RankLog(str(logs), 2, warn_fd=warnings[1])
    log.write(b"x\n")
    assert (mode(tmp_path / "new"), mode(logs), mode(logs / "rank-2.log")) == (0o700, 0o700, 0o600)
    assert said(warnings) == []


@pytest.mark.parametrize("folder_mode", [0o2770, 0o750])  # setgid (a team's folder), or the user's and group-readable
def test_a_folder_whose_group_reads_the_logs_gets_group_readable_logs(tmp_path: Path, folder_mode: int,
                                                                       warnings: tuple[int, int]) -> None:
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(folder_mode)
    old = os.umask(0o022)
    try:
        RankLog(str(team / "attempt-1"), 3, warn_fd=warnings[1]).write(b"x\n")
    finally:
        os.umask(old)
    assert mode(team / "attempt-1") & 0o777 == 0o750 and mode(team / "attempt-1" / "rank-3.log") == 0o640


def test_an_existing_log_others_could_read_is_narrowed(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "torchrun-node0.log"
    path.write_text("an earlier run\n")
    path.chmod(0o666)
    fd = log_files.open_log(str(path))
    try:
        os.write(fd, b"this run\n")
    finally:
        os.close(fd)
    assert mode(path) == 0o600 and path.read_text() == "an earlier run\nthis run\n"


def test_another_users_symlink_for_a_folder_is_refused_yours_is_followed(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "mine").symlink_to(scratch)
    log_files.make_log_dir(str(tmp_path / "mine" / "attempt-2"))  # your own link to a scratch disk: fine
    assert (scratch / "attempt-2").is_dir()
    planted = tmp_path / "attempt-3"
    planted.symlink_to(scratch)
    os.lchown(planted, 65534, 65534)  # nobody's, as another local user would plant it (the suite runs as root)
    with pytest.raises(OSError, match="attempt-3 is a symlink of uid 65534: not followed"):
        log_files.make_log_dir(str(planted))
    with pytest.raises(OSError, match="is not a directory"):
        (tmp_path / "a-file").write_text("")
        log_files.make_log_dir(str(tmp_path / "a-file" / "logs"))
