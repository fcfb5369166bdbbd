"""A stage's files and folders on one node: written before its commands start, removed at the end.

The layer's Stage names them (``files``, ``executables``, ``dirs``), relative to the node's private
run directory unless absolute. They are written private (0600 and 0700, through safefs: a fresh
O_EXCL|O_NOFOLLOW file renamed into place); a folder is emptied first, since what a previous job left
there is not this job's. At the end they go, then the run directory, then the folders of the shared
job dir that this node leaves empty (the last node to leave removes them).
"""

from __future__ import annotations

import os

from detlaunch.planning.stage import Stage
from detlaunch.system.safefs import ensure_private_dir, write_private_file


class StageFiles:
    def __init__(self, stage: Stage, run_dir: str, shared_dir: str):
        self.stage, self.run_dir, self.shared_dir = stage, run_dir, shared_dir

    def path(self, rel: str) -> str:
        return rel if os.path.isabs(rel) else os.path.join(self.run_dir, rel)

    def write(self) -> None:
        for d in self.stage.dirs:
            remove_tree(self.path(d))
            ensure_private_dir(self.path(d))
        self._write_files()

    def rewrite(self, stage: Stage) -> None:
        """A new plan's files over the old ones (the nodes moved: the launcher's host list); its folders and
        what the setup made in them (keys) stay."""
        self.stage = stage
        self._write_files()

    def _write_files(self) -> None:
        for files, mode in ((self.stage.files, 0o600), (self.stage.executables, 0o700)):
            for rel, content in files.items():
                path = self.path(rel)
                ensure_private_dir(os.path.dirname(path))
                write_private_file(path, content, mode)

    def remove(self) -> None:
        """Everything write() made, and the run directory; never fails (the job's result is decided)."""
        for rel in [*self.stage.files, *self.stage.executables]:
            try:
                os.unlink(self.path(rel))
            except OSError:
                pass
        for d in [*self.stage.dirs, self.run_dir]:
            try:
                remove_tree(self.path(d))
            except OSError:
                pass
        top = os.path.dirname(self.shared_dir)
        for d in sorted({os.path.dirname(self.path(d)) for d in self.stage.dirs}, key=len, reverse=True):
            remove_empty_dirs(d, stop_at=top)
        remove_empty_dirs(self.shared_dir, stop_at=top)


def remove_empty_dirs(path: str, stop_at: str) -> None:
    """rmdir `path` and its parents while they are empty, up to (not including) `stop_at`."""
    while path.startswith(stop_at + os.sep):
        try:
            os.rmdir(path)
        except OSError:
            return
        path = os.path.dirname(path)


def remove_tree(path: str) -> None:
    """Remove a folder and what it holds; a symlink in it is removed, never followed (nor `path`, if one)."""
    if not os.path.isdir(path) or os.path.islink(path):
        return
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:  # a symlink to a folder is listed here, and is not walked into
            inner = os.path.join(root, name)
            os.unlink(inner) if os.path.islink(inner) else os.rmdir(inner)
    os.rmdir(path)
