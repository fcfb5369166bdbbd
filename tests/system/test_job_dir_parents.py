"""The folders above the job dir (security round 2, item 8): one another user could swap the job's keys in is
refused in one line, as ssh's StrictModes would refuse it, but a sticky folder (/tmp) is fine. In-process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from detlaunch.errors import ConfigError
from detlaunch.system.jobdir import prepare_job_dir, unsafe_parent

pytestmark = pytest.mark.timeout(10)


def test_a_sticky_world_writable_folder_and_the_users_own_are_fine(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert unsafe_parent(str(sticky / "a" / "b" / "job")) is None
    prepare_job_dir(str(sticky / "job"), given=True)
    assert (sticky / "job").is_dir()


def test_a_folder_others_can_write_to_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone may rename the job dir away and put theirs in its place
    with pytest.raises(ConfigError) as e:
        prepare_job_dir(str(shared / "deep" / "job"), given=True)
    assert str(e.value) == (f"--job-dir {shared}/deep/job is inside {shared}, which others can write to (mode 777, "
                            "not sticky): another user could swap the job's keys there; choose another --job-dir")
    assert not (shared / "deep").exists()


def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    tmp_path.chmod(0o755)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    assert unsafe_parent(str(theirs / "job")) == f"{theirs}, which belongs to uid 65534"
