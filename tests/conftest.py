"""Shared test machinery: run detlaunch for real, fail any test that leaves a process behind, and
mark every test that starts a process `job`, so that `pytest -m "not job"` is the fast loop.

A test is a job test when it uses a fixture that starts processes (`JOB_FIXTURES`: `launcher`, the
SLURM cluster, a throwaway user...; a test that runs a command itself asks for `real_processes`).
The marker is applied here, never by hand, and an audit hook holds it true: a test without it that
starts a process anyway (subprocess, fork, exec, posix_spawn, os.system) fails, naming what it ran.

The suite uses the runner the package ships to plugin authors (detlaunch.testing.runner): every
detlaunch a test starts carries a unique marker variable in its environment; every process of the
job inherits it (through torchrun, horovodrun's ssh exports, deepspeed's env file). After each
test, any live process still carrying the test's marker is a leak: the test fails and those
processes are killed by PID.

A run leaves nothing behind however it ends: SIGTERM (`timeout`, CI's cancel) is taken like Ctrl-C,
so pytest stops and every fixture's teardown runs; and tests/support/reaper.py, started here, kills
whatever of the run is still alive once pytest is gone, SIGKILL of pytest included.
"""

from __future__ import annotations

import json
import os
import pwd
import resource
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import settings
from support import pyenv_lock, reaper
from support.jobs import Launcher

# pytest caches each test module as rewritten for its asserts (__pycache__, git-ignored) unless Python may not write
# bytecode: where PYTHONDONTWRITEBYTECODE is set (as on these machines), every run rewrote all ~150 test modules
# again, 6 s of the fast loop's minute. The suite's own modules may be cached; nothing else is changed.
sys.dont_write_bytecode = False

# Property tests: no per-example deadline. Hypothesis's 200 ms default measures the machine, not the code: on
# 2 shared cores an example now and then takes longer and fails the test (pytest-timeout still bounds each test).
# The fast loop tries 50 examples a property (it must stay under a minute); CI (CI=true), hypothesis's 100.
settings.register_profile("dev", deadline=None, max_examples=50)
settings.register_profile("ci", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

reaper.start()  # first: every process the run starts carries its marker
if os.environ.get("PYTEST_XDIST_WORKER"):
    # A pytest-xdist worker has the terminal's size in LINES and COLUMNS, which a serial run has not: the
    # jobs it starts must see what a serial run's see (tests/support/scripts/ranks.py reads LINES).
    for name in ("LINES", "COLUMNS"):
        os.environ.pop(name, None)

# Jobs run with one OpenMP thread a rank, as docs/RESTARTS.md tells a user on a CPU machine: torch's default, one
# OpenMP thread per CPU in each of a job's ranks, only oversubscribes 2 cores, and horovod's and deepspeed's ranks
# then start warm as torchrun's and direct's do. Where the unset case is what is tested, a test says so
# (tests/node/test_warm_ranks.py; tests/layers/test_public_scripts.py runs the scripts as a user would).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _stop_like_ctrl_c(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"pytest got {signal.Signals(signum).name}")


signal.signal(signal.SIGTERM, _stop_like_ctrl_c)  # pytest then ends the run and tears every fixture down
RUN_STARTED = time.time()

# Fixtures that start real processes: a test that uses one (directly or through another fixture) is a job test.
JOB_FIXTURES = frozenset({"launcher", "detlaunch_runner", "throwaway_user", "real_processes", "slurm", "determined_cli",
                          "deepspeed_hosts", "ssh_peers", "built_wheel"})
SPAWNING = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system",
                      "os.exec", "pty.spawn"})
_spawned: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event in SPAWNING:
        what = args[1] if event == "subprocess.Popen" and len(args) > 1 else args[0] if args else ""
        _spawned.append(f"{event} {what!r}"[:200])


sys.addaudithook(_audit)


