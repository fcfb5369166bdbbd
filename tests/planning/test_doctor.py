"""`detlaunch doctor [--layer NAME]`: one line per check with its fix, exit 1 when a required check fails;
on this (healthy) install, and on broken ones: sshd missing, a horovod without Gloo or without its torch extension.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from detlaunch import Check, Config, hookimpl
from detlaunch.cli.main import doctor, main
from detlaunch.planning.doctor import exit_code, nvidia_uvm_check, ptrace_check, writable_dir_check
from detlaunch.planning.plugin_manager import PluginSet
from detlaunch.ssh import SSH_PORT_ENV
from support.helpers import free_port
from support.jobs import Launcher

pytestmark = pytest.mark.timeout(120)
SO_NAME = "mpi_lib_v2.cpython-311-x86_64-linux-gnu.so"


def lines(stdout: str) -> dict[str, str]:
    """Each check's line, by its name (the text between the mark and the first ': ')."""
    out = {}
    for line in stdout.splitlines():
        if line[:4] in ("ok  ", "FAIL", "warn"):
            out[line[6:].split(": ")[0]] = line
    return out


@pytest.mark.parametrize("layer", ["torchrun", "horovod", "deepspeed", "direct"])
def test_doctor_on_this_healthy_install(launcher: Launcher, layer: str) -> None:
    port = free_port()
    r = launcher.run("doctor", "--layer", layer, "--master-port", str(port), timeout=100)
    assert r.returncode == 0, r.output
    found = lines(r.stdout)
    # The sandbox's own XDG_CACHE_HOME has no JIT-built deepspeed ops: that one is a warning.
    warned = {name for name, line in found.items() if not line.startswith("ok  ")}
    assert warned <= {"deepspeed's CPU Adam op ready"} and "FAIL" not in r.stdout, r.stdout
    assert {"temp dir writable (private run dirs)", "job dir writable (per-job ssh keys)", "torch importable",
            "ptrace policy (stacks of hung ranks)",
            "PID namespace for the job (nothing outlives a SIGKILLed detlaunch)", f"master port {port} free",
            f"link port {port + 1} free"} <= set(found)
    expected = {"torchrun": {"torch.distributed with gloo"}, "direct": {"torch.distributed with gloo"},
                "horovod": {"horovod built with Gloo (--controller gloo)", "horovodrun", "sshd found", "ssh found"},
                "deepspeed": {"deepspeed's accelerator", "pdsh found", "sshd found", "no stale torch build lock"}}
    assert expected[layer] <= set(found), r.stdout


def test_doctor_without_a_layer_checks_the_core_and_says_how_to_check_one(launcher: Launcher) -> None:
    r = launcher.run("doctor", "--master-port", str(free_port()))
    assert r.returncode == 0, r.output
    assert r.stdout.splitlines()[-1] == "(add --layer NAME to check what a layer needs)"


def test_a_port_in_use_fails_with_its_fix(launcher: Launcher) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = launcher.run("doctor", "--layer", "torchrun", "--master-port", str(port))
    assert r.returncode == 1, r.output
    assert lines(r.stdout)[f"master port {port} free"] == (
        f"FAIL  master port {port} free: --master-port {port} is already in use on 127.0.0.1 "
        "-- fix: pick a free port with --master-port")


@pytest.fixture
def doctor_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, dict[str, str]]]:
    """`detlaunch doctor ARGS` in this process: (exit code, each check's line by its name)."""
    env = {k: v for k, v in os.environ.items() if k != SSH_PORT_ENV}
    env.update(TMPDIR=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))

    def run(*args: str) -> tuple[int, dict[str, str]]:
        rc = main(["doctor", *args], env)
        return rc, lines(capsys.readouterr().out)

    return run


TWO_NODES = ("--hosts", "127.0.0.1:1,127.0.0.2:1")


