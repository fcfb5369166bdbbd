"""A real two-node SLURM cluster on this one machine, owned (started and stopped) by the tests.

munged, slurmctld and two slurmd "nodes" (n1 on 127.0.0.1, n2 on 127.0.0.2) run in the
foreground as children of the test process, each in its own process group, with every file
(munge key, socket, pid files, logs, state, spool, slurm.conf) in one temp directory. They
listen on loopback only (``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny``) and on
ports picked free at start, so two clusters can run side by side. Stopping kills each daemon
by its PID (then its process group), reaps it, and fails loudly if anything of the cluster is
still alive: no daemon is ever found or killed by name. A run cut short (SIGKILL of pytest included)
does not leave it running either: the daemons and their job steps carry the run's marker, and the
run's reaper (tests/support/reaper.py) kills them once pytest is gone.

Node names: a job sees its nodes as SLURM names (``SLURM_JOB_NODELIST=n[1-2]``) and detlaunch
resolves them with ``getaddrinfo``. n1/n2 resolve nowhere on this machine, and editing the
shared /etc/hosts would change name resolution for every process on it (and leak if the test
run is killed). Instead each slurmd starts in its own mount namespace (``unshare --mount``)
where a private copy of /etc/hosts, with ``n1 127.0.0.1`` and ``n2 127.0.0.2`` appended, is
bind-mounted over /etc/hosts. Job steps are children of slurmd, so they inherit the view; no
other process sees it, and it vanishes with the last process in the namespace: nothing to
undo, even after a crash.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from detlaunch.testing import free_port
from detlaunch.testing.runner import processes_with_marker

from support import reaper

NODES = {"n1": "127.0.0.1", "n2": "127.0.0.2"}
# Each node's fake GPUs (gres): SLURM wants character devices, so copies of /dev/null (1,3) that nothing
# opens (task/none constrains no device); a step given some gets CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS...
GPUS = 4
MARKER_ENV = "DETLAUNCH_SLURM_CLUSTER"


class ClusterStartError(RuntimeError):
    """The cluster did not come up; the message carries the daemons' log tails."""


