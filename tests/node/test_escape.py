"""Nothing escapes: a rank's daemon that double-forks, calls setsid() and ignores SIGTERM is gone when
the job ends, however it ends -- a rank's failure, Ctrl-C, SIGTERM, or a SIGKILL of every detlaunch --
on every layer, on one node and two (with the fault matrix's cells: CASES). The leftover check is the
`launcher` fixture's (by marker)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import psutil
import pytest
from support.helpers import free_port, wait_until
from support.jobs import ROOT, SCRIPTS, Job, Launcher

pytestmark = pytest.mark.timeout(240)

# ranks.py's ESCAPE: each rank first forks a daemon in its own session, out of every process group, deaf to
# SIGTERM; the ranks then sleep (the failing one waits for the trigger, then exits 3)
ESCAPES = {"ESCAPE": "1", "SLEEP": "600"}
RANKS = SCRIPTS / "ranks.py"

ENDINGS = ("rank_fails", "sigint", "sigterm", "sigkill")


def start(launcher: Launcher, tmp_path: Path, layer: str, nodes: int, env: dict[str, str]) -> list[Job]:
    script, env = RANKS, {**ESCAPES, **env}
    port = str(free_port())
    if layer in ("torchrun", "direct"):
        common = ["--layer", layer, "--nnodes", str(nodes), "--nproc-per-node", "2", "--master-addr",
                  "127.0.0.1", "--master-port", port]
        per_node = [["--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}"] for n in range(nodes)]
    else:
        hosts = ",".join(f"127.0.0.{n + 1}:2" for n in range(nodes))
        common = ["--layer", layer, "--hosts", hosts, "--master-port", port,
                  "--ssh-port", str(free_port("127.0.0.2"))]
        per_node = [["--node-rank", str(n)] for n in range(nodes)]
    workers = [launcher.start(*common, *per_node[n], str(script), env=env) for n in range(1, nodes)]
    return [launcher.start(*common, *per_node[0], str(script), env=env), *workers]


# Every ending and size with --layer direct; with a launcher (the suite's time) the endings the fault matrix
# lacks: a rank's failure and SIGTERM to the chief are its cells on every layer, with these daemons in every
# rank (tests/node/test_faults.py, ranks.py's ESCAPE), and a one-node job is the chief's part of the two-node
# one (the same tree, less the worker node).
CASES = [("direct", nodes, ending) for nodes in (1, 2) for ending in ENDINGS] + [
    (layer, 2, ending) for layer in ("torchrun", "horovod", "deepspeed") for ending in ("sigint", "sigkill")]


@pytest.mark.parametrize(("layer", "nodes", "ending"), CASES)
def test_nothing_outlives_the_job(launcher: Launcher, tmp_path: Path, layer: str, nodes: int, ending: str) -> None:
    last = 2 * nodes - 1
    trigger = tmp_path / "trigger"
    os.mkfifo(trigger)
    env = {"FAIL_RANK": str(last), "TRIGGER": str(trigger)} if ending == "rank_fails" else {}
    jobs = start(launcher, tmp_path, layer, nodes, env)
    for rank in range(2 * nodes):
        job = jobs[rank // 2]
        job.wait_for_output(f"[rank={rank}] rank {rank} {'waiting' if rank == last and env else 'sleeping'}",
                            timeout=180)
    if ending == "rank_fails":
        with open(trigger, "wb") as fifo:
            fifo.write(b"x")
    elif ending == "sigint":
        jobs[0].send_signal(signal.SIGINT)
    elif ending == "sigterm":
        jobs[0].send_signal(signal.SIGTERM)
    elif ending == "sigkill":
        for job in jobs:
            os.kill(job.proc.pid, signal.SIGKILL)  # nobody is left to clean up: the kernel must
    codes = [job.wait(timeout=60).returncode for job in jobs]
    expected = {"rank_fails": 3, "sigint": 130, "sigterm": 143, "sigkill": -9}[ending]
    assert codes[0] == expected, jobs[0].read()
    # the fixture: no process of the job, daemons included, is alive on any node


def test_a_supervisor_killed_from_outside_is_said_so_and_nothing_outlives_it(launcher: Launcher,
                                                                             tmp_path: Path) -> None:
    """The node's supervisor SIGKILLed by something else (the OOM killer, another program): it cannot say a word
    itself, so the detlaunch the user started says it, and exits 137; its daemons die with the namespace."""
    (job,) = start(launcher, tmp_path, "direct", 1, {})
    for rank in (0, 1):
        job.wait_for_output(f"[rank={rank}] rank {rank} sleeping", timeout=120)
    supervisor = job.supervisor_pid()
    assert supervisor != job.proc.pid
    os.kill(supervisor, signal.SIGKILL)
    r = job.wait(timeout=60)
    assert r.returncode == 137, r.output
    assert f"detlaunch: warning: the job's supervisor (pid {supervisor}) was killed by SIGKILL, not by detlaunch: " \
           "the kernel (its OOM killer: see dmesg) or a process outside the job; everything the job ran on this " \
           "node ended with it" in r.stderr.splitlines(), r.output
    # the fixture: no process of the job is alive


def test_how_a_supervisor_that_died_of_a_signal_is_said() -> None:
    """SIGKILL from outside points at the OOM killer; a crash names its signal; a stop detlaunch relayed says
    nothing here (isolation._in_child: the supervisor reports its own stop)."""
    from detlaunch.system.isolation import _killed_line

    assert "was killed by SIGKILL, not by detlaunch: the kernel (its OOM killer" in _killed_line(7, signal.SIGKILL)
    assert _killed_line(7, signal.SIGSEGV) == ("the job's supervisor (pid 7) died of SIGSEGV; everything the job "
                                               "ran on this node ended with it")


def processes_of(uid: int) -> list[int]:
    """Live (not zombie) processes of `uid`."""
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        if proc.info["uids"] and proc.info["uids"].real == uid and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc.pid)
    return found


@pytest.mark.timeout(180)
def test_nothing_outlives_a_sigkill_of_an_ordinary_users_detlaunch(
        throwaway_user: pwd.struct_passwd, launcher: Launcher) -> None:  # user first: it goes last
    """One cell of the matrix (torchrun, 1 node, SIGKILL) as a user without privileges: the kernel still ends
    the escaped daemons, the user's own processes that nothing of detlaunch is left to stop."""
    uid, gid = throwaway_user.pw_uid, throwaway_user.pw_gid
    as_user = ("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups")
    # Debian's python3 (the venv's interpreter lives under /root, which the user cannot read), with this
    # checkout's detlaunch and the venv's packages (torch; the layers' entry points) on its path.
    path = os.pathsep.join([str(ROOT / "core"), *map(str, sorted((ROOT / "plugins").iterdir())),
                            sysconfig.get_paths()["purelib"]])
    home = Path(tempfile.mkdtemp(prefix="dl-"))  # the user's own: the test's tmp_path is root's, 0700
    try:
        os.chown(home, uid, gid)
        env = {**ESCAPES, "PYTHONPATH": path, "TMPDIR": str(home), "XDG_CACHE_HOME": str(home / "cache"),
               "HOME": str(home)}
        usable = subprocess.run([*as_user, "/usr/bin/python3", "-c", "import detlaunch, torch"], env={**os.environ,
                                **env}, cwd=home, capture_output=True, text=True, timeout=60)
        if usable.returncode != 0:
            pytest.skip(f"the user cannot run this checkout's detlaunch with torch: {usable.stderr.strip()[-200:]}")
        script = home / "escapes.py"
        script.write_text(RANKS.read_text())  # where the user can read it
        job = launcher.start("--layer", "torchrun", "--nproc-per-node", "2", "--master-port", str(free_port()),
                             str(script), env=env, cwd=home, command=("/usr/bin/python3", "-m", "detlaunch"),
                             prefix=as_user)
        for rank in (0, 1):
            job.wait_for_output(f"[rank={rank}] rank {rank} sleeping", timeout=120)

        def user_scripts() -> list[int] | None:  # the daemons fork after their rank said it is ready
            found = [p for p in processes_of(uid) if psutil.Process(p).cmdline() == ["/usr/bin/python3", "-u",
                                                                                       str(script)]]
            return found if len(found) == 4 else None  # 2 ranks, 2 escaped daemons (forks: the same command)

        wait_until(user_scripts, timeout=30, what="2 ranks and 2 escaped daemons")
        assert psutil.Process(job.proc.pid).uids().real == uid  # detlaunch itself runs as the user (setpriv execs)
        os.kill(job.proc.pid, signal.SIGKILL)  # detlaunch itself: nobody is left to clean up but the kernel
        assert job.wait(timeout=60).returncode == -9
        assert launcher.leftovers(settle=10) == []
        # A process the kernel is ending has no environment left to read (the marker check above no longer sees
        # it) before it is a zombie; on a loaded machine that lasts: its user's processes are given time to end.
        try:
            wait_until(lambda: not processes_of(uid), timeout=20, what="the user's processes to end")
        except AssertionError:
            left = [(p, psutil.Process(p).status()) for p in processes_of(uid) if psutil.pid_exists(p)]
            raise AssertionError(f"processes of the user left: {left}") from None
    finally:
        for pid in processes_of(uid):  # by PID, so that userdel can remove the user
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)