def listening(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_the_link_port_in_use_fails_a_multi_node_job_and_warns_on_one_node(real_processes: None,
                                                                           doctor_in_process: Any) -> None:
    master = free_port()
    with listening(master + 1):
        rc, found = doctor_in_process("--layer", "direct", "--master-port", str(master), *TWO_NODES)
        assert rc == 1
        assert found[f"link port {master + 1} free"] == (
            f"FAIL  link port {master + 1} free: --link-port {master + 1} is already in use on 127.0.0.1 "
            "-- fix: pick a free port with --link-port")
        assert found[f"master port {master} free"].startswith("ok  ")
        rc, found = doctor_in_process("--layer", "direct", "--master-port", str(master))
        assert rc == 0  # one node: no job link, so a warning
        assert found[f"link port {master + 1} free"].startswith(
            f"warn  link port {master + 1} free: --link-port {master + 1} is already in use")
        assert found[f"link port {master + 1} free"].endswith("(only for jobs on several nodes)")
    other = free_port()
    with listening(other):
        rc, found = doctor_in_process("--layer", "torchrun", "--master-port", str(master), "--control-port",
                                      str(other), *TWO_NODES)
        assert rc == 1 and found[f"link port {other} free"].startswith("FAIL  "), found
        assert f"link port {master + 1} free" not in found  # --control-port (--link-port's old name), not master + 1


def test_a_master_port_that_leaves_no_link_port(real_processes: None, doctor_in_process: Any) -> None:
    rc, found = doctor_in_process("--layer", "direct", "--master-port", "65535", *TWO_NODES)
    assert rc == 1
    assert found["link port free"] == ("FAIL  link port free: the master port 65535 + 1 is no port -- fix: "
                                       "give --link-port PORT or a lower --master-port")


@pytest.mark.parametrize("layer", ["horovod", "deepspeed"])
def test_an_ssh_port_in_use_is_named_by_the_ssh_layers(real_processes: None, doctor_in_process: Any,
                                                       layer: str) -> None:
    master, ssh = free_port(), free_port()
    name = f"ssh port (the per-job sshd) {ssh} free"
    rc, found = doctor_in_process("--layer", layer, "--master-port", str(master), *TWO_NODES)
    assert not [n for n in found if n.startswith("ssh port")], found  # not given: nothing to check
    with listening(ssh):
        rc, found = doctor_in_process("--layer", layer, "--master-port", str(master), "--ssh-port", str(ssh),
                                      *TWO_NODES)
        assert rc == 1
        assert found[name] == (f"FAIL  {name}: --ssh-port {ssh} is already in use on 127.0.0.1 -- fix: pick a free "
                               "port with --ssh-port")
        rc, found = doctor_in_process("--layer", layer, "--master-port", str(master), "--ssh-port", str(ssh))
        assert found[name].startswith("warn  ") and found[name].endswith("(only for jobs on several nodes)")
    rc, found = doctor_in_process("--layer", layer, "--master-port", str(master), "--ssh-port", str(ssh),
                                  *TWO_NODES)
    assert found[name] == f"ok    {name}: on 127.0.0.1"


def test_sshd_missing_fails_for_a_multi_node_job(launcher: Launcher) -> None:
    """A real machine without sshd: a mount namespace hides /usr/sbin (and /sbin, its link), PATH lacks it."""
    path = ":".join(p for p in os.environ["PATH"].split(":") if "sbin" not in p)
    hide = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs tmpfs /usr/sbin && exec "$@"', "sh"]
    args = ("doctor", "--layer", "horovod", "--hosts", "127.0.0.1:1,127.0.0.2:1", "--master-port", str(free_port()))
    r = launcher.start(*args, env={"PATH": path}, prefix=hide).wait(100)
    assert r.returncode == 1, r.output
    assert lines(r.stdout)["sshd found"] == ("FAIL  sshd found: not on PATH or /usr/sbin, /sbin -- fix: "
                                             "apt-get install openssh-server")
    one_node = launcher.start(*args[:3], "--master-port", str(free_port()), env={"PATH": path}, prefix=hide).wait(100)
    assert one_node.returncode == 0, one_node.output  # one node needs no sshd: a warning only
    assert lines(one_node.stdout)["sshd found"].startswith("warn  sshd found: not on PATH")
    assert os.path.exists("/usr/sbin/sshd")  # the namespace hid it from that process only


def fake_horovod(root: Path, controllers: bytes | None) -> Path:
    """A real horovod package on PYTHONPATH: built without Gloo (`controllers` in its extension), or without
    its torch extension at all (None)."""
    pkg = root / "horovod"
    (pkg / "torch").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.28.1'\n")
    built = controllers or b""
    (pkg / "torch" / "__init__.py").write_text(
        f"def gloo_built():\n    return {b'GlooController' in built}\n\n"
        f"def mpi_built():\n    return {b'MPIController' in built}\n")
    if controllers is not None:
        (pkg / "torch" / SO_NAME).write_bytes(b"\0ELF...symbols..." + controllers + b"\0")
    return root


def test_a_horovod_without_gloo_fails_doctor_and_is_one_line_before_anything_starts(launcher: Launcher,
                                                                                  tmp_path: Path) -> None:
    env = {"PYTHONPATH": f"{fake_horovod(tmp_path / 'fake', b'MPIController')}:{os.environ.get('PYTHONPATH', '')}"}
    r = launcher.run("doctor", "--layer", "horovod", "--master-port", str(free_port()), env=env, timeout=100)
    assert r.returncode == 1, r.output
    assert lines(r.stdout)["horovod built with Gloo (--controller gloo)"].startswith(
        "FAIL  horovod built with Gloo (--controller gloo): controllers built: mpi -- fix: reinstall: "
        "HOROVOD_WITH_GLOO=1 ")
    mark = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(mark)!r}, 'w').close()\n")
    job = launcher.run("--layer", "horovod", "--nproc-per-node", "2", str(script), env=env)
    assert job.returncode == 2, job.output
    assert job.stderr.splitlines() == [
        "detlaunch: error: horovod was built without Gloo support: reinstall it with HOROVOD_WITH_GLOO=1 "
        "(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 pip install --no-build-isolation --no-cache-dir "
        "--force-reinstall horovod (with torch installed first; see scripts/setup.sh)), or use --controller mpi"]
    assert not mark.exists() and job.stdout == ""


