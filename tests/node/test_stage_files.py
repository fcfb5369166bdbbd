"""A stage's files and folders on a node (stage_files.StageFiles), without starting anything (ms)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from detlaunch.node.stage_files import StageFiles, remove_tree
from detlaunch.planning.stage import Command, Stage

pytestmark = pytest.mark.timeout(10)


def stage(**kwargs: object) -> Stage:
    return Stage(commands=(Command(name="x", argv=("true",)),), **kwargs)  # type: ignore[arg-type]


def test_written_private_then_removed_with_the_run_dir_and_the_shared_dirs_left_empty(tmp_path: Path) -> None:
    run_dir, shared = tmp_path / "run", tmp_path / "jobs" / "job-1"
    run_dir.mkdir()
    shared.mkdir(parents=True)
    (shared / "other-node.lock").write_text("")  # another node still uses the shared dir
    files = StageFiles(stage(files={"etc/conf": "a=1\n"}, executables={"bin/go": "#!/bin/sh\n"},
                             dirs=("state", str(shared / "keys"))), str(run_dir), str(shared))
    files.write()
    conf, go = run_dir / "etc" / "conf", run_dir / "bin" / "go"
    assert conf.read_text() == "a=1\n" and stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert stat.S_IMODE(go.stat().st_mode) == 0o700
    assert stat.S_IMODE((run_dir / "state").stat().st_mode) == 0o700 and (shared / "keys").is_dir()

    files.remove()
    assert not run_dir.exists() and not (shared / "keys").exists()
    assert shared.exists()  # not empty: the other node's file is there
    (shared / "other-node.lock").unlink()
    StageFiles(stage(), str(tmp_path / "run2"), str(shared)).remove()
    assert not shared.exists() and (tmp_path / "jobs").exists()  # up to the shared dir's parent, no further


def test_a_folder_is_emptied_before_the_job_and_a_symlink_in_it_is_never_followed(tmp_path: Path) -> None:
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    (run_dir / "state").mkdir(parents=True)
    outside.mkdir()
    (outside / "precious").write_text("keep")
    (run_dir / "state" / "stale").write_text("from a previous job")
    os.symlink(outside, run_dir / "state" / "link")
    files = StageFiles(stage(dirs=("state",)), str(run_dir), str(tmp_path / "shared"))
    files.write()
    assert list((run_dir / "state").iterdir()) == []
    assert (outside / "precious").read_text() == "keep"


def test_remove_tree_leaves_a_symlinked_folder_and_a_missing_one_alone(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "f").write_text("x")
    os.symlink(target, tmp_path / "link")
    remove_tree(str(tmp_path / "link"))
    remove_tree(str(tmp_path / "missing"))
    assert (target / "f").exists() and (tmp_path / "link").is_symlink()
