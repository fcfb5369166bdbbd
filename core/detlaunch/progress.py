"""A training script's heartbeat, ``detlaunch.progress(step)``, and its timed work, ``detlaunch.section(name)``.

The public face of :mod:`detlaunch.rank.progress` (the record, the file and how both are read
live there, beside the rank wrapper that creates the file) and :mod:`detlaunch.rank.sections`.
Importing this costs a training script nothing: it is stdlib-only underneath and loads nothing of detlaunch's launcher.
"""

from __future__ import annotations

import sys

from detlaunch.rank.progress import (
    ENV,
    FILE_SIZE,
    NO_STEP,
    OUTPUT_RECORD,
    SIZE,
    Beat,
    OutputMark,
    create_progress_file,
    progress,
    progress_path,
    read_progress,
)
from detlaunch.rank.sections import read_sections, section

__all__ = ["ENV", "FILE_SIZE", "NO_STEP", "OUTPUT_RECORD", "SIZE", "Beat", "OutputMark", "create_progress_file",
           "progress", "progress_path", "read_progress", "read_sections", "section"]


class _CallableModule(type(sys)):  # type: ignore[misc]
    """`import detlaunch.rank.progress` makes the name detlaunch.rank.progress this module (the import system
    sets it on the package), so the module itself must be callable for ``detlaunch.rank.progress(step)``."""

    def __call__(self, step: int | None = None) -> None:
        progress(step)


sys.modules[__name__].__class__ = _CallableModule
