"""Warm ranks: each rank forked from its node's rank template (rank/template.py), indistinguishable for its script.

The unit tests check the rules both sides share (rank/warm.py, planning/warm_ranks.py); the job tests run
real jobs under --layer direct, and one restart per launcher layer (torchrun, horovod, deepspeed where
installed), whose launchers start the wrappers that ask the template. A preloaded module that the ranks'
script does not import itself (`wave`) tells a warm rank (it is in sys.modules when the script starts) from a
cold one.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.warm_ranks import launcher_env, mentions_torch, why_cold
from detlaunch.rank import faultdump, stopping, warm
from detlaunch.testing.loaded_layer import LoadedLayer, clean_env
from detlaunch.testing.runner import MARKER_VAR, processes_with_marker
from support.helpers import free_port, rank_lines, wait_until
from support.jobs import SCRIPTS, Launcher

pytestmark = pytest.mark.timeout(120)

FIELDS = textwrap.dedent('''\
    import ctypes, gc, json, os, resource, signal, sys
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
        "gc": [gc.isenabled(), gc.get_threshold()],
    }
    out = os.path.join(sys.argv[1], os.environ["RANK"] + ".json")
    with open(out, "w") as f:
        json.dump({"warm": warm, "frozen": gc.get_freeze_count(), "fields": fields}, f)
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



@pytest.mark.parametrize(("layer", "slots", "env", "expected"), [
    ("torchrun", 2, {}, {"OMP_NUM_THREADS": "1"}),  # what torchrun's agent sets for more than one worker
    ("torchrun", 2, {"OMP_NUM_THREADS": "1"}, {}),  # ... unless it is set
    ("torchrun", 1, {"OMP_NUM_THREADS": "1"}, {}),
    ("horovod", 2, {"OMP_NUM_THREADS": "1"}, {"PYTHONUNBUFFERED": "1"}),  # horovodrun's gloo run sets it
    ("deepspeed", 2, {"OMP_NUM_THREADS": "1"}, {}),
    ("direct", 2, {}, {}),  # the supervisor starts its ranks: their own environment is known
])
def test_each_launcher_layer_says_what_its_launcher_adds_to_the_ranks_environment(
        tmp_path: Path, layer: str, slots: int, env: dict[str, str], expected: dict[str, str]) -> None:
    plan = plan_of(tmp_path, layer, slots, env)
    assert why_cold(plan) == "" and launcher_env(plan) == expected
    assert ("horovod.torch" in plan.warm_ranks_json()["imports"]) is (layer == "horovod")
    if layer != "direct":  # a layer that does not say: its ranks start cold
        assert "does not say what it sets" in why_cold(dataclasses.replace(plan, launcher_rank_env=None))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: OpenMP starts no thread")
@pytest.mark.parametrize(("layer", "slots", "env", "what"), [
    ("torchrun", 1, {}, "is unset"), ("horovod", 2, {}, "is unset"), ("deepspeed", 2, {}, "is unset"),
    ("direct", 2, {"OMP_NUM_THREADS": "2"}, "is 2")])
def test_ranks_whose_torch_import_starts_threads_start_cold_and_no_template_imports_it_for_nothing(
        tmp_path: Path, layer: str, slots: int, env: dict[str, str], what: str) -> None:
    why = why_cold(plan_of(tmp_path, layer, slots, env))
    assert why.startswith(f"the ranks' OMP_NUM_THREADS {what} (torch starts") and why.endswith("makes them warm)")
    assert why_cold(plan_of(tmp_path, layer, slots, env, script="print('no torch')\n")) == ""


def plan_of(tmp_path: Path, layer: str, slots: int, env: dict[str, str], script: str = "import torch\n") -> Any:
    (tmp_path / "train.py").write_text(script)
    full = {**{k: v for k, v in clean_env(os.environ).items() if k != "OMP_NUM_THREADS"}, **env}
    loaded = LoadedLayer.load(layer, full)
    cluster = ClusterInfo(node_addrs=("127.0.0.1",), slots=(slots,), node_rank=0, chief_addr="127.0.0.1", job_id="t")
    return loaded.plan(loaded.config(["python", str(tmp_path / "train.py")], full), cluster)


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
        # The template's objects (its imports') are frozen before the fork: the rank's collections skip them.
        assert w["frozen"] > 10_000 and c["frozen"] == 0, (w["frozen"], c["frozen"])  # type: ignore[operator]
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
    if rank == "0":  # one writer: the checkpoint, replaced whole (rank 1 may read it at the same moment)
        print(f"resumed from step {step}", flush=True)
        with open(ckpt + ".tmp", "w") as f:
            f.write(str(step + 1))
        os.replace(ckpt + ".tmp", ckpt)
    open(os.path.join(sys.argv[1], f"started-{attempt}-{rank}"), "w").close()
    if attempt == 1 and rank == "0":  # the template, killed mid-job: the next attempt starts cold
        import time  # once rank 1 of this attempt is forked from it (the template forks one rank at a time)
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(sys.argv[1], "started-1-1")) and time.monotonic() < deadline:
            time.sleep(0.01)
        started = {}  # the template is this job's oldest process with its command line: forked ranks keep it
        marker = ("DETLAUNCH_CONTRACT_ID=" + os.environ["DETLAUNCH_CONTRACT_ID"]).encode()  # other tests run some
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if (b"rank/template.py" in open(f"/proc/{pid}/cmdline", "rb").read()
                        and marker in open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")):
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


def slow_template(tmp_path: Path, body: str) -> tuple[list[str], dict[str, str]]:
    """A 2-rank direct job whose template preloads `slow_import` (its import runs `body`, with time imported),
    for fields.py: its options and environment."""
    (tmp_path / "slow_import.py").write_text(f"import time\n{body}\n")
    (tmp_path / "fields.py").write_text(FIELDS)
    path = ":".join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    return (["--layer", "direct", "--nproc-per-node", "2", "--master-port", str(free_port()),
             "--preload", "slow_import,wave"], {"PYTHONPATH": path})


def test_the_hang_watch_starts_with_the_ranks_not_while_their_template_imports(launcher: Launcher,
                                                                              tmp_path: Path) -> None:
    """The wrappers register at once and wait for the template's imports (torch's take seconds, many under
    load): a rank that has not started yet is starting, not hung, and --start-timeout watches it."""
    args, env = slow_template(tmp_path, "time.sleep(10)")
    r = launcher.run(*args, "--hang-timeout", "4", "fields.py", str(tmp_path), cwd=tmp_path, env=env, timeout=90)
    assert r.returncode == 0, r.output
    assert sorted(line.split("] ", 1)[1] for line in r.stdout.splitlines()) == ["rank 0 warm", "rank 1 warm"]
    assert "no progress" not in r.stderr, r.stderr


def test_ranks_still_waiting_for_their_template_at_the_start_timeout_are_said_so(launcher: Launcher,
                                                                                  tmp_path: Path) -> None:
    """--start-timeout watches the ranks until their processes start: registered wrappers whose template still
    imports are not started ranks, and the line says what they wait for."""
    args, env = slow_template(tmp_path, "time.sleep(8)")
    r = launcher.run(*args, "--start-timeout", "4", "fields.py", str(tmp_path), cwd=tmp_path, env=env, timeout=90)
    assert r.returncode != 0 and r.stdout == "", r.output
    assert "only 0 of 2 rank(s) started on node 0 within 4 s (--start-timeout): 2 wait for the rank template's " \
        "imports" in r.stderr, r.stderr


def test_a_job_stopped_while_its_template_imports_stops_at_once(launcher: Launcher, tmp_path: Path) -> None:
    """SIGTERM while the ranks' wrappers wait for their template's imports (a minute here): they start no rank,
    and the job ends at once as stopped, not after the 30 s grace with its ranks SIGKILLed; nothing is left
    (the fixture), not even a rank the template forks once its imports are done."""
    began = tmp_path / "began"
    args, env = slow_template(tmp_path, f"open({str(began)!r}, 'w').close()\ntime.sleep(60)")
    job = launcher.start(*args, "fields.py", str(tmp_path), cwd=tmp_path, env=env)
    marker = f"{MARKER_VAR}={launcher.marker_value}"

    def waiting_wrappers() -> int:
        """Wrappers that take SIGTERM themselves (their handlers are in: before that it kills them)."""
        found = 0
        for pid in processes_with_marker(marker):
            try:
                wrapper = b"run_wrapper.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue  # it has gone
            status = stopping.read_status(pid) if wrapper else None
            found += status is not None and stopping.disposition(status, signal.SIGTERM) == stopping.CAUGHT
        return found

    wait_until(lambda: began.exists() and waiting_wrappers() == 2, 60, "the template importing, both wrappers up")
    asked = time.monotonic()
    job.send_signal(signal.SIGTERM)
    r = job.wait(60)
    took = time.monotonic() - asked
    assert r.returncode == 143 and r.stdout == "", r.output
    assert took < 15, (took, r.output)  # the grace period is 30 s
    assert "SIGKILLed" not in r.stderr and all(f"detlaunch:   rank {rank} (node 0): killed by SIGTERM (stopped by "
                                                "detlaunch)" in r.stderr.splitlines() for rank in (0, 1)), r.stderr


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


# A launcher layer's rank: FIELDS (what it sees, and whether --preload's `wave` was there at its start), then
# one of tests/support/scripts' resumable trainings, in this process, which fails once (rank 1 SIGKILLs itself
# at step 3) and resumes from its checkpoint. Its only argument is its output folder, its checkpoints beside it.
PROBE = FIELDS + textwrap.dedent('''\
    import runpy
    sys.path.insert(0, os.path.dirname(TRAIN))
    sys.argv = [TRAIN, "--ckpt-dir", sys.argv[1] + "-ckpt", "--steps", "4", "--crash-step", "3", "--crash-rank",
                "1", "--crash-how", "kill"]
    runpy.run_path(TRAIN, run_name="__main__")
''')
RESUMED = "0.981222,0.649037,0.482428,0.538023,-0.004031"  # test_restarts.WEIGHTS: 4 steps that never failed


def restart_job(launcher: Launcher, tmp_path: Path, layer: str, script: str, name: str,
                *extra: str) -> tuple[dict[str, dict[str, object]], str]:
    """One node x 2 ranks, one failure, one restart that resumes and ends 0: each rank's fields of attempt 2,
    and detlaunch's stderr."""
    own = {"horovod": "import os\nos.environ.setdefault('RANK', os.environ['HOROVOD_RANK'])\n",  # FIELDS reads RANK
           "deepspeed": "import sys\nsys.argv = [a for a in sys.argv if not a.startswith('--local_rank=')]\n"}
    (tmp_path / "probe.py").write_text(f"TRAIN = {str(SCRIPTS / script)!r}\n" + own.get(layer, "") + PROBE)
    (tmp_path / name).mkdir()
    env = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}  # horovodrun and deepspeed leave it unset (RESTARTS.md)
    r = launcher.run("--layer", layer, "--nproc-per-node", "2", "--master-port", str(free_port()), "--max-restarts",
                     "1", "--restart-backoff", "0", "--preload", "wave", *extra, "probe.py", name, cwd=tmp_path,
                     env=env, timeout=200)
    assert r.returncode == 0, r.output
    for rank in (0, 1):
        lines = rank_lines(r.stdout, rank)
        assert lines.count(f"rank {rank} warm") == 2, r.output  # both attempts
        assert f"rank {rank} attempt 2 starts at step 2" in lines and lines[-1].endswith(RESUMED), r.output
    assert re.search(r"attempt 1: rank-failed .* rank 1 on node 0 .* killed by SIGKILL$", r.stderr, re.M), r.stderr
    assert [line for line in r.stderr.splitlines() if "warm ranks:" in line] == [], r.stderr
    return {rank: json.loads((tmp_path / name / f"{rank}.json").read_text()) for rank in ("0", "1")}, r.stderr


