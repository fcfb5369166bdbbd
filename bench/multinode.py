"""6. Multi-node start: 2 nodes x 2 ranks of a trivial script on 127.0.0.1 and 127.0.0.2.

From start until the exit codes are observed and every process is gone: detlaunch on each node
(for horovod, the worker node's detlaunch runs the per-job sshd) against the bare launcher on
the same hosts: two torchrun agents; horovodrun reaching a standalone sshd on 127.0.0.2 that the
bench starts with its own keys (a service of the bench, not one of the job's processes: for bare
horovodrun, "every process gone" cannot include that sshd's sessions; horovodrun only exits once
they have ended anyway). The sshd is stopped however the bench ends (common.start_service).
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

from .common import (
    DETLAUNCH,
    PY,
    SCRIPTS,
    VENV,
    Goal,
    Panel,
    Section,
    Stat,
    Table,
    free_port,
    interleaved,
    run,
    say,
    start_service,
    stop_service,
)

RANK = [str(SCRIPTS / "rank.py"), "trivial"]
NODES = str(SCRIPTS / "nodes.py")


class StandaloneSshd:
    """An sshd on 127.0.0.2 with keys made for this run, and an `ssh` on PATH that uses them."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(mode=0o700)
        self.port = free_port()
        for key in ("host", "client"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)], check=True)
        config = folder / "sshd_config"
        config.write_text(f"ListenAddress 127.0.0.2:{self.port}\nHostKey {folder / 'host'}\n"
                          f"AuthorizedKeysFile {folder / 'client.pub'}\nPidFile {folder / 'sshd.pid'}\n"
                          "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                          "StrictModes no\nMaxStartups 100\nLogLevel ERROR\n")
        client = folder / "ssh_config"
        client.write_text(f"Host *\n  IdentityFile {folder / 'client'}\n  IdentitiesOnly yes\n  BatchMode yes\n"
                          "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
        self.bin = folder / "bin"
        self.bin.mkdir()
        (self.bin / "ssh").write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {client} "$@"\n')
        (self.bin / "ssh").chmod(0o700)
        # A service of the bench (not a job's process), stopped in stop(), and by its death signal if the
        # bench itself is killed: never left running.
        self.proc = start_service(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], folder / "sshd.log")
        try:
            self._wait_for_greeting()
        except BaseException:
            self.stop()
            raise

    def _wait_for_greeting(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the standalone sshd exited {self.proc.returncode}: "
                                   f"{(self.folder / 'sshd.log').read_text(errors='replace').strip()}")
            try:
                with socket.create_connection(("127.0.0.2", self.port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        stop_service(self.proc)


def detlaunch_two_nodes(layer: str, *extra: str) -> list[str]:
    hosts = ["--hosts", "127.0.0.1:2,127.0.0.2:2", "--master-port", str(free_port()), *extra]
    node = [DETLAUNCH, "--layer", layer, *hosts]
    return [PY, NODES, *node, "--node-rank", "0", *RANK, "---", *node, "--node-rank", "1", *RANK]


def bare_torchrun_two_nodes() -> list[str]:
    port = str(free_port())

    def agent(rank: int) -> list[str]:
        return [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--node-rank",
                str(rank), "--master-addr", "127.0.0.1", "--master-port", port, "--local-addr",
                f"127.0.0.{rank + 1}", "--max-restarts", "0", *RANK]

    return [PY, NODES, *agent(0), "---", *agent(1)]


def main(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    sshd = StandaloneSshd(tmp / "standalone-sshd")
    try:
        bare_hvd_env = {**env, "PATH": f"{sshd.bin}:{env['PATH']}"}
        cases = {
            "detlaunch --layer torchrun, 2x2": (lambda: detlaunch_two_nodes("torchrun"), env),
            "bare torchrun, 2x2": (bare_torchrun_two_nodes, env),
            "detlaunch --layer horovod, 2x2": (lambda: detlaunch_two_nodes("horovod", "--ssh-port",
                                                                         str(free_port())), env),
            "bare horovodrun, 2x2": (lambda: [str(VENV / "bin" / "horovodrun"), "-np", "4", "-p", str(sshd.port),
                                              "-H", "localhost:2,127.0.0.2:2", "--gloo", PY, *RANK], bare_hvd_env),
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for rep, name in interleaved(reps, list(cases)):
            say(f"multinode: {name} ({rep + 1}/{reps})")
            argv, job_env = cases[name]
            job = tmp / f"multinode-{re.sub(r'[^a-z0-9]+', '-', name.lower())}-{rep}"
            job.mkdir()
            samples[name].append(run(argv(), {**job_env, "TMPDIR": str(job)}, timeout=180).check(0).duration)
    finally:
        sshd.stop()
    stats = {name: Stat(s) for name, s in samples.items() if s}  # (--cases: only those that ran)
    pairs = {"detlaunch --layer torchrun, 2x2": "bare torchrun, 2x2",
             "detlaunch --layer horovod, 2x2": "bare horovodrun, 2x2"}
    rows, goals = [], []
    for name, stat in stats.items():
        bare = pairs.get(name) if pairs.get(name) in stats else None
        ratio = f"{stat.median / stats[bare].median:.2f}x {bare}" if bare else ""
        rows.append([name, stat.fmt(), ratio])
        if bare:
            r = stat.median / stats[bare].median
            goals.append(Goal(f"2-node start, {name}", f"<= 1.10x {bare}", f"{r:.2f}x", r <= 1.10))
    table = Table("Multi-node start: 2 nodes (127.0.0.1, 127.0.0.2) x 2 ranks of a trivial script, "
                  "start -> every process gone", ["launcher", "time", "ratio"], rows,
                  ["median (min-max); bare horovodrun reaches a standalone sshd the bench started with its own keys"])
    panel = Panel("2-node start, trivial script (lower is better)", "seconds", list(stats), list(stats.values()))
    return Section("multinode", [table], [panel], goals)
