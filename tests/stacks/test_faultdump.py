"""The faulthandler fallback for stacks (faultdump.py, faultsite/sitecustomize.py), with real processes.

A Python started the way the wrapper starts a rank registers faulthandler for signal 41 and
leaves its environment and path as they were (a user's sitecustomize still runs); asked, it
dumps its frames while blocked in C and goes on undisturbed; when it cannot be asked, the
reason says why. The whole path in a job, as an ordinary user with an undumpable rank, is in
tests/node/test_hangs.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from detlaunch.rank import faultdump
from detlaunch.stacks.pyspy import ProcessStack, Unavailable, collect_stacks, find_py_spy

NO_PY_SPY = "/nonexistent/py-spy"
BLOCKED = """
import os, sys
print(repr(os.environ.get("PYTHONPATH")), os.environ.get("DETLAUNCH_FAULTHANDLER_FILE"), flush=True)
def wait_for_input():
    return sys.stdin.buffer.read(1)  # blocked in C: read(2)
got = wait_for_input()
print("went on", got, flush=True)
"""


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def start(code: str, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} if env is None else env
        faultdump.prepare(str(tmp_path), len(procs), env)
        p = subprocess.Popen([sys.executable, *args, "-c", code], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()  # by its PID: our child
        p.wait()
        for pipe in (p.stdin, p.stdout, p.stderr):
            if pipe:
                pipe.close()


def ask(tmp_path: Path, index: int, proc: subprocess.Popen[str]) -> ProcessStack | Unavailable:
    path = faultdump.stack_path(str(tmp_path), index)
    return collect_stacks([proc.pid], 2.0, NO_PY_SPY, fallback={proc.pid: path})[proc.pid]


@pytest.mark.timeout(30)
def test_a_rank_blocked_in_c_dumps_its_frames_and_goes_on(real_processes: None, rank,
                                                          tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    p = rank(BLOCKED)
    assert p.stdout.readline() == "None None\n"  # the wrapper's PYTHONPATH and variable are gone again
    deadline = time.monotonic() + 15
    while True:  # the line comes just before the call: under load a dump may still catch <module>
        got = ask(tmp_path, 0, p)
        assert isinstance(got, ProcessStack), got
        if got.main is None or len(got.main.frames) > 1 or time.monotonic() > deadline:
            break
    assert got.via == "faulthandler (py-spy: cannot run /nonexistent/py-spy: No such file or directory)"
    assert got.main is not None and [f.function for f in got.main.frames] == ["wait_for_input", "<module>"]
    again = ask(tmp_path, 0, p)  # the file holds one dump at a time
    assert isinstance(again, ProcessStack) and again.threads == got.threads
    out, err = p.communicate("x", timeout=10)  # its read(2) was restarted, not broken
    assert (p.returncode, out, err) == (0, "went on b'x'\n", ""), (out, err)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("pythonpath", [None, "", "/somewhere/else"])
def test_the_ranks_environment_and_a_users_sitecustomize_are_as_without_detlaunch(real_processes: None, rank,
                                                                                  tmp_path: Path,
                                                                                  pythonpath: str | None) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        site = tmp_path / "user-site"
        site.mkdir()
        (site / "sitecustomize.py").write_text("import sys\nsys.stderr.write('user sitecustomize ran\\n')\n")
        env["PYTHONPATH"] = pythonpath = f"{site}:{pythonpath}" if pythonpath else str(site)
    code = ("import os, subprocess, sys\nprint(repr(os.environ.get('PYTHONPATH')), flush=True)\n"
            "print(any('faultsite' in p for p in sys.path), flush=True)\n"
            "subprocess.run([sys.executable, '-c', 'pass'])\n")  # a child Python: not the rank, does not register
    p = rank(code, env)
    out, err = p.communicate(timeout=20)
    assert out == f"{pythonpath!r}\nFalse\n", out
    assert err == ("user sitecustomize ran\n" * 2 if pythonpath is not None else ""), err
    lines = Path(faultdump.stack_path(str(tmp_path), 0)).read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"detlaunch-faulthandler pid={p.pid} signal=41 main=0x"), lines


@pytest.mark.timeout(30)
def test_when_faulthandler_cannot_answer_the_reason_says_why(real_processes: None, rank,
                                                             tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    stopped = rank(BLOCKED)
    unregistered = rank("import faulthandler, sys\nfaulthandler.unregister(41)\nprint('ready', flush=True)\n"
                        "sys.stdin.read()")
    no_site = rank(BLOCKED, args=("-S",))
    off = rank(BLOCKED, env={**os.environ, faultdump.SWITCH: "0"})
    for p in (stopped, unregistered, no_site, off):
        assert p.stdout.readline()
    os.kill(stopped.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{stopped.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    first = "cannot run /nonexistent/py-spy: No such file or directory; faulthandler: "
    reasons = {name: ask(tmp_path, i, p) for i, (name, p) in
               enumerate([("stopped", stopped), ("unregistered", unregistered), ("no_site", no_site), ("off", off)])}
    assert {name: (r.kind, r.reason) for name, r in reasons.items() if isinstance(r, Unavailable)} == {
        "stopped": ("missing", first + "it is stopped (SIGSTOP): its faulthandler runs "
                    "only once it continues"),
        "unregistered": ("missing", first + "it no longer catches signal 41 (the script "
                         "replaced or removed detlaunch's handler)"),
        "no_site": ("missing", first + faultdump.NOT_REGISTERED),
        "off": ("missing", first + "no faulthandler file for it "
                "(DETLAUNCH_FAULTHANDLER=0, or its wrapper is older)"),
    }
    os.kill(stopped.pid, signal.SIGCONT)
    for p in (stopped, unregistered, no_site, off):  # none of them was hurt
        p.stdin.write("x")
        p.stdin.close()
        assert p.wait(10) == 0


@pytest.mark.timeout(30)
def test_a_rank_that_exits_instead_of_answering_ends_the_wait_at_once(real_processes: None, rank,
                                                                      tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A rank that dies while it is asked (its faulthandler never writes) must not hold the asker until
    the deadline: here it takes the signal itself (blocked, sigwait) and exits, as a rank on its way out."""
    p = rank("import os, signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {41})\nprint('ready', flush=True)\n"
             "signal.sigwait({41})\nos._exit(0)\n")
    assert p.stdout.readline() == "ready\n"
    began = time.monotonic()
    got = collect_stacks([p.pid], 20.0, NO_PY_SPY, fallback={p.pid: faultdump.stack_path(str(tmp_path), 0)})[p.pid]
    took = time.monotonic() - began
    assert got == Unavailable(p.pid, "missing", "cannot run /nonexistent/py-spy: No such file or directory; "
                              "faulthandler: it exited before its faulthandler answered") and took < 10, (got, took)
    assert p.wait(10) == 0


@pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")
@pytest.mark.timeout(30)
def test_py_spy_comes_first_and_the_rank_is_not_signalled(real_processes: None, rank,
                                                          tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    p = rank(BLOCKED)
    assert p.stdout.readline()
    path = faultdump.stack_path(str(tmp_path), 0)
    got = collect_stacks([p.pid], 5.0, fallback={p.pid: path})[p.pid]
    assert isinstance(got, ProcessStack) and got.via == "", got
    assert len(Path(path).read_text().splitlines()) == 1  # the header only: no dump was asked for


@pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")
@pytest.mark.timeout(30)
def test_a_rank_that_is_a_shell_running_python_is_read_through_its_python(real_processes: None, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    path = faultdump.prepare(str(tmp_path), 0, env)
    assert path is not None
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED)
    shell = subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} {script}; true"], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert shell.stdout and shell.stdout.readline() == "None None\n"
        got = collect_stacks([shell.pid], 5.0, fallback={shell.pid: path})[shell.pid]
        assert isinstance(got, ProcessStack), got
        assert got.via.startswith("faulthandler (py-spy: not a Python process"), got.via
        assert got.main is not None and [f.function for f in got.main.frames] == ["wait_for_input", "<module>"]
    finally:
        shell.stdin.close()  # type: ignore[union-attr]
        assert shell.wait(10) == 0  # the Python read EOF and went on; the shell ended
        shell.stdout.close()  # type: ignore[union-attr]