# The cold side of the comparison: the same fields in a restart, with no training (it imports no torch:
# a cold rank's import is what warm ranks save, and the fields are read before any training starts).
COLD_PROBE = FIELDS + textwrap.dedent('''\
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
''')


@pytest.mark.timeout(300)
def test_torchrun_restarts_warm_and_its_warm_rank_sees_what_a_cold_rank_sees(
        launcher: Launcher, tmp_path: Path) -> None:
    """torchrun's agent starts the wrappers, which ask the node's template: both attempts warm, the failed one
    stopped by torchrun (its SIGTERM to the wrapper's group, passed on), the job resumed; field by field as
    the cold ranks of a restart."""
    warm_ranks, _ = restart_job(launcher, tmp_path, "torchrun", "resume_ddp.py", "warm")
    (tmp_path / "probe.py").write_text(COLD_PROBE)  # the same path: the fields hold it
    (tmp_path / "cold").mkdir()
    r = launcher.run("--layer", "torchrun", "--nproc-per-node", "2", "--master-port", str(free_port()),
                     "--max-restarts", "1", "--restart-backoff", "0", "--preload", "wave", "--no-warm-ranks",
                     "probe.py", "cold", cwd=tmp_path, env={"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"},
                     timeout=120)
    assert r.returncode == 0, r.output
    assert sorted(line.split("] ", 1)[1] for line in r.stdout.splitlines()).count("rank 1 cold") == 2, r.output
    cold_ranks = {rank: json.loads((tmp_path / "cold" / f"{rank}.json").read_text()) for rank in ("0", "1")}
    for rank in ("0", "1"):
        assert (warm_ranks[rank]["warm"], cold_ranks[rank]["warm"]) == (True, False)
        wf, cf = dict(warm_ranks[rank]["fields"]), dict(cold_ranks[rank]["fields"])  # type: ignore[call-overload]
        for job in (wf, cf):
            job["argv"], job["orig_argv"], job["cmdline"] = job["argv"][:1], job["orig_argv"][:-1], job["cmdline"][:-1]
            job["env"] = {k: v for k, v in job["env"].items() if k not in PER_JOB}
        assert {k: wf[k] for k in wf if wf[k] != cf[k]} == {}, {k: (wf[k], cf[k]) for k in wf if wf[k] != cf[k]}
        assert wf["env"]["TORCHELASTIC_RESTART_COUNT"] == "1" and wf["env"]["LOCAL_RANK"] == rank  # type: ignore[index]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("layer", [
    "horovod", pytest.param("deepspeed", marks=pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                                                  reason="deepspeed is not installed"))])
