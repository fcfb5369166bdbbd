"""Everything that listens, attacked: the supervisor's Unix socket, the chief's TCP link, sshd,
and the paths a job writes. A test user (created with useradd, removed at the end) plays the
other user on the machine."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.helpers import descendants_where, free_port, rank_lines, wait_until
from support.jobs import SCRIPTS, Job, Launcher

pytestmark = pytest.mark.timeout(240)
RANKS = str(SCRIPTS / "ranks.py")
USER = "dltest"


@pytest.fixture(scope="module")
def other_user() -> Iterator[pwd.struct_passwd]:
    """A second, unprivileged user; created for these tests and removed afterwards."""
    if os.getuid() != 0:
        pytest.skip("needs root to create a test user")
    created = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
        created = True
    yield pwd.getpwnam(USER)
    if created:
        subprocess.run(["userdel", USER], check=True)


def supervisor_socket(job: Job) -> str:
    """The supervisor socket of a running job, read from its rank's environment."""
    pid = job.host_pid(int(re.search(r"started pid=(\d+)", job.read()).group(1)))  # type: ignore[union-attr]
    env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
    return env["DETLAUNCH_SUPERVISOR"]


def as_user(user: pwd.struct_passwd, code: str) -> subprocess.CompletedProcess[str]:
    """Run Python code as `user` (Debian's python3: the venv's interpreter lives under /root)."""
    return subprocess.run(["runuser", "-u", user.pw_name, "--", "/usr/bin/python3", "-c", code],
                          capture_output=True, text=True, timeout=30)


def gated_rank(tmp_path: Path) -> tuple[Path, Path]:
    """A rank that prints 'waiting', blocks until the test writes to a FIFO, then prints 'done'."""
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    script = tmp_path / "rank.py"
    script.write_text(f"print('waiting', flush=True)\nopen({str(fifo)!r}).read(1)\nprint('done', flush=True)\n")
    return script, fifo