def test_a_horovod_without_its_torch_extension_is_one_line(launcher: Launcher, tmp_path: Path) -> None:
    env = {"PYTHONPATH": f"{fake_horovod(tmp_path / 'fake', None)}:{os.environ.get('PYTHONPATH', '')}"}
    job = launcher.run("--layer", "horovod", "-np", "2", sys.executable, "-c", "pass", env=env)
    assert job.returncode == 2, job.output
    assert job.stderr.startswith("detlaunch: error: horovod is installed without its PyTorch extension (pip built "
                                 "it without torch): reinstall it: HOROVOD_WITH_PYTORCH=1 ")
    assert len(job.stderr.splitlines()) == 1


# -- a third-party layer's checks, through the hook ------------------------------------------------------------


class ToyLayer:
    @hookimpl
    def detlaunch_doctor_checks(self, config: Config) -> list[Check]:
        return [Check("toy runtime", config.options.get("toy") == "yes", "missing", "pip install toy-runtime"),
                Check("toy cache", False, "cold", "run toy --warm", required=False)]


class BrokenLayer:
    @hookimpl
    def detlaunch_doctor_checks(self, config: Config) -> list[Check]:
        raise RuntimeError("boom")


def test_a_third_party_layer_gets_doctor_through_the_doctor_checks_hook(real_processes: None,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      tmp_path: Path) -> None:
    plugins = PluginSet({})
    plugins.pm.register(ToyLayer(), name="detlaunch.layers:toy")
    plugins.pm.register(BrokenLayer(), name="detlaunch.plugins:broken")
    config = Config(layer="toy", command=(), launcher_args=(), env={"HOME": str(tmp_path)},
                    options={"master_port": free_port(), "job_dir": str(tmp_path / "jobs")})
    checks = plugins.hooks.doctor_checks(config)
    assert sorted(c.line() for c in checks) == [
        "FAIL  broken: its checks: raised RuntimeError: boom -- fix: report this to the broken plugin's authors",
        "FAIL  toy runtime: missing -- fix: pip install toy-runtime",
        "warn  toy cache: cold -- fix: run toy --warm"]
    assert doctor(plugins.hooks, config) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == [c.line() for c in checks] and out[0].startswith("ok    temp dir writable")
    assert exit_code([c for c in checks if not c.required]) == 0  # a warning alone does not fail doctor


