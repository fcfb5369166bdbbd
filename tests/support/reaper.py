"""Nothing of a test run outlives it, however it ends: normally, Ctrl-C, SIGTERM, or SIGKILL of pytest.

:func:`start` (tests/conftest.py calls it first thing, in every pytest process) gives the run a
marker variable in os.environ, so that every process the run starts inherits it (the SLURM test
cluster's daemons and their job steps, every detlaunch and its ranks, an xdist worker), and starts
this file as a script, in a session of its own, with the read end of a pipe as stdin; only pytest
holds the write end. The script blocks on stdin; end of file comes when pytest is gone, whatever
ended it (the kernel closes a dead process's pipes). Then it kills every live process that carries
the marker (again and again until none is left: a dying process may have started another), and
removes the folders the run named with :func:`remove_at_exit`. After a run whose fixtures cleaned up
there is nothing left to kill; whatever it had to kill is said on stderr, so a leak is seen.

The script part uses the standard library only and runs with ``python -I``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

RUN_VAR = "DLTESTS_RUN"  # not a DETLAUNCH_* name: tests/support/discovery.clean_env drops those
_pipe: int | None = None  # the write end: closed by the kernel when this process ends, however it ends


def start() -> None:
    """Mark this pytest process's run and start its reaper (once per process; an xdist worker or a
    pytest a test starts has a reaper of its own, and dies by its parent run's)."""
    global _pipe
    if _pipe is not None:
        return
    marker = f"{RUN_VAR}={uuid.uuid4().hex}"
    os.environ[RUN_VAR] = marker.split("=", 1)[1]
    read, write = os.pipe()  # not inheritable: only this process holds the write end
    env = {k: v for k, v in os.environ.items() if k != RUN_VAR}
    subprocess.run([sys.executable, "-I", __file__, marker], stdin=read, env=env, start_new_session=True, check=True)
    os.close(read)
    _pipe = write


def remove_at_exit(path: str | os.PathLike[str]) -> None:
    """Have the reaper remove this folder when the run is over (a no-op for one removed already)."""
    assert _pipe is not None, "reaper.start() first (tests/conftest.py)"
    os.write(_pipe, f"rm {os.fspath(path)}\n".encode())


def marked(needle: bytes) -> list[int]:
    """Live (not zombie) processes whose environment holds `needle` (``NAME=value``), this one aside."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def kill_all(needle: bytes, patience: float = 30.0) -> list[int]:
    """SIGKILL every marked process until none is seen for 0.5 s (or `patience` runs out): what was killed."""
    killed: list[int] = []
    deadline = time.monotonic() + patience
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        pids = marked(needle)
        if not pids:
            if time.monotonic() - quiet_since >= 0.5:
                break
        else:
            quiet_since = time.monotonic()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                if pid not in killed:
                    killed.append(pid)
        time.sleep(0.05)
    return killed


def main() -> None:
    if os.fork():
        os._exit(0)  # pytest waits for this one; the reaper goes on as no child of pytest's
    needle = sys.argv[1].encode()
    folders: list[str] = []
    for line in sys.stdin:  # until pytest is gone
        what, _, path = line.rstrip("\n").partition(" ")
        if what == "rm" and path:
            folders.append(path)
    killed = kill_all(needle)
    if killed:
        sys.stderr.write(f"tests/support/reaper.py: the test run left {len(killed)} process(es) running: killed "
                         f"{' '.join(map(str, killed))}\n")
    for path in folders:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