def missing_tools() -> list[str]:
    """The programs a real cluster needs that are not installed here (see scripts/setup.sh)."""
    tools = ("mungekey", "munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "scancel", "unshare", "mount")
    return [t for t in tools if shutil.which(t) is None and not os.path.exists(f"/usr/sbin/{t}")]


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _alive(pid: int) -> bool:
    """True while `pid` runs; a zombie counts as gone (kill -0 says it still exists)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return line.split()[1] not in ("Z", "X")
    except OSError:
        return False
    return False


def processes_in_namespaces(namespaces: set[str]) -> list[int]:
    """Live PIDs in any of these mount namespaces (``mnt:[N]``, as /proc/PID/ns/mnt reads).

    Only while each namespace is held (hold_namespace): the kernel hands a freed namespace's number to the
    next namespace made, of any kind, at once; a detlaunch of another test makes one for every node."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not namespaces:
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/mnt") not in namespaces:
                continue
        except OSError:
            continue
        if _alive(int(entry)):
            found.append(int(entry))
    return found


def hold_namespace(pid: int) -> tuple[str, int]:
    """The mount namespace of `pid` and a descriptor that keeps it (and so its number) from being freed."""
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.readlink(f"/proc/self/fd/{fd}"), fd
    except OSError:
        os.close(fd)
        raise


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclasses.dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


class SlurmCluster:
    """munged + slurmctld + slurmd n1 + slurmd n2, all in `root`; use start() and stop()."""

    def __init__(self, root: Path):
        self.root = root
        self.hostname = socket.gethostname()
        self.marker = f"{MARKER_ENV}={uuid.uuid4().hex}"
        self.ctld_port = free_port()
        self.node_ports = {name: free_port() for name in NODES}
        self.daemons: list[Daemon] = []
        self.munge_socket = root / "munge" / "munge.socket"
        self.conf = root / "slurm.conf"
        key, value = self.marker.split("=")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), key: value}
        self.job_env: dict[str, str] = {}  # a test's additions for the jobs it submits (see run())
        self.node_namespaces: set[str] = set()  # the nodes' mount namespaces: every process of a node is in one
        self.held: list[int] = []  # a descriptor of each, until stop() has checked them (hold_namespace)

    # -- files -------------------------------------------------------------------------------

    def _write_files(self) -> None:
        r = self.root
        for sub in ("munge", "state", "log", "tmp", *(f"spool/{n}" for n in NODES)):
            (r / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(r, 0o755)
        os.chmod(r / "munge", 0o755)  # munged refuses a socket dir others may write to
        (r / "plugstack.conf").write_text("")
        (r / "dev").mkdir(exist_ok=True)
        for i in range(GPUS):
            os.mknod(r / "dev" / f"nvidia{i}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        (r / "gres.conf").write_text(f"Name=gpu File={r}/dev/nvidia[0-{GPUS - 1}]\n")
        hosts = Path("/etc/hosts").read_text()
        lines = "".join(f"{addr} {name}\n" for name, addr in NODES.items())
        (r / "hosts").write_text(hosts.rstrip("\n") + "\n" + lines)
        nodes = "\n".join(
            f"NodeName={name} NodeHostname={name} NodeAddr={addr} Port={self.node_ports[name]} "
            f"CPUs=2 Gres=gpu:{GPUS} State=UNKNOWN"
            for name, addr in NODES.items()
        )
        self.conf.write_text(f"""\
ClusterName=detlaunchtest
GresTypes=gpu
SlurmctldHost={self.hostname}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
PlugStackConfig={r}/plugstack.conf
PropagateResourceLimits=NONE
ReturnToService=2
KillWait=5
MinJobAge=2
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
TmpFS={r}/tmp
{nodes}
PartitionName=main Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")

    # -- daemons -----------------------------------------------------------------------------

    def _spawn(self, name: str, argv: Sequence[str], log: Path) -> None:
        out = open(self.root / "log" / f"{name}.out", "wb")
        with out:
            proc = subprocess.Popen(list(argv), env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.daemons.append(Daemon(name, proc, log))

    def check_running(self) -> None:
        for d in self.daemons:
            if d.proc.poll() is not None:
                raise ClusterStartError(f"{d.name} exited with {d.proc.returncode}:\n{self._logs()}")

    def _logs(self) -> str:
        parts = []
        for d in self.daemons:
            parts.append(f"--- {d.name} ({d.log}):\n{_tail(d.log)}\n{_tail(self.root / 'log' / f'{d.name}.out', 5)}")
        return "\n".join(parts)

    def _wait(self, what: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.01
        while not ready():
            self.check_running()
            if time.monotonic() > deadline:
                raise ClusterStartError(f"{what} not ready after {timeout:g} s:\n{self._logs()}")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def idle_nodes(self) -> int:
        r = subprocess.run([_tool("sinfo"), "-h", "-t", "idle", "-o", "%D"], env=self.env,
                           capture_output=True, text=True, timeout=10)
        return int(r.stdout.strip() or 0) if r.returncode == 0 else 0

    def start(self, timeout: float = 30) -> SlurmCluster:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        r = self.root
        self._write_files()
        key = r / "munge" / "munge.key"
        subprocess.run([_tool("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        self._spawn("munged", [_tool("munged"), "--foreground", f"--key-file={key}",
                               f"--socket={self.munge_socket}", f"--pid-file={r}/munge/munged.pid",
                               f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/munged.seed"],
                    r / "log" / "munged.log")
        self._wait("munged", self.munge_socket.exists, timeout)
        self._spawn("slurmctld", [_tool("slurmctld"), "-D", "-i", "-f", str(self.conf)], r / "log" / "slurmctld.log")
        for name in NODES:
            script = (f"hostname {name} && mount --bind {r}/hosts /etc/hosts && "
                      f"exec {_tool('slurmd')} -D -N {name} -f {self.conf}")
            self._spawn(f"slurmd-{name}", [_tool("unshare"), "--uts", "--mount", "--propagation", "private", "--",
                                           "/bin/sh", "-c", script], r / "log" / f"slurmd-{name}.log")
        self._wait("two idle SLURM nodes", lambda: self.idle_nodes() == len(NODES), timeout)
        for d in self.daemons:
            if d.name.startswith("slurmd-"):
                name, fd = hold_namespace(d.proc.pid)
                self.node_namespaces.add(name)
                self.held.append(fd)

    def stop(self, timeout: float = 20) -> None:
        """Cancel every job, stop each daemon by PID, and make sure nothing of the cluster is left."""
        try:
            if any(d.name == "slurmctld" and d.proc.poll() is None for d in self.daemons):
                subprocess.run([_tool("scancel"), "--full", "--user", str(os.getuid())], env=self.env,
                               capture_output=True, timeout=10)
                self.jobs(settle=5)
            for d in reversed(self.daemons):  # nodes, then the controller, then munge
                self._stop(d, timeout)
            # Job steps (slurmstepd and what it runs) leave slurmd's process group and are reparented,
            # but stay in the node's mount namespace; srun's tasks also carry the cluster's marker.
            leftovers = self._leftovers(settle=5)
            for pid in leftovers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.daemons.clear()
        finally:
            for fd in self.held:  # only now: until here a freed number could name another test's namespace
                os.close(fd)
            self.held.clear()
        if leftovers:
            raise AssertionError(f"processes of the SLURM cluster outlived it (killed): {leftovers}")

    @staticmethod
    def _stop(d: Daemon, timeout: float) -> None:
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
            try:
                d.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(d.proc.pid, signal.SIGKILL)  # its group: anything it forked and left behind
        except (ProcessLookupError, PermissionError):
            pass
        d.proc.wait()

    # -- running things on the cluster -----------------------------------------------------------

    def run(self, argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 120,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run a client command (srun, sbatch...) in its own process group, with `job_env` and `env`.

        On timeout: cancel every job of the cluster (their processes are not in the client's
        process group), kill the client's group, and fail.
        """
        full_env = {**self.env, **self.job_env, **(env or {}), "SLURM_CONF": str(self.conf)}
        proc = subprocess.Popen(list(argv), env=full_env, cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cancel_all()
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"{argv[0]} did not finish within {timeout} s:\n{out}\n{err}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def _leftovers(self, settle: float) -> list[int]:
        deadline = time.monotonic() + settle
        while True:
            pids = sorted(set(processes_in_namespaces(self.node_namespaces)) | set(processes_with_marker(self.marker)))
            if not pids or time.monotonic() >= deadline:
                return pids
            time.sleep(0.05)

    def jobs(self, settle: float = 0.0) -> list[str]:
        """Ids of the jobs slurmctld knows as pending, running or completing, after up to `settle` s."""
        deadline = time.monotonic() + settle
        while True:
            r = subprocess.run([_tool("squeue"), "-h", "-t", "PD,R,CG", "-o", "%i"], env=self.env,
                               capture_output=True, text=True, timeout=10)
            ids = r.stdout.split()
            if not ids or time.monotonic() >= deadline:
                return ids
            time.sleep(0.1)

    def cancel_all(self) -> None:
        subprocess.run([_tool("scancel"), "--full", "--user", str(os.getuid())], env=self.env,
                       capture_output=True, timeout=10)
        self.jobs(settle=10)

    def listening_addresses(self) -> set[str]:
        """The local addresses the daemons listen on (TCP), from /proc: they must all be loopback."""
        inodes: set[str] = set()
        for d in self.daemons:
            for pid in [d.proc.pid, *_children(d.proc.pid)]:
                try:
                    for fd in os.listdir(f"/proc/{pid}/fd"):
                        link = os.readlink(f"/proc/{pid}/fd/{fd}")
                        if link.startswith("socket:["):
                            inodes.add(link[8:-1])
                except OSError:
                    continue
        found = set()
        for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
            try:
                lines = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                if f[3] == "0A" and f[9] in inodes:  # LISTEN
                    found.add(_hex_addr(f[1].split(":")[0], v6))
        return found


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """munged, slurmctld and two slurmd nodes for the test module that asks for it (starting takes about a
    second); stopped by PID after the module's last test (and, if the run is cut short, by the run's
    reaper: the daemons and job steps carry its marker). Not for the whole session: the daemons are this
    process's children, and a later test may count those (tests/stacks/test_stacks.py does).

    Its folder is not under pytest's tmp_path: munged wants every parent of its socket
    searchable by all, and pytest's base folder is private (0700).
    """
    missing = missing_tools()
    if missing:
        pytest.skip(f"SLURM is not installed here (missing {', '.join(missing)}): scripts/setup.sh installs it")
    root = Path(tempfile.mkdtemp(prefix="detlaunch-slurm-"))
    reaper.remove_at_exit(root)
    try:
        cluster = SlurmCluster(root).start()
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _hex_addr(text: str, v6: bool) -> str:
    raw = bytes.fromhex(text)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)