def test_the_ptrace_policy(tmp_path: Path) -> None:
    scope = tmp_path / "ptrace_scope"
    assert ptrace_check(str(tmp_path / "absent")).ok
    for value, root, ok in (("0", False, True), ("1", False, False), ("1", True, True), ("2", True, True),
                            ("2", False, False), ("3", True, False)):
        scope.write_text(value + "\n")
        check = ptrace_check(str(scope), is_root=root)
        assert (check.ok, check.required) == (ok, False if not ok else True), value
    fallback = ("py-spy may not read the ranks; their stacks come from the faulthandler fallback "
                "(Python frames only, no C frames)")
    assert ptrace_check(str(scope), is_root=True).line() == (
        f"warn  ptrace policy (stacks of hung ranks): ptrace_scope=3: {fallback} -- fix: none while the machine "
        "runs: scope 3 forbids ptrace to everyone until a reboot")
    scope.write_text("1\n")
    assert ptrace_check(str(scope), is_root=False).line() == (
        f"warn  ptrace policy (stacks of hung ranks): ptrace_scope=1: {fallback} -- fix: echo 0 > {scope} "
        "(as root), or run as root")


def test_a_job_dir_that_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    bad = writable_dir_check("job dir writable", str(tmp_path / "file" / "jobs"), "give --job-dir DIR")
    assert (bad.ok, bad.line()) == (False, f"FAIL  job dir writable: {tmp_path / 'file'} is not a directory "
                                           "-- fix: give --job-dir DIR")
    good = writable_dir_check("job dir writable", str(tmp_path / "a" / "b"), "x")
    assert good.ok and good.detail == f"{tmp_path / 'a' / 'b'} (can be created in {tmp_path})"
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]  # the probe file is gone


def test_a_stale_torch_build_lock_is_named_by_doctor_and_while_planning(launcher: Launcher, tmp_path: Path) -> None:
    """A killed JIT build leaves its lock: every rank would wait for it forever (docs/LAUNCHER_FLAGS.md)."""
    lock = tmp_path / "ext" / "py311_cpu" / "fused_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    r = launcher.run("doctor", "--layer", "deepspeed", "--master-port", str(free_port()), env=env, timeout=100)
    assert r.returncode == 0, r.output  # a warning: the build may be running
    assert lines(r.stdout)["no stale torch build lock"] == (
        f"warn  no stale torch build lock: {lock} -- fix: remove the lock file if no build is running")
    assert lines(r.stdout)["deepspeed's CPU Adam op ready"].startswith(
        f"warn  deepspeed's CPU Adam op ready: neither prebuilt nor cached in {tmp_path / 'ext'}: ")
    plan = launcher.run("--layer", "deepspeed", "--master-port", str(free_port()), "--dry-run", sys.executable,
                        env=env)
    assert plan.returncode == 0, plan.output
    assert plan.stderr.splitlines()[-1] == (
        f"detlaunch: warning: deepspeed: torch's build lock {lock} exists: an op is being built, or a killed build "
        "left it, and then every rank waits for it forever: remove it if no build is running")


@pytest.mark.timeout(10)
def test_nvidia_uvm_not_loaded_is_named_for_a_user_whose_job_runs_in_a_user_namespace(tmp_path: Path) -> None:
    assert nvidia_uvm_check(str(tmp_path)) is None  # no NVIDIA GPU: no check
    (tmp_path / "nvidia0").touch()
    user, root = nvidia_uvm_check(str(tmp_path), is_root=False), nvidia_uvm_check(str(tmp_path), is_root=True)
    assert user is not None and root is not None and root.ok and not user.ok and not user.required
    assert user.fix.startswith("load it once per boot: nvidia-modprobe -u -c=0")
    (tmp_path / "nvidia-uvm").touch()
    loaded = nvidia_uvm_check(str(tmp_path), is_root=False)
    assert loaded is not None and loaded.ok and loaded.detail == "loaded"
