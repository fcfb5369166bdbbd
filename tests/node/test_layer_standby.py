"""The horovod and deepspeed layers' standby launchers (standby.py): with restarts on, the next attempt's
horovodrun / deepspeed runner waits past its imports (and horovodrun's build probe) while an attempt runs,
and the next attempt runs in it (a job's restart in it: tests/node/test_warm_ranks.py, whose ranks are warm
in both attempts); run either way, they behave as the launchers' own commands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.jobs import SCRIPTS, Launcher

pytestmark = pytest.mark.timeout(300)

DDP = SCRIPTS / "resume_ddp.py"
ENTRIES = {"horovod": ("horovodrun", "detlaunch_horovod.horovodrun:main"),
           "deepspeed": ("deepspeed", "detlaunch_deepspeed.runner:main")}


@pytest.mark.parametrize("layer", sorted(ENTRIES))
def test_the_plan_shows_the_layers_standby_with_restarts_on_only(launcher: Launcher, layer: str) -> None:
    name, entry = ENTRIES[layer]
    base = ["--layer", layer, "--nproc-per-node", "2", "--dry-run"]
    with_restarts = launcher.run(*base, "--max-restarts", "1", str(DDP), timeout=60)
    without = launcher.run(*base, str(DDP), timeout=60)
    assert with_restarts.returncode == 0 and without.returncode == 0, with_restarts.output + without.output
    tag = f"next attempt's started ahead: {entry}"
    assert [line for line in with_restarts.stdout.splitlines() if tag in line][0].startswith("└── ")
    assert tag not in without.stdout
    plan = json.loads(launcher.run(*base, "--max-restarts", "1", "--format", "json", str(DDP), timeout=60).stdout)
    assert [(c["name"], c["standby"]) for c in plan["commands"]] == [(name, entry)], plan["commands"]
    assert plan["commands"][0]["argv"][1:3] == ["-m", entry.split(":")[0]]


def test_horovodrun_module_is_horovodrun(real_processes: None) -> None:
    """python -m detlaunch_horovod.horovodrun answers as the horovodrun command: its usage error, its exit code."""
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    ours = subprocess.run([sys.executable, "-m", "detlaunch_horovod.horovodrun", "--no-such-flag"],
                          capture_output=True, text=True, timeout=60)
    theirs = subprocess.run([horovodrun, "--no-such-flag"], capture_output=True, text=True, timeout=60)
    assert (ours.returncode, ours.stdout, ours.stderr) == (theirs.returncode, theirs.stdout, theirs.stderr)
    assert ours.returncode == 2 and "horovodrun: error: " in ours.stderr


def test_horovodrun_modules_helpers_import_none_of_horovods_launcher(real_processes: None) -> None:
    """horovodrun's per-rank helper (multiprocessing's spawn) runs the main module again as __mp_main__: there
    horovodrun.py imports nothing of horovod's launcher (~0.3 s a helper; the horovodrun command's import it all)."""
    probe = ("import runpy, sys; runpy.run_module('detlaunch_horovod.horovodrun', run_name='__mp_main__'); "
             "print(sorted(m for m in sys.modules if m.startswith('horovod')))")
    env = {**os.environ, "DETLAUNCH_HOROVOD_PROBE": "gloo"}
    helper = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert (helper.returncode, helper.stdout) == (0, "[]\n"), helper.stderr
    as_main = subprocess.run([sys.executable, "-c", probe.replace("__mp_main__", "detlaunch_horovod.horovodrun")],
                             capture_output=True, text=True, timeout=60, env=env)
    assert "'horovod.runner.launch'" in as_main.stdout, as_main.stderr  # the run and a standby have it at import


@pytest.mark.timeout(120)
def test_deepspeed_runner_module_is_the_deepspeed_command(real_processes: None) -> None:
    """python -m detlaunch_deepspeed.runner answers as the deepspeed command: its usage error, its exit code."""
    deepspeed = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    ours = subprocess.run([sys.executable, "-m", "detlaunch_deepspeed.runner", "--no-such-flag"],
                          capture_output=True, text=True, timeout=100, env=env)
    theirs = subprocess.run([deepspeed, "--no-such-flag"], capture_output=True, text=True, timeout=100, env=env)
    assert (ours.returncode, ours.stdout, ours.stderr.splitlines()[-2:]) == (
        theirs.returncode, theirs.stdout, theirs.stderr.splitlines()[-2:])
    assert ours.returncode == 2 and "deepspeed: error: " in ours.stderr
