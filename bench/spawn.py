"""--spawn ssh: what one command costs over starting the nodes one by one, and against the launchers' own
one-command fan-out (issue 29).

4 and 16 nodes on 127.0.0.2, 127.0.0.3, ... (one trivial rank each, bench/scripts/rank.py, which imports no
torch), five cases interleaved:

- one by one: every node's `python -m detlaunch --layer direct --node-rank I` started here at once, as a
  scheduler would (bench/scripts/nodes.py);
- --spawn ssh: one `python -m detlaunch --layer direct --spawn ssh` reaching every node over ssh, in parallel;
- ssh alone: the same ssh sessions started side by side, each running `exec true`: the floor of the spawn here;
- deepspeed --hostfile: bare deepspeed's own fan-out (pdsh over ssh, one `deepspeed.launcher.launch` a node,
  which imports deepspeed and torch), `--no_ssh_check --master_addr 127.0.0.2` (its ssh check and `hostname -I`
  would not reach the bench's sshd), DS_ACCELERATOR=cpu through its env file;
- horovodrun -H: bare horovodrun's own fan-out (ssh to each host: its ssh check, then the rank),
  `--gloo --network-interfaces lo --disable-cache` (no NIC discovery round, no cache file in ~).

Every ssh goes to an sshd of the bench's own (root, key-only, the loopback addresses): detlaunch is given its
ssh config with --ssh-opts; deepspeed's pdsh and horovodrun find an `ssh` on PATH that uses it. The extra wall
time of the spawn is the difference of the medians, whole job (start to every process gone; for the bare
launchers, the ranks' ssh sessions end before they exit). Needs root (the sshd), like the flood measurement.
A launcher that is not installed is n/a.

The floor. On one machine every "node" shares its 2 cores, so the spawn's extra wall time is about its extra CPU
time / 2, and nearly all of it is ssh's, once per node: the client's key exchange (OpenSSH 9.2's default
sntrup761x25519: ~0.11 s of CPU a connection; curve25519-sha256 alone: ~0.02 s), the per-connection sshd
(~0.03 s), and the remote user's shell, which reads ~/.bashrc under sshd (Debian's bash): root's here runs
`pyenv init` twice, ~0.2 s of CPU a session. 16 sessions: ~5.5 s of CPU, ~3 s of wall time on 2 cores, the
"ssh alone" column. The spawning command's own start (Python, plugins, the hosts) is ~0.17 s. On a real
cluster each node pays its sshd and its shell on its own cores, at once, and the spawning machine pays the
clients' key exchanges on its cores. detlaunch passes no ssh option that would weaken what the user's own ssh
config asks for (a user may pick a cheaper key exchange with --ssh-opts or ~/.ssh/config).

    python -m bench --only spawn --reps 3
    python -m bench.spawn --nodes 4 16 --reps 3      # alone, printing the figures
    python -m bench.spawn --nodes 4 16 --reps 3 --no-launchers   # detlaunch's two cases only
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
    VENV,
    Goal,
    NotAvailable,
    Panel,
    Section,
    Stat,
    Table,
    base_env,
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
OURS = ["one by one", "--spawn ssh"]
FLOOR = "ssh alone"  # the same ssh sessions running nothing: what the spawn cannot go below on this machine
LAUNCHERS = {"deepspeed --hostfile": VENV / "bin" / "deepspeed", "horovodrun -H": VENV / "bin" / "horovodrun"}


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
        f"Host 127.0.0.*\n  Port {port}\n  IdentityFile {d / 'client_key'}\n  IdentitiesOnly yes\n  BatchMode yes\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    (d / "bin").mkdir()  # the `ssh` that pdsh and horovodrun run: the bench's config, whatever they add
    (d / "bin" / "ssh").write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {d / "ssh_config"} "$@"\n')
    (d / "bin" / "ssh").chmod(0o700)
    (d / "ds_env").write_text("DS_ACCELERATOR=cpu\n")  # deepspeed's env file (DS_ENV_FILE): every node's launch
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


def launcher_case(case: str, n: int, ssh_config: Path) -> list[str]:
    """Bare deepspeed or horovodrun starting the same ranks on the same hosts through their own fan-out."""
    addrs = [f"127.0.0.{i + 2}" for i in range(n)]
    if case == "horovodrun -H":
        return [str(LAUNCHERS[case]), "-np", str(n), "-H", ",".join(f"{a}:1" for a in addrs), "--gloo",
                "--network-interfaces", "lo", "--disable-cache", PY, RANK, "trivial"]
    hostfile = ssh_config.parent / f"hostfile-{n}"
    hostfile.write_text("".join(f"{a} slots=1\n" for a in addrs))
    return [str(LAUNCHERS[case]), "--hostfile", str(hostfile), "--master_addr", addrs[0], "--master_port",
            str(free_port()), "--no_ssh_check", "--launcher", "pdsh", RANK, "trivial"]


def launcher_env(env: dict[str, str], ssh_config: Path) -> dict[str, str]:
    d = ssh_config.parent
    return {**env, "PATH": f"{d / 'bin'}:{env.get('PATH', '')}", "DS_ENV_FILE": str(d / "ds_env"),
            "DS_ACCELERATOR": "cpu"}


def argv_for(case: str, n: int, ssh_config: Path) -> list[str]:
    if case in LAUNCHERS:
        return launcher_case(case, n, ssh_config)
    hosts = ["--hosts", ",".join(f"127.0.0.{i + 2}:1" for i in range(n)), "--master-port", str(free_port())]
    node = [PY, "-m", "detlaunch", "--layer", "direct", *hosts]
    if case == "one by one":
        argv = [PY, NODES_PY]
        for i in range(n):
            argv += [*(["---"] if i else []), *node, "--node-rank", str(i), RANK, "trivial"]
        return argv
    if case == FLOOR:  # as --spawn ssh runs them (cli/fanout.py), each remote shell running `exec true`
        argv = [PY, NODES_PY]
        for i in range(n):
            argv += [*(["---"] if i else []), "ssh", "-T", "-o", "BatchMode=yes", "-F", str(ssh_config), "--",
                     f"127.0.0.{i + 2}", "exec true"]
        return argv
    exported = ",".join(v for v in ("PYTHONPATH", MARKER, "TMPDIR") if v in os.environ or v == MARKER)
    return [*node, "--spawn", "ssh", "--ssh-opts", f"-F {ssh_config}", "--export", exported, RANK, "trivial"]


def cases_here(launchers: bool) -> list[str]:
    """detlaunch's two cases, the ssh floor, and each launcher that is installed (with pdsh for deepspeed)."""
    if not launchers:
        return [*OURS, FLOOR]
    found = [c for c, path in LAUNCHERS.items() if path.exists() and (c != "deepspeed --hostfile" or
                                                                         shutil.which("pdsh"))]
    return [*OURS, FLOOR, *found]


