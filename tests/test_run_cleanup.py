"""A test run leaves the machine as it found it. Cut short, it leaves nothing running: a pytest of this
suite (its conftest) is started with a test that brings up the SLURM test cluster and runs a job step
on both nodes, then that pytest alone is stopped the ways a run ends early: SIGTERM (`timeout`, a CI
cancel: fixtures tear down) and SIGKILL (nothing of pytest runs: tests/support/reaper.py does the
work). And a pyenv rehash lock a shell it killed left is taken away (tests/support/pyenv_lock.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import pyenv_lock
from support.helpers import wait_until
from support.paths import ROOT
from support.reaper import marked
from support.slurm_cluster import hold_namespace, missing_tools, processes_in_namespaces

pytestmark = pytest.mark.timeout(180)

INNER = textwrap.dedent('''
    import json, os, subprocess, time
    from pathlib import Path

    from support.reaper import RUN_VAR
    from support.slurm_cluster import _tool, processes_in_namespaces, slurm_cluster  # noqa: F401 (a fixture)

    def test_holds_the_cluster_and_a_job(slurm_cluster, real_processes):
        step = subprocess.Popen([_tool("srun"), "-N2", "--ntasks-per-node=1", "sleep", "600"], env=slurm_cluster.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        while not step_runs(slurm_cluster.node_namespaces):
            time.sleep(0.1)
        Path(os.environ["READY_FILE"]).write_text(json.dumps({
            "marker": f"{RUN_VAR}={os.environ[RUN_VAR]}", "root": str(slurm_cluster.root), "srun": step.pid,
            "daemons": [d.proc.pid for d in slurm_cluster.daemons],
            "namespaces": sorted(slurm_cluster.node_namespaces)}))
        time.sleep(600)

    def step_runs(namespaces):
        for pid in processes_in_namespaces(namespaces):
            try:
                if b"sleep" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
            except OSError:
                pass
        return False
''')


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


@pytest.mark.skipif(bool(missing_tools()), reason="SLURM is not installed here (scripts/setup.sh installs it)")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_pytest_leaves_no_daemon_and_no_job(real_processes: None, tmp_path: Path, how: signal.Signals
                                                      ) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    ready = tmp_path / "ready.json"
    tests = ROOT / "tests"
    env = {**os.environ, "READY_FILE": str(ready),
           "PYTHONPATH": os.pathsep.join([str(tests), *filter(None, [os.environ.get("PYTHONPATH")])])}
    inner = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "conftest", "-q", "-s",
                              "-o", "markers=job", "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    holding: list[int] = []
    try:
        try:
            wait_until(lambda: ready.exists() and ready.stat().st_size, 120, "the inner run's cluster and job")
            held = json.loads(ready.read_text())
            in_nodes = processes_in_namespaces(set(held["namespaces"]))  # the inner run holds them: its nodes' still
            assert all(alive(p) for p in held["daemons"]) and in_nodes, held
            for pid in in_nodes:  # held here too: once the inner run is gone its numbers may not name another's
                try:
                    name, fd = hold_namespace(pid)
                except OSError:
                    continue  # it has gone: another process of the node holds the same namespace
                holding.append(fd)
                assert name in held["namespaces"], (name, held)
            inner.send_signal(how)  # pytest alone: what it started is left to the run's own cleanup
            out = inner.communicate(timeout=60)[0].decode(errors="replace")
        finally:
            if inner.poll() is None:
                os.killpg(inner.pid, signal.SIGKILL)
                inner.wait()
        needle = held["marker"].encode()

        def all_gone() -> bool:
            return not (marked(needle) or processes_in_namespaces(set(held["namespaces"]))
                        or any(alive(p) for p in [*held["daemons"], *in_nodes, held["srun"]])
                        or Path(held["root"]).exists())

        wait_until(all_gone, 60, f"the inner run's processes and folders to go:\n{out}")
    finally:
        for fd in holding:
            os.close(fd)
    if how == signal.SIGTERM:  # stopped like Ctrl-C: the fixture itself stopped the cluster
        assert "KeyboardInterrupt" in out and "pytest got SIGTERM" in out, out
        assert "reaper.py: the test run left" not in out, out


def test_only_a_stale_pyenv_rehash_lock_this_run_left_is_taken_away(tmp_path: Path) -> None:
    lock = tmp_path / "shims" / ".pyenv-shim"
    lock.parent.mkdir()
    assert pyenv_lock.lock_path({"PYENV_ROOT": str(tmp_path)}) == lock
    assert not pyenv_lock.remove_if_left_by_this_run(1000.0, lock, now=2000.0)  # no lock: nothing to do
    lock.write_text("#!/usr/bin/env bash\n")
    os.utime(lock, (1500.0, 1500.0))
    assert not pyenv_lock.remove_if_left_by_this_run(1600.0, lock, now=2000.0) and lock.exists()  # older than the run
    assert not pyenv_lock.remove_if_left_by_this_run(1000.0, lock, now=1550.0) and lock.exists()  # a rehash may hold it
    assert pyenv_lock.remove_if_left_by_this_run(1000.0, lock, now=2000.0) and not lock.exists()  # stale, and ours


def test_a_held_namespace_keeps_its_number_from_the_next_one_made(real_processes: None) -> None:
    """The SLURM cluster names its nodes' processes by their mount namespace. The kernel gives a freed namespace's
    number to the next namespace made, of any kind: a detlaunch node of another test, which the cluster's stop then
    SIGKILLed as its own leftover (CI saw two nodes of other tests die without a word). A held one keeps its number."""
    def in_a_namespace() -> subprocess.Popen[bytes]:
        p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"], start_new_session=True)
        own = os.readlink("/proc/self/ns/mnt")
        wait_until(lambda: alive(p.pid) and os.readlink(f"/proc/{p.pid}/ns/mnt") != own, 10, "unshare's exec")
        return p

    first = in_a_namespace()
    name, fd = hold_namespace(first.pid)
    first.kill()
    first.wait()
    try:
        later = [in_a_namespace() for _ in range(3)]
        try:
            assert name not in {os.readlink(f"/proc/{p.pid}/ns/mnt") for p in later}, name
            number = name.split(":", 1)[1]
            assert number not in namespace_numbers(), name  # nor any other namespace, of any kind, of anyone
        finally:
            for p in later:
                p.kill()
                p.wait()
    finally:
        os.close(fd)


def namespace_numbers() -> set[str]:
    """The numbers (``[N]``) of every namespace of every process here."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            kinds = os.listdir(f"/proc/{entry}/ns")
            found.update(os.readlink(f"/proc/{entry}/ns/{kind}").split(":", 1)[1] for kind in kinds)
        except OSError:
            continue
    return found
