"""--spawn ssh: what one command costs over starting the nodes one by one (issue 29).

4 and 16 nodes on 127.0.0.2, 127.0.0.3, ... (`--layer direct`, one trivial rank each, bench/scripts/rank.py),
two cases interleaved: every node's `python -m detlaunch --node-rank I` started here at once, as a scheduler
would (bench/scripts/nodes.py), and one `python -m detlaunch --spawn ssh` reaching every node over ssh, in
parallel, through an sshd of the bench's own (root, key-only, the loopback addresses, a bench key and ssh
config given with --ssh-opts). The extra wall time of the spawn is the difference of the medians, whole job
(start to every process gone). Needs root (the sshd), like the bench's flood measurement.

    python -m bench --only spawn --reps 3
    python -m bench.spawn --nodes 4 16 --reps 3      # alone, printing the figures
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .common import (
    MARKER,
    SCRIPTS,
    Goal,
    NotAvailable,
    Panel,
    Section,
    Stat,
    Table,
    become_subreaper,
    free_port,
    interleaved,
    nothing_left,
    run,
    say,
    start_service,
    stop_service,
)

PY = sys.executable
RANK = str(SCRIPTS / "rank.py")
NODES_PY = str(SCRIPTS / "nodes.py")
GOAL = 0.3  # seconds more than one by one, at 16 nodes


@contextmanager
def sshd(tmp: Path, count: int) -> Iterator[Path]:
    """An sshd for root on 127.0.0.2..; yields the ssh config file that reaches it."""
    if os.getuid() != 0 or not shutil.which("sshd"):
        raise NotAvailable("needs root and sshd (a bench sshd for root on loopback)")
    d = tmp / "spawn-sshd"
    d.mkdir()
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    port = free_port()
    listen = "".join(f"ListenAddress 127.0.0.{i + 2}:{port}\n" for i in range(count))
    (d / "sshd_config").write_text(
        f"{listen}HostKey {d / 'host_key'}\nPidFile none\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "PermitRootLogin prohibit-password\nAllowUsers root\nLogLevel ERROR\nMaxStartups 200\nMaxSessions 200\n")
    (d / "ssh_config").write_text(
        f"Host 127.0.0.*\n  Port {port}\n  IdentityFile {d / 'client_key'}\n  StrictHostKeyChecking no\n"
        "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    proc = start_service(["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")], d / "sshd.log")
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.2", port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise NotAvailable("the bench's sshd did not answer within 20 s") from None
                time.sleep(0.05)
        yield d / "ssh_config"
    finally:
        stop_service(proc)


def argv_for(case: str, n: int, ssh_config: Path) -> list[str]:
    hosts = ["--hosts", ",".join(f"127.0.0.{i + 2}:1" for i in range(n)), "--master-port", str(free_port())]
    node = [PY, "-m", "detlaunch", "--layer", "direct", *hosts]
    if case == "one by one":
        argv = [PY, NODES_PY]
        for i in range(n):
            argv += [*(["---"] if i else []), *node, "--node-rank", str(i), RANK, "trivial"]
        return argv
    exported = ",".join(v for v in ("PYTHONPATH", MARKER, "TMPDIR") if v in os.environ or v == MARKER)
    return [*node, "--spawn", "ssh", "--ssh-opts", f"-F {ssh_config}", "--export", exported, RANK, "trivial"]


def wall_times(nodes: list[int], reps: int, env: dict[str, str], tmp: Path) -> dict[tuple[int, str], list[float]]:
    cases = ["one by one", "--spawn ssh"]
    out: dict[tuple[int, str], list[float]] = {(n, c): [] for n in nodes for c in cases}
    with sshd(tmp, max(nodes)) as config:
        for n in nodes:
            for rep, case in interleaved(reps, cases):
                say(f"spawn: {n} nodes, {case} ({rep + 1}/{reps})")
                r = run(argv_for(case, n, config), env, timeout=180).check(0)
                out[(n, case)].append(r.duration)
    return out


def measure(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    nodes = [4, 16]
    t = wall_times(nodes, reps, env, tmp)
    rows, extra = [], {}
    for n in nodes:
        hand, spawned = Stat(t[(n, "one by one")]), Stat(t[(n, "--spawn ssh")])
        extra[n] = spawned.median - hand.median
        rows.append([f"{n} nodes", hand.fmt(), spawned.fmt(), f"{extra[n]:+.3f} s"])
    notes = ["whole job, start to every process gone, one trivial rank a node (no torch); the ssh case includes "
             "ssh's handshakes to a loopback sshd (one a node, in parallel)"]
    table = Table("One command for every node: --spawn ssh vs one by one",
                  ["nodes", "one by one", "--spawn ssh", "extra"], rows, notes)
    goal = Goal("--spawn ssh, extra wall time at 16 nodes", f"<= {GOAL} s", f"{extra[16]:.3f} s", extra[16] <= GOAL)
    panel = Panel("--spawn ssh: extra wall time over one by one (lower is better)", "seconds",
                  [f"{n} nodes" for n in nodes], [Stat([extra[n]]) for n in nodes], goal=GOAL)
    return Section("spawn", [table], [panel], [goal])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spawn", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[4, 16])
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    become_subreaper()  # the bench's wait loop: every process of a job reaped, SIGCHLD through a pipe
    with nothing_left(), tempfile.TemporaryDirectory() as tmp_name:
        env = {**os.environ, "TMPDIR": tmp_name}
        t = wall_times(args.nodes, args.reps, env, Path(tmp_name))
    for n in args.nodes:
        hand, spawned = Stat(t[(n, "one by one")]), Stat(t[(n, "--spawn ssh")])
        print(f"{n:>3} nodes: one by one {hand.fmt(digits=3)}, --spawn ssh {spawned.fmt(digits=3)}, "
              f"extra {spawned.median - hand.median:+.3f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