def test_this_machine_can_isolate_jobs_as_root_and_as_an_ordinary_user(real_processes: None, tmp_path: Path) -> None:
    """The kernel mechanism the matrix above relies on, checked for both kinds of user."""
    import subprocess
    import uuid

    from detlaunch.system import isolation

    assert isolation.probe() is None
    user = f"dl{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "-M", "-s", "/bin/sh", user], check=True)
    try:
        code = Path(isolation.__file__).read_text() + "\nprint(probe())\n"  # stdlib only: runs as it is
        # Debian's python3: the venv's interpreter lives under /root, which the user cannot read.
        out = subprocess.run(["runuser", "-u", user, "--", "/usr/bin/python3", "-S", "-c", code],
                             capture_output=True, text=True, timeout=30, cwd="/")
        assert out.stdout.strip() == "None", out
    finally:
        subprocess.run(["userdel", user], check=True)


@pytest.mark.timeout(60)
def test_as_root_of_a_user_namespace_the_caller_can_go_on_too(real_processes: None) -> None:
    """uid 0 inside a user namespace that does not own the PID namespace (unshare -Ur, a rootless container
    sharing the host's pids) may unshare but not setns back: a child makes the namespace, as for a user."""
    from detlaunch.system import isolation

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    code = Path(isolation.__file__).read_text() + (  # stdlib only: runs as it is
        "\nimport os\nprint(run_isolated(lambda: 40 + os.getpid(), warn=print),"
        " run_isolated(lambda: 40 + os.getpid(), warn=print))\n"
        "pid = os.fork()\nif pid == 0:\n    os._exit(3)\n"
        "print('forked', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n")
    out = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-S", "-c", code],
                         capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout) == (0, "41 41\nforked 3\n"), out


