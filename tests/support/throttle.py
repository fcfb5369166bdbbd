"""A really slow machine for a test: a cgroup whose processes get a fraction of one CPU."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.helpers import wait_until


@contextlib.contextmanager
def cpu_quota(tmp_path: Path, fraction: float) -> Iterator[Path]:
    """A cgroup whose processes get `fraction` of one CPU (v2's cpu.max, or v1's cpu controller); removed after."""
    name = f"detlaunch-test-{uuid.uuid4().hex[:8]}"
    v2 = Path("/sys/fs/cgroup")
    if "cpu" in (v2 / "cgroup.controllers").read_text().split() if (v2 / "cgroup.controllers").exists() else False:
        group = v2 / name
        limit = (group / "cpu.max", f"{int(fraction * 100000)} 100000")
    else:
        group = Path("/sys/fs/cgroup/cpu") / name
        limit = (group / "cpu.cfs_quota_us", str(int(fraction * 100000)))
    try:
        group.mkdir()
        limit[0].write_text(limit[1])
    except OSError as e:
        pytest.skip(f"no CPU-throttled cgroup here ({e})")
    try:
        yield group
    finally:
        parent = group.parent / "cgroup.procs"
        for pid in (group / "cgroup.procs").read_text().split():  # the job's leftovers (none: the job ended)
            with contextlib.suppress(OSError):
                parent.write_text(pid)

        def removed() -> bool:
            try:
                group.rmdir()
            except OSError:
                return False
            return True

        wait_until(removed, 10, "the test's cgroup removed")