def wall_times(nodes: list[int], reps: int, env: dict[str, str], tmp: Path,
               cases: list[str]) -> dict[tuple[int, str], list[float]]:
    out: dict[tuple[int, str], list[float]] = {(n, c): [] for n in nodes for c in cases}
    with sshd(tmp, max(nodes)) as config:
        for n in nodes:
            for rep, case in interleaved(reps, cases):
                say(f"spawn: {n} nodes, {case} ({rep + 1}/{reps})")
                job_env = launcher_env(env, config) if case in LAUNCHERS else env
                r = run(argv_for(case, n, config), job_env, timeout=300).check(0)
                out[(n, case)].append(r.duration)
    return out


def measure(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    nodes = [4, 16]
    cases = cases_here(launchers=True)
    t = wall_times(nodes, reps, env, tmp, cases)
    rows, extra = [], {}
    others = cases[len(OURS):]
    for n in nodes:
        hand, spawned = Stat(t[(n, "one by one")]), Stat(t[(n, "--spawn ssh")])
        extra[n] = spawned.median - hand.median
        rows.append([f"{n} nodes", hand.fmt(), spawned.fmt(), f"{extra[n]:+.3f} s",
                     *[Stat(t[(n, c)]).fmt() for c in others]])
    notes = ["whole job, start to every process gone, one trivial rank a node (no torch); the ssh cases include "
             "ssh's handshakes to a loopback sshd (one a node, in parallel)",
             "ssh alone: the same ssh sessions running nothing, the spawn's floor on one 2-core machine (the clients' "
             "key exchanges, the sshd, the remote shell's ~/.bashrc: see bench/spawn.py)",
             "bare deepspeed's launch on each node imports deepspeed and torch; horovodrun checks ssh to every "
             "host first (see bench/spawn.py)"]
    table = Table("One command for every node: --spawn ssh vs one by one, and vs the launchers' own fan-out",
                  ["nodes", "one by one", "--spawn ssh", "extra", *others], rows, notes)
    goal = Goal("--spawn ssh, extra wall time at 16 nodes", f"<= {GOAL} s", f"{extra[16]:.3f} s", extra[16] <= GOAL)
    panel = Panel("--spawn ssh: extra wall time over one by one (lower is better)", "seconds",
                  [f"{n} nodes" for n in nodes], [Stat([extra[n]]) for n in nodes], goal=GOAL)
    return Section("spawn", [table], [panel], [goal])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spawn", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[4, 16])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-launchers", action="store_true", help="only detlaunch's cases (no bare deepspeed/horovodrun)")
    args = p.parse_args(argv)
    cases = cases_here(launchers=not args.no_launchers)
    become_subreaper()  # the bench's wait loop: every process of a job reaped, SIGCHLD through a pipe
    with nothing_left(), tempfile.TemporaryDirectory() as tmp_name:
        env = base_env(Path(tmp_name))  # as `python -m bench` runs it: .pyc files written, the venv first on PATH
        t = wall_times(args.nodes, args.reps, env, Path(tmp_name), cases)
    for n in args.nodes:
        hand, spawned = Stat(t[(n, "one by one")]), Stat(t[(n, "--spawn ssh")])
        others = "".join(f", {c} {Stat(t[(n, c)]).fmt(digits=3)}" for c in cases[len(OURS):])
        print(f"{n:>3} nodes: one by one {hand.fmt(digits=3)}, --spawn ssh {spawned.fmt(digits=3)}, "
              f"extra {spawned.median - hand.median:+.3f} s{others}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
