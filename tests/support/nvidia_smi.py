"""A stub `nvidia-smi` on PATH: the compute apps a test says, while it says so (no GPU here).

It answers ``--query-compute-apps=pid,used_memory --format=csv,noheader,nounits`` with the lines the
test put in `holders`, while the file `busy` exists; it can also fail as nvidia-smi does without a
driver, or hang as it does on a wedged GPU. Every call is logged (time, pid, arguments).
"""

from __future__ import annotations

import os
from pathlib import Path

STUB = """#!/bin/sh
echo "$(date +%s.%N) $$ $*" >> {calls}
if [ -e {hang} ]; then exec sleep 60; fi
if [ -e {fail} ]; then
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    exit 9
fi
if [ -e {busy} ]; then cat {holders}; fi
exit 0
"""


class FakeNvidiaSmi:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.holders, self.busy, self.calls_log = folder / "holders", folder / "busy", folder / "calls"
        self.fail_file, self.hang_file = folder / "fail", folder / "hang"
        stub = folder / "nvidia-smi"
        stub.write_text(STUB.format(calls=self.calls_log, hang=self.hang_file, fail=self.fail_file, busy=self.busy,
                                    holders=self.holders))
        stub.chmod(0o755)

    @property
    def path(self) -> str:
        """A PATH with the stub first."""
        return f"{self.folder}:{os.environ['PATH']}"

    def hold(self, memory: dict[int, int]) -> None:
        """From now on, these pids hold this many MiB."""
        self.holders.write_text("".join(f"{pid}, {mib}\n" for pid, mib in memory.items()))
        self.busy.touch()

    def free(self) -> None:
        self.busy.unlink()

    def fail(self) -> None:
        self.fail_file.touch()

    def hang(self) -> None:
        self.hang_file.touch()

    def calls(self) -> list[tuple[float, int, str]]:
        """(time.time(), pid, arguments) of every call so far."""
        if not self.calls_log.exists():
            return []
        out = []
        for line in self.calls_log.read_text().splitlines():
            when, pid, args = line.split(" ", 2)
            out.append((float(when), int(pid), args))
        return out