def test_without_namespaces_the_job_runs_here_and_one_line_says_what_is_not_guaranteed(real_processes: None) -> None:
    from detlaunch.system import isolation

    def refused() -> None:
        raise isolation.Unavailable(1, "unshare: Operation not permitted")

    said: list[str] = []
    r, w = os.pipe()  # the warning is said in the child that runs the body: through a pipe
    code = isolation.run_isolated(lambda: 7, warn=lambda line: os.write(w, line.encode()) and None, enter=refused)
    os.close(w)
    said.append(os.read(r, 4096).decode())
    os.close(r)
    assert code == 7
    assert said == ["cannot isolate the job in a PID namespace (unshare: Operation not permitted): a process "
                    "that escapes its rank (setsid) can outlive a SIGKILL of detlaunch; see detlaunch doctor"]


def test_isolated_the_body_is_pid_1_its_code_comes_back_and_the_caller_can_go_on(real_processes: None) -> None:
    from detlaunch.system import isolation

    assert isolation.run_isolated(lambda: 40 + os.getpid(), warn=print) == 41
    assert isolation.run_isolated(lambda: 40 + os.getpid(), warn=print) == 41  # twice: the caller is unchanged
    pid = os.fork()  # and it can still fork (unshare in the caller itself would leave it unable to)
    if pid == 0:
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0


HALF_MADE = '''
def half_made():
    """unshare works, the id maps are refused (Ubuntu's AppArmor): the namespace is half made."""
    _libc.unshare(CLONE_NEWPID | (CLONE_NEWUSER if os.getuid() != 0 else 0))
    raise Unavailable(1, "user namespace id maps: Permission denied")

def body():
    """Forks twice: in a half-made namespace the first child is its init, and the second fork fails."""
    codes = []
    for code in (3, 4):
        pid = os.fork()
        if pid == 0:
            os._exit(code if os.getpid() != 1 else 99)
        codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    return 10 * codes[0] + codes[1]

print(run_isolated(body, warn=lambda line: print(line, file=sys.stderr), enter=half_made), probe(half_made))
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("as_user", [False, True], ids=["root", "user-namespace-root"])
def test_a_namespace_refused_after_its_unshare_leaves_the_job_whole(real_processes: None, as_user: bool) -> None:
    """Where the id maps are refused after the unshare, the job runs unisolated in a process that never
    unshared (issue 24: its first child would be the init of a half-made namespace, the next fork ENOMEM)."""
    from detlaunch.system import isolation

    if as_user and shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    code = Path(isolation.__file__).read_text() + HALF_MADE  # stdlib only: runs as it is
    prefix = ["unshare", "--user", "--map-root-user"] if as_user else []
    out = subprocess.run([*prefix, sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout) == (0, "34 user namespace id maps: Permission denied\n"), out
    assert out.stderr.startswith("cannot isolate the job in a PID namespace (user namespace id maps: "), out
