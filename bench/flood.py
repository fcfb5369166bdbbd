"""The verdict path under a connection flood (issue 16.8), run alone: ``python -m bench.flood [REPS]``.

A 2-node torchrun job (127.0.0.1 chief, 127.0.0.2 worker, 1 rank each); once both ranks are up, the
worker's rank is told to exit 3. Measured: from that moment to both detlaunch processes exited, with
and without another user flooding the chief's control port with connections the whole time.
"""

from __future__ import annotations

import os
import pwd
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

from .common import DETLAUNCH, ROOT, free_port

RANKS = str(ROOT / "tests" / "scripts" / "ranks.py")
FLOOD = textwrap.dedent("""
    import socket, sys, time
    port, held = int(sys.argv[1]), []
    while True:
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=0.2, source_address=("127.0.0.5", 0)))
            if len(held) > 500:
                held.pop(0).close()
        except OSError:
            time.sleep(0.001)
""")


def once(tmp: Path, user: str | None) -> float:
    fifo = tmp / f"go-{uuid.uuid4().hex[:6]}"
    os.mkfifo(fifo)
    master, control = free_port(), free_port()
    common = ["--layer", "torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--master-port", str(master), "--control-port", str(control)]
    env = {**os.environ, "FAIL_RANK": "1", "FAIL_CODE": "3", "SLEEP": "120", "TRIGGER": str(fifo),
           "TMPDIR": str(tmp)}
    out = [tmp / f"n{n}.out" for n in (0, 1)]
    jobs = [subprocess.Popen([DETLAUNCH, *common, "--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}", RANKS],
                             env=env, stdout=open(out[n], "wb"), stderr=subprocess.STDOUT, start_new_session=True)
            for n in (0, 1)]
    flood = None
    if user:
        flood = subprocess.Popen(["runuser", "-u", user, "--", "/usr/bin/python3", "-c", FLOOD, str(control)],
                                 cwd="/", start_new_session=True)
    try:
        while b"rank 0 sleeping" not in out[0].read_bytes() or b"rank 1 waiting" not in out[1].read_bytes():
            time.sleep(0.02)  # the bench waits for the job to be up; detlaunch itself never polls
        time.sleep(1.0 if user else 0)  # let the flood run against the running job first
        started = time.monotonic()
        with open(fifo, "wb") as f:
            f.write(b"x")
        codes = [job.wait(60) for job in jobs]
        took = time.monotonic() - started
        assert codes == [3, 3], (codes, out[0].read_text(), out[1].read_text())
        return took
    finally:
        for proc in [*jobs, *([flood] if flood else [])]:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def main(reps: int) -> None:
    user = f"dlb{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "-M", "-s", "/bin/sh", user], check=True)
    uid = pwd.getpwnam(user).pw_uid
    samples: dict[str, list[float]] = {"no flood": [], "flooded": []}
    try:
        with tempfile.TemporaryDirectory(prefix="detlaunch-bench-flood-") as tmp:
            for _ in range(reps):
                for case in samples:
                    samples[case].append(once(Path(tmp), user if case == "flooded" else None))
    finally:
        for entry in os.listdir("/proc"):  # whatever the flooding user still runs, by PID
            try:
                if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid:
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                continue
        subprocess.run(["userdel", user], check=False)
    for case, values in samples.items():
        print(f"{case}: failing rank's exit -> both nodes exited: median {statistics.median(values):.2f} s "
              f"({min(values):.2f}-{max(values):.2f}) over {len(values)} runs")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