# The suite is CPU-bound on 2 cores (torch's import in every launcher, template and rank): the CPU-seconds a test's
# processes took, not its wall time, are what the suite's time is made of. Each test's, from its processes' rusage
# (those reaped by the time it ends: every job's, through the subreaping detlaunch), in the summary.
_CPU_AT = pytest.StashKey[float]()
_cpu_of: dict[str, float] = {}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_AT] = _children_cpu()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    if call.when == "teardown" and _CPU_AT in item.stash:
        item.user_properties.append(("children_cpu_s", _children_cpu() - item.stash[_CPU_AT]))
    yield


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:  # (reaches the xdist controller with the report)
        if key == "children_cpu_s" and report.when == "teardown":
            _cpu_of[report.nodeid] = float(value)


def _oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (None: not said here)."""
    try:
        with open("/proc/vmstat") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("oom_kill ")), None)
    except OSError:
        return None


_OOM_AT_START = _oom_kills()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    oom_now = _oom_kills()
    if _OOM_AT_START is not None and oom_now is not None and oom_now > _OOM_AT_START:  # a job's silent deaths, said
        terminalreporter.write_sep("=", f"the kernel's OOM killer killed {oom_now - _OOM_AT_START} process(es) "
                                        "during this run (dmesg says which)")
    if not _cpu_of or sum(_cpu_of.values()) < 1.0:
        return
    if os.environ.get("DETLAUNCH_TEST_CPU_JSON"):  # every test's, for a look at where the suite's time goes
        Path(os.environ["DETLAUNCH_TEST_CPU_JSON"]).write_text(json.dumps(_cpu_of, indent=1))
    terminalreporter.write_sep("=", f"most CPU-seconds (its processes'; {sum(_cpu_of.values()):.0f} CPU-s in all)")
    for nodeid, cpu in sorted(_cpu_of.items(), key=lambda kv: -kv[1])[:25]:
        terminalreporter.write_line(f"{cpu:7.1f}s {nodeid}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if JOB_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.job)


@pytest.fixture(autouse=True)
def _only_job_tests_start_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """The fast loop's promise: a test not marked `job` starts no process (checked after it, teardown included)."""
    _spawned.clear()
    yield
    if _spawned and request.node.get_closest_marker("job") is None:
        started, _spawned[:] = list(_spawned), []
        pytest.fail("this test starts processes but is not a job test: use a fixture that starts them, or ask for "
                    f"`real_processes` (conftest.JOB_FIXTURES); it started: {'; '.join(started[:3])}", pytrace=False)


@pytest.fixture(autouse=True)
def _no_pyenv_lock_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a job test: a pyenv rehash lock a killed ssh shell of this run left is taken away
    (tests/support/pyenv_lock.py), so that it does not cost every later shell a minute."""
    yield
    if request.node.get_closest_marker("job") is not None:
        pyenv_lock.remove_if_left_by_this_run(RUN_STARTED)


@pytest.fixture
def real_processes() -> None:
    """Asked for by a test that starts processes itself (subprocess.run, a helper that does): it is a job test."""


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    """Run detlaunch for real; fail the test if any process of its jobs outlives it."""
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.close()
    launcher.assert_no_leftovers()


def _uid_taken(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        pass
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                return True
        except OSError:
            continue
    return False


@pytest.fixture
def throwaway_user() -> Iterator[pwd.struct_passwd]:
    """An ordinary user of the test's own (root only), removed after. Ask for it before `launcher`, so
    that the leftover check runs first (pytest ends fixtures in reverse order)."""
    if os.getuid() != 0:
        pytest.skip("needs root to create a test user")
    name = f"dlspy{secrets.token_hex(3)}"
    # A uid no other test's user had: useradd would hand out the uid a test just freed, while processes of that
    # test's user may still be ending, and this test's count of its user's processes would then find them.
    uid = next(u for u in iter(lambda: 61000 + secrets.randbelow(4000), None) if not _uid_taken(u))
    subprocess.run(["useradd", "--system", "--uid", str(uid), "--no-create-home", "--shell", "/usr/sbin/nologin",
                    name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=True)

