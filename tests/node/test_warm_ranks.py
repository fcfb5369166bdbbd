"""Warm ranks: each rank forked from its node's rank template (rank/template.py), indistinguishable for its script.

The unit tests check the rules both sides share (rank/warm.py, planning/warm_ranks.py); the job tests run
real jobs under --layer direct. A preloaded module that the ranks' script does not import itself (`wave`)
tells a warm rank (it is in sys.modules when the script starts) from a cold one.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pytest
from detlaunch.planning.warm_ranks import mentions_torch
from detlaunch.rank import faultdump, warm
from support.helpers import free_port
from support.jobs import Launcher

pytestmark = pytest.mark.timeout(120)

FIELDS = textwrap.dedent('''\
    import ctypes, json, os, resource, signal, sys
    import __main__
    warm = "wave" in sys.modules  # --preload wave: only the template imported it
    died = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(died), 0, 0, 0)  # PR_GET_PDEATHSIG
    os.umask(os.umask(0))
    fields = {
        "argv": sys.argv, "orig_argv": sys.orig_argv[1:], "name": __name__, "file": __file__,
        "main_file": __main__.__file__, "spec": repr(__spec__), "loader": type(__loader__).__name__,
        "path0": sys.path[0], "sys_path": sys.path, "env": dict(os.environ), "cwd": os.getcwd(),
        "umask": os.umask(os.umask(0)),
        "limits": {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")},
        "signals": {int(s): str(signal.getsignal(s)) for s in signal.valid_signals() if s not in (9, 19)},
        "blocked": sorted(map(int, signal.pthread_sigmask(signal.SIG_BLOCK, []))),
        "own_group": os.getpgid(0) == os.getpid(), "death_signal": died.value,
        "stdio": [os.readlink(f"/proc/self/fd/{fd}")[:5] for fd in (0, 1, 2)],
        "line_buffering": [sys.stdout.line_buffering, sys.stderr.line_buffering],
        "cmdline": open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode().split()[1:],
        "flags": str(sys.flags), "executable": sys.executable, "threads": len(os.listdir("/proc/self/task")),
    }
    out = os.path.join(sys.argv[1], os.environ["RANK"] + ".json")
    with open(out, "w") as f:
        json.dump({"warm": warm, "fields": fields}, f)
    print("rank", os.environ["RANK"], "warm" if warm else "cold")
''')
# What differs between two jobs by nature (their private run dirs, ports), not between warm and cold.
PER_JOB = {"DETLAUNCH_SUPERVISOR", "DETLAUNCH_PROGRESS_FILE", "TMPDIR", "TORCHELASTIC_ERROR_FILE", "MASTER_PORT"}


# -- the rules (no process) ------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "expected"), [
    (["python", "train.py", "--lr", "1"], (["python"], "script", "train.py")),
    (["/venv/bin/python3.11", "-u", "-X", "dev", "-W", "ignore", "t.py"],
     (["/venv/bin/python3.11", "-u", "-X", "dev", "-W", "ignore"], "script", "t.py")),
    (["python", "-m", "pkg.train", "-m", "x"], (["python"], "module", "pkg.train")),
    (["python", "-c", "print(1)"], None), (["python", "-I", "t.py"], None), (["python", "-uB", "t.py"], None),
    (["python"], None), (["python", "-m"], None), (["bash", "t.sh"], None), (["python3-config", "x"], None),
])
def test_only_python_scripts_and_modules_can_be_warm(argv: list[str], expected: object) -> None:
    assert warm.python_command(argv) == expected


def test_a_rank_starts_cold_when_a_variable_torch_reads_at_import_differs() -> None:
    template = {"OMP_NUM_THREADS": "1", "PATH": "/bin", "PYTHONPATH": "/mine", "RANK": "0"}
    assert warm.env_difference(template, {**template, "RANK": "3", "MASTER_PORT": "1", "CUDA_VISIBLE_DEVICES": "2",
                                          "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}) == ""
    assert warm.env_difference(template, {**template, "OMP_NUM_THREADS": "4"}) == "OMP_NUM_THREADS"
    assert warm.env_difference(template, {**template, "TORCH_LOGS": "+dynamo"}) == "TORCH_LOGS"
    assert warm.env_difference(template, {k: v for k, v in template.items() if k != "PYTHONPATH"}) == "PYTHONPATH"
    # The wrapper's faulthandler folder, first on a rank's PYTHONPATH, is taken off in the rank: it does not count.
    site = faultdump.SITE_DIR
    assert warm.env_difference(template, {**template, "PYTHONPATH": f"{site}:/mine"}, site) == ""
    assert warm.env_difference({"PATH": "/bin"}, {"PATH": "/bin", "PYTHONPATH": site}, site) == ""


def test_the_template_imports_torch_only_for_a_script_that_imports_it(tmp_path: Path) -> None:
    for source, imports in [("import torch\n", True), ("def f():\n    from torch import nn\n", True),
                            ("import os, torch.distributed as dist\n", True), ('"""no torch import"""\n', False),
                            ("import torchvision\n", False), ("# import torch\n", False)]:
        script = tmp_path / "s.py"
        script.write_text(source)
        assert mentions_torch(("python", str(script))) is imports, source
    assert mentions_torch(("python", "-m", "anything"))


# -- real jobs ----------------------------------------------------------------------------------------
def fields_job(launcher: Launcher, tmp_path: Path, name: str, *flags: str) -> dict[str, dict[str, object]]:
    out = tmp_path / name
    out.mkdir()
    r = launcher.run("--layer", "direct", "--nproc-per-node", "2", "--master-port", str(free_port()),
                     "--preload", "wave", *flags, "fields.py", str(out), cwd=tmp_path, timeout=90)
    assert r.returncode == 0, r.output
    return {rank: json.loads((out / f"{rank}.json").read_text()) for rank in ("0", "1")}


def test_a_warm_rank_sees_what_a_cold_rank_sees_field_by_field(launcher: Launcher, tmp_path: Path) -> None:
    (tmp_path / "fields.py").write_text(FIELDS)
    warm_ranks = fields_job(launcher, tmp_path, "warm")
    cold_ranks = fields_job(launcher, tmp_path, "cold", "--no-warm-ranks")
    for rank in ("0", "1"):
        w, c = warm_ranks[rank], cold_ranks[rank]
        assert (w["warm"], c["warm"]) == (True, False)
        wf, cf = dict(w["fields"]), dict(c["fields"])  # type: ignore[call-overload]
        for job in (wf, cf):
            job["argv"] = job["argv"][:1]
            job["orig_argv"] = job["orig_argv"][:-1]
            job["cmdline"] = job["cmdline"][:-1]
            job["env"] = {k: v for k, v in job["env"].items() if k not in PER_JOB}
        assert {k: wf[k] for k in wf if wf[k] != cf[k]} == {}, {k: (wf[k], cf[k]) for k in wf if wf[k] != cf[k]}
        assert wf["own_group"] and wf["threads"] == 1 and wf["name"] == "__main__"
        assert wf["file"] == str(tmp_path / "fields.py") and wf["path0"] == str(tmp_path)


RESUMABLE = textwrap.dedent('''\
    import os, signal, sys
    attempt = int(os.environ["DETLAUNCH_RESTART_COUNT"])
    warm = "wave" in sys.modules
    rank = os.environ["RANK"]
    ckpt = os.path.join(sys.argv[1], "step")
    step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
    print(f"attempt {attempt} rank {rank} {'warm' if warm else 'cold'}", flush=True)
    if rank == "0":  # one writer: the checkpoint
        print(f"resumed from step {step}", flush=True)
        open(ckpt, "w").write(str(step + 1))
    if attempt == 1 and rank == "0":  # the template, killed mid-job: the next attempt starts cold
        started = {}  # the template is the oldest process with its command line: its forked ranks keep it
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if b"rank/template.py" in open(f"/proc/{pid}/cmdline", "rb").read():
                    started[pid] = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])
            except OSError:
                continue
        os.kill(int(min(started, key=started.__getitem__)), signal.SIGKILL)
    sys.exit(10 + attempt if attempt < 2 and rank == "0" else 0)  # not the same failure twice: no crash loop
''')


def test_a_restart_resumes_warm_and_a_killed_template_means_cold_ranks(launcher: Launcher, tmp_path: Path) -> None:
    """Attempts 1 and 2 are warm (no import again); the template killed in attempt 2 leaves the job fine:
    attempt 3 starts cold, after one line, and resumes from the checkpoint."""
    (tmp_path / "resume.py").write_text(RESUMABLE)
    r = launcher.run("--layer", "direct", "--nproc-per-node", "2", "--master-port", str(free_port()),
                     "--max-restarts", "2", "--restart-backoff", "0", "--preload", "wave",
                     "resume.py", str(tmp_path), cwd=tmp_path, timeout=90)
    assert r.returncode == 0, r.output
    seen = sorted(line.split("] ", 1)[1] for line in r.stdout.splitlines())
    assert seen == ["attempt 0 rank 0 warm", "attempt 0 rank 1 warm", "attempt 1 rank 0 warm", "attempt 1 rank 1 warm",
                    "attempt 2 rank 0 cold", "attempt 2 rank 1 cold",
                    "resumed from step 0", "resumed from step 1", "resumed from step 2"], r.output
    ended = [line for line in r.stderr.splitlines() if "warm ranks:" in line]
    assert len(ended) == 1 and "the rank template (pid" in ended[0] and "killed by SIGKILL" in ended[0], r.stderr
    assert re.search(r"attempt 2: rank-failed .* rank 0 on node 0 .* exited with code 11$", r.stderr, re.M), r.stderr


def test_a_template_that_cannot_be_used_means_cold_ranks_said_once(launcher: Launcher, tmp_path: Path) -> None:
    """A preload that starts a thread (as one that initialised CUDA would have state forks cannot share),
    and one that fails to import: every rank starts cold, the job ends 0, one line says why."""
    (tmp_path / "threads.py").write_text("import threading, time\n"
                                         "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
    (tmp_path / "fields.py").write_text(FIELDS)
    path = ":".join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    for preload, why in [("threads,wave", "the rank template runs 2 threads after its imports"),
                         ("wave,nosuchmodule", "importing nosuchmodule failed (ModuleNotFoundError")]:
        out = tmp_path / preload.replace(",", "-")
        out.mkdir()
        r = launcher.run("--layer", "direct", "--nproc-per-node", "2", "--master-port", str(free_port()),
                         "--preload", preload, "fields.py", str(out), cwd=tmp_path, env={"PYTHONPATH": path},
                         timeout=90)
        assert r.returncode == 0, r.output
        assert sorted(line.split("] ", 1)[1] for line in r.stdout.splitlines()) == ["rank 0 cold", "rank 1 cold"]
        said = [line for line in r.stderr.splitlines() if "warm ranks:" in line]
        assert len(said) == 1 and why in said[0] and said[0].endswith("ranks start cold"), r.stderr
