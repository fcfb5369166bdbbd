"""What detlaunch imports before its launcher starts, and the /proc tree walk that replaced psutil there (ms).

Every module imported before the fork is held by all three detlaunch processes of a node and is paid
for in every job's start (issue 11: launch overhead <= 1.10x the bare launcher; issue 17: <= 30 MB PSS).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from detlaunch.system import procs

pytestmark = pytest.mark.timeout(30)

# Needed only once ranks run (sampling, stacks) or for a rare request: imported there, not at start-up.
LATER = {"psutil", "subprocess", "detlaunch.stacks.pyspy", "detlaunch.stacks.groups"}
# OpenSSL's libcrypto (~3 MB a process): the detlaunch command's hashlib is its builtins
# (cli.without_openssl_hashes), and only a job with a link between nodes signs with hmac (link.auth.mac).
OPENSSL = {"secrets", "hmac", "_hashlib"}


def test_the_supervisor_starts_without_what_only_a_sample_or_a_dump_needs(real_processes: None) -> None:
    code = ("import sys, json\nimport detlaunch.cli.main\n"
            "detlaunch.cli.main.without_openssl_hashes()  # as main() does\n"
            "import detlaunch.planning.plan, detlaunch.system.isolation, detlaunch.node.supervisor\n"
            "print(json.dumps(sorted(name for name, module in sys.modules.items() if module is not None)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    imported = set(json.loads(out))
    assert "detlaunch.node.supervisor" in imported
    assert not imported & LATER, sorted(imported & LATER)
    assert not imported & OPENSSL, sorted(imported & OPENSSL)


def test_sampling_a_tree_needs_no_psutil(real_processes: None) -> None:
    code = ("import os, sys\nfrom detlaunch.observe.sampler import ProcessTreeSampler\n"
            "u = ProcessTreeSampler().sample(os.getpid())\nprint(u.processes, u.rss, 'psutil' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "1" and int(out[1]) > 1_000_000 and out[2] == "False", out


def test_the_tree_walk_finds_children_and_tells_a_zombie(real_processes: None) -> None:
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while not procs.is_zombie(dead):  # it exits at once; until reaped it is a zombie
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.01)
        below = procs.descendants()
        assert live.pid in below and dead in below
        assert not procs.is_zombie(live.pid)
        assert procs.descendants(live.pid) == []
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait()
        os.waitpid(dead, 0)
    assert procs.is_zombie(dead)  # reaped: gone counts as not alive too


def test_a_start_parses_no_toml_and_reads_no_distribution_metadata_it_does_not_need(real_processes: None,
                                                                                    tmp_path: Path) -> None:
    """No config file: no TOML parser; no typo: no difflib; no listing, error or name published twice:
    the scan of every installed distribution for who publishes an entry point (~15 ms) is not made."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    code = ("import contextlib, io, json, os, sys\n"
            "from detlaunch.cli import main as cli\ncli.without_openssl_hashes()\n"
            "from detlaunch.planning import plugin_manager as plugins\nscans = []\n"
            "scan = plugins._owners\nplugins._owners = lambda: scans.append(1) or scan()\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    code = cli.run(['--layer', 'torchrun', '--nproc-per-node', '2', '--dry-run', sys.argv[1]],"
            " dict(os.environ))\n"
            "modules = sorted(name for name, module in sys.modules.items() if module is not None)\n"
            "print(json.dumps({'code': code, 'scans': len(scans), 'modules': modules}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DETLAUNCH_")}
    out = json.loads(subprocess.run([sys.executable, "-c", code, str(script)], capture_output=True, text=True,
                                    check=True, env=env).stdout)
    assert out["code"] == 0 and out["scans"] == 0
    assert not {"tomllib", "difflib"} & set(out["modules"]), sorted({"tomllib", "difflib"} & set(out["modules"]))
    assert not OPENSSL & set(out["modules"]), sorted(OPENSSL & set(out["modules"]))