def test_the_supervisor_socket_is_private_and_refuses_another_user(
    launcher: Launcher, other_user: pwd.struct_passwd
) -> None:
    job = launcher.start("--layer", "torchrun", "--master-port", str(free_port()), RANKS, env={"SLEEP": "60"})
    job.wait_for_output("rank 0 sleeping")
    path = supervisor_socket(job)
    run_dir = os.path.dirname(path)
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert re.fullmatch(r"detlaunch-[0-9a-f]{16}", os.path.basename(run_dir))  # not predictable
    probe = as_user(other_user, f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({path!r})")
    assert "PermissionError" in probe.stderr, probe.stderr
    job.send_signal(signal.SIGTERM)
    assert job.wait(60).returncode == 143


def test_the_supervisor_checks_peer_credentials(launcher: Launcher, other_user: pwd.struct_passwd,
                                                tmp_path: Path) -> None:
    """Even with the socket opened up to everyone, a peer of another uid is hung up on."""
    script, fifo = gated_rank(tmp_path)
    job = launcher.start("--layer", "torchrun", "--master-port", str(free_port()), "--nproc-per-node", "1",
                         str(script))
    job.wait_for_output("[rank=0] waiting")
    path = supervisor_socket_of_job(job.proc.pid)
    os.chmod(os.path.dirname(path), 0o711)  # the misconfiguration an attacker would need...
    os.chmod(path, 0o666)
    hello = json.dumps({"t": "hello", "job": "x", "rank": 0, "pid": 1})
    probe = as_user(other_user, "\n".join([
        "import socket",
        "s = socket.socket(socket.AF_UNIX)",
        "s.settimeout(10)",
        f"s.connect({path!r})",
        "try:",
        f"    s.sendall({hello!r}.encode() + b'\\n')",
        "    print('answered' if s.recv(4096) else 'hung up')",
        "except (BrokenPipeError, ConnectionResetError):",
        "    print('hung up')",
    ]))
    assert probe.stdout.strip() == "hung up", probe.stdout + probe.stderr  # ...and still no answer
    with open(fifo, "w") as f:
        f.write("x")
    r = job.wait(60)
    assert r.returncode == 0, r.output
    assert rank_lines(r.stdout, 0) == ["waiting", "done"]


def supervisor_socket_of_job(detlaunch_pid: int) -> str:
    """The socket of a running detlaunch, from the environment of the launcher it started
    (below the supervisor, which runs as detlaunch's child in a PID namespace of its own)."""
    [launcher, *_] = descendants_where(detlaunch_pid, lambda p: "DETLAUNCH_SUPERVISOR" in p.environ())
    return str(launcher.environ()["DETLAUNCH_SUPERVISOR"])


def two_node_torchrun(port: int, node: int, *extra: str) -> list[str]:
    return ["--layer", "torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--node-rank", str(node), "--node-addr", f"127.0.0.{node + 1}", *extra]


def read_line(sock: socket.socket) -> dict[str, object]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return json.loads(data) if data else {}


def test_the_chief_refuses_a_wrong_job_secret_and_the_job_goes_on(launcher: Launcher, tmp_path: Path) -> None:
    port = free_port()
    job_dir = tmp_path / "jobdir"
    chief = launcher.start(*two_node_torchrun(port, 0, "--job-dir", str(job_dir)), RANKS)

    def connect() -> socket.socket | None:
        assert chief.proc.poll() is None, chief.read()
        try:
            return socket.create_connection(("127.0.0.1", port + 1), timeout=10)
        except ConnectionRefusedError:
            return None

    intruder = wait_until(connect, 60, "the chief's link port")
    challenge = read_line(intruder)
    assert challenge["t"] == "challenge"
    intruder.sendall(json.dumps({"t": "auth", "node": 1, "nonce": "n", "mac": "0" * 64}).encode() + b"\n")
    assert intruder.recv(4096) == b""  # refused: no welcome, connection closed
    intruder.close()
    # A peer that floods the port without ever authenticating is cut off...
    flooder = wait_until(connect, 10, "the chief's link port")
    assert read_line(flooder)["t"] == "challenge"
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        flooder.sendall(b"x" * 100_000)
    flooder.settimeout(10)
    with contextlib.suppress(ConnectionResetError):
        assert flooder.recv(4096) == b""
    flooder.close()
    # ...and so is one that never says anything (after the heartbeat deadline, 5 x 1 s)
    silent = wait_until(connect, 10, "the chief's link port")
    assert read_line(silent)["t"] == "challenge"
    silent.settimeout(30)
    started = time.monotonic()
    assert silent.recv(4096) == b""
    assert time.monotonic() - started < 25
    silent.close()
    secret = job_dir / "secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    worker = launcher.start(*two_node_torchrun(port, 1, "--job-dir", str(job_dir)), RANKS)
    rc, rw = chief.wait(120), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    assert not job_dir.exists()  # the secret and the job dir are gone with the job


def test_a_symlink_planted_in_the_job_dir_is_not_followed(launcher: Launcher, tmp_path: Path) -> None:
    job_dir = tmp_path / "jobdir"
    job_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (job_dir / "secret").symlink_to(victim)
    port = free_port()
    chief = launcher.start(*two_node_torchrun(port, 0, "--job-dir", str(job_dir)), RANKS)
    worker = launcher.start(*two_node_torchrun(port, 1, "--job-dir", str(job_dir)), RANKS)
    rc, rw = chief.wait(120), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    assert victim.read_text() == "precious\n"


def test_a_job_dir_that_is_a_symlink_is_refused(launcher: Launcher, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "jobdir").symlink_to(elsewhere)
    r = launcher.run(*two_node_torchrun(free_port(), 0, "--job-dir", str(tmp_path / "jobdir")), RANKS)
    assert (r.returncode, r.stderr) == (2, f"detlaunch: error: --job-dir {tmp_path / 'jobdir'} is a symlink: refusing "
                                        "to follow it for the job's keys; choose another --job-dir\n")
    assert list(elsewhere.iterdir()) == []


def test_sshd_is_key_only_and_listens_only_on_its_node_address(launcher: Launcher, tmp_path: Path) -> None:
    ssh_port = free_port("127.0.0.2")
    worker = launcher.start("--layer", "horovod", "--hosts", "127.0.0.1:1,127.0.0.2:1", "--node-rank", "1",
                            "--ssh-port", str(ssh_port), "--master-port", str(free_port()), RANKS)

    def listening_sshd() -> psutil.Process | None:
        assert worker.proc.poll() is None, worker.read()
        for sshd in descendants_where(worker.proc.pid, lambda p: p.name() == "sshd"):
            with contextlib.suppress(psutil.NoSuchProcess):  # a connection's child, gone
                if any(c.status == psutil.CONN_LISTEN for c in sshd.net_connections()):
                    return sshd
        return None

    sshd = wait_until(listening_sshd, 60, "the worker's sshd")
    listening = {(c.laddr.ip, c.laddr.port) for c in sshd.net_connections() if c.status == psutil.CONN_LISTEN}
    assert listening == {("127.0.0.2", ssh_port)}
    base = ["ssh", "-F", "/dev/null", "-p", str(ssh_port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10"]
    password = subprocess.run([*base, "-o", "PreferredAuthentications=password,keyboard-interactive",
                               "127.0.0.2", "true"], capture_output=True, text=True, timeout=30)
    assert password.returncode == 255 and "Permission denied (publickey)" in password.stderr
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    stranger = subprocess.run([*base, "-i", str(key), "-o", "IdentitiesOnly=yes", "127.0.0.2", "true"],
                              capture_output=True, text=True, timeout=30)
    assert stranger.returncode == 255 and "Permission denied (publickey)" in stranger.stderr
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(60).returncode == 143


def test_no_process_in_the_jobs_namespace_holds_the_job_secret_given_in_the_environment(launcher: Launcher,
                                                                                         tmp_path: Path) -> None:
    """Security round 2, item 1: the node's supervisor (pid 1 of the job's namespace) is a fork of detlaunch, so
    /proc/1/environ showed the secret the user set, to every rank. Two nodes with job dirs of their own: the link
    can only have authenticated with the secret from the environment, so it was kept where detlaunch needs it."""
    port, secret = free_port(), "s3cret-" + os.urandom(8).hex()
    env = {"DETLAUNCH_JOB_SECRET": secret}
    jobs = [launcher.start(*two_node_torchrun(port, node, "--job-dir", str(tmp_path / f"jobdir-{node}")),
                           str(SCRIPTS / "environ_peek.py"), env=env) for node in (0, 1)]
    done = [job.wait(120) for job in jobs]
    assert [d.returncode for d in done] == [0, 0], done[0].output + done[1].output
    for rank, d in enumerate(done):
        (line,) = rank_lines(d.stdout, rank)
        assert line.endswith(", /proc/1's: True, the secret in: []"), d.output
        assert secret not in d.stdout + d.stderr