def test_a_launcher_layer_restarts_warm_in_its_standby_launcher(launcher: Launcher, tmp_path: Path,
                                                               layer: str) -> None:
    """Both attempts' ranks warm, and attempt 2 runs in the standby launcher (standby.py): with restarts on, the
    next attempt's horovodrun / deepspeed runner waits past its imports (and horovodrun's build probe) while an
    attempt runs (one node: tests/node/test_restarts.py has these layers' two-node restarts)."""
    _, err = restart_job(launcher, tmp_path, layer, "resume_hvd.py" if layer == "horovod" else "resume_ddp.py",
                         "warm", "--debug")
    name = {"horovod": "horovodrun", "deepspeed": "deepspeed"}[layer]
    assert re.search(rf"started {name} \(pid \d+\)\n", err), err  # attempt 1: cold
    assert re.search(rf"started {name} \(pid \d+, its standby\)\n", err), err  # attempt 2: in its standby
    assert err.count(f"standby {name} for the next attempt") == 1, err  # none for an attempt 3
    assert "DETLAUNCH_HOROVOD_PROBE" not in err  # horovodrun.py takes it out before anything runs
    lines = [line for line in err.splitlines() if re.match(r"detlaunch:   (attempt|  ->)", line)]
    assert len(lines) == 3 and lines[2].startswith("detlaunch:   attempt 2: finished"), lines
