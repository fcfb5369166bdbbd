"""The deepspeed layer, for real: deepspeed's runner on CPU (gloo), pdsh over the per-job sshd on 127.0.0.2.

deepspeed takes 5-10 s to import in each process on a 2-core machine (the runner, each node's
deepspeed.launcher.launch, each rank of the all_reduce example): the real tests have generous
timeouts, and the failure and signal tests use ranks that import neither torch nor deepspeed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from detlaunch import ConfigError
from detlaunch_deepspeed import envfile, rank_shim
from detlaunch_deepspeed.envfile import DENY, env_file_lines, parse_version, quote_value, quoting_for
from detlaunch_deepspeed.layer import (
    accelerator_env,
    check_deepspeed_version,
    create_hostfile,
    create_run_command,
    network_env,
    one_node_gpu_args,
    pdsh_ssh_args_append,
    script_end,
)
from support.helpers import descendants_where, free_port, rank_lines, report_line
from support.jobs import EXAMPLES, ROOT, SCRIPTS, Launcher

DS = str(EXAMPLES / "ds_allreduce.py")
RANKS = str(SCRIPTS / "ranks.py")
DEEPSPEED = os.path.join(os.path.dirname(sys.executable), "deepspeed")
RUNNER = ["-m", "detlaunch_deepspeed.runner"]  # the deepspeed command's run, as a module (a standby can import it)
SHIM = str(Path(rank_shim.__file__).resolve())
TRICKY = "a  b 'c' \"d\" $HOME `id` \\n \\ ; e(f) & | * ~ !x"


# -- unit tests: pure functions ----------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("version", ["0.6.1", "0.6.2", "0.6.3", "0.6.4"])
def test_deepspeed_0_6_1_to_0_6_4_are_refused_for_multi_node(version: str) -> None:
    """The seed's check: these releases run an ssh check that cannot be skipped."""
    with pytest.raises(ConfigError) as e:
        check_deepspeed_version(parse_version(version), multi_machine=True)
    assert str(e.value) == (f"deepspeed {version} cannot run multi-node jobs under detlaunch: deepspeed 0.6.1 to "
                            "0.6.4 run an ssh check that cannot be skipped and fails with per-job ssh; "
                            "install deepspeed >= 0.15 (pip install -U deepspeed)")
    check_deepspeed_version(parse_version(version), multi_machine=False)  # one node: no ssh at all


@pytest.mark.timeout(10)
def test_other_versions_multi_node() -> None:
    for ok in ("0.15.0", "0.15.2", "0.16.5", "0.19.8", "1.0.0rc1"):
        check_deepspeed_version(parse_version(ok), multi_machine=True)
    for old in ("0.6.0", "0.6.5", "0.14.5"):
        with pytest.raises(ConfigError, match=r"^deepspeed .* is too old for multi-node jobs.*DS_ENV_FILE"):
            check_deepspeed_version(parse_version(old), multi_machine=True)
        check_deepspeed_version(parse_version(old), multi_machine=False)


@pytest.mark.timeout(10)
def test_the_rank_command_crosses_pdsh_as_one_word_no_shell_changes() -> None:
    command = ["/usr/bin/python3", "-u", "my dir/$x 'é\"q\".py", "a b", "$HOME", "`id`; ls", "ünï"]
    word = rank_shim.encode_words(command, "/tmp/it's a $dir")
    assert shlex.split(word) == [word] and shlex.quote(word) == word
    assert rank_shim.rank_command(["--local_rank=1", "3", "-", word]) == (
        [*command[:3], "--local_rank=1", *command[3:]], "", "/tmp/it's a $dir")
    assert rank_shim.rank_command(["1", "10.0.0.1", "x.py", "a"]) == (["x.py", "a"], "10.0.0.1", None)


@pytest.mark.timeout(10)
def test_parse_version_and_quoting_by_version() -> None:
    assert parse_version("0.19.8") == (0, 19, 8)
    assert parse_version("0.15.2+cpu") == (0, 15, 2)
    assert parse_version("0.16.0rc1") == (0, 16, 0)
    assert parse_version("1.2") == (1, 2)
    # Checked against the sources of 0.15.1 (add_export keeps the value bare), 0.15.2 and 0.16.4
    # (always in double quotes) and 0.16.5 (double quotes when it holds a special character).
    assert [quoting_for(parse_version(v)) for v in ("0.6.1", "0.6.2", "0.15.1", "0.15.2", "0.19.8")] == [
        "raw", "shell", "shell", "double", "double"]


def env_sample() -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin", "TRICKY": TRICKY, "EMPTY": "", "MULTI": "one\ntwo", "CR": "x\ry",
        "BASH_FUNC_module%%": "() { :; }", "OLDPWD": "/x", "HOSTNAME": "chief", "CUDA_VISIBLE_DEVICES": "0,1",
        "NVIDIA_CUDA_VISIBLE_DEVICES": "0", "SLURM_PROCID": "0", "DET_SLOT_IDS": "[0]", "DET_AGENT_ID": "a",
        "DETLAUNCH_SUPERVISOR": "/run/chief.sock", "DETLAUNCH_SSHD_SUPERVISOR": "/run/chief-sshd.sock",
        "DETLAUNCH_NODE_RANK": "0", "OLDPWD_KEPT": "1", "SLURM_PROCID_KEPT": "1", "BAD-NAME": "1",
        "DET_CHIEF_IP": "10.0.0.1", "USE_DEEPSPEED": "1",
    }


@pytest.mark.timeout(10)
def test_env_file_keeps_everything_but_the_deny_list() -> None:
    lines, skipped = env_file_lines(env_sample(), "double")
    names = [line.split("=", 1)[0] for line in lines]
    assert names == ["DET_CHIEF_IP", "EMPTY", "OLDPWD_KEPT", "PATH", "SLURM_PROCID_KEPT", "TRICKY", "USE_DEEPSPEED"]
    assert skipped == [
        ("BAD-NAME", "its name is not a shell variable name (the remote shell's `export` would fail)"),
        ("CR", "its value holds a newline, and deepspeed reads the env file line by line"),
        ("MULTI", "its value holds a newline, and deepspeed reads the env file line by line"),
    ]
    # The node-local ones: a chief-side value must never reach a worker's ranks.
    for name in ("DETLAUNCH_SUPERVISOR", "DETLAUNCH_SSHD_SUPERVISOR", "DETLAUNCH_NODE_RANK", "CUDA_VISIBLE_DEVICES",
                 rank_shim.NODE_DEVICES):
        assert envfile.is_denied(name)


@pytest.mark.timeout(10)
def test_a_ranks_devices_are_deepspeeds_indices_into_its_nodes_own_list() -> None:
    # deepspeed's launch sets the hostfile's slots as indices; the node's sshd gave its own list
    assert rank_shim.node_devices("0,1", "4,5,6,7") == "4,5"
    assert rank_shim.node_devices("0,1", "GPU-aa,GPU-bb") == "GPU-aa,GPU-bb"
    assert rank_shim.node_devices("0,1,2", "3") == "3"  # more slots than devices: CUDA sees what there is
    assert rank_shim.node_devices("0,1", "") == ""  # the node has no GPU for its ranks
    assert rank_shim.node_devices("0,1", None) is None  # the node had no list: deepspeed's own stands
    assert rank_shim.node_devices("GPU-x", "4,5") == "4,5"  # not indices: the node's own list


@pytest.mark.timeout(10)
def test_values_are_quoted_for_the_deepspeed_version() -> None:
    assert quote_value("a b'c", "shell") == shlex.quote("a b'c") == "'a b'\"'\"'c'"
    assert quote_value('a "b" $c `d` \\e', "double") == 'a \\"b\\" \\$c \\`d\\` \\\\e'
    assert quote_value("plain/value:1,2", "double") == "plain/value:1,2"
    assert quote_value("a b", "raw") == "a b"
    with pytest.raises(ValueError):
        quote_value("x", "json")


# deepspeed's MultiNodeRunner.add_export in each era, and how PDSHRunner builds the remote command.
ADD_EXPORT: dict[str, Callable[[str], str]] = {
    "shell": lambda v: v.strip(),  # 0.6.2 .. 0.15.1
    "double": lambda v: f'"{v.strip()}"',  # 0.15.2 .. 0.16.4
    "double-when-needed": lambda v: f'"{v.strip()}"' if re.search(r"[^\w@%+=:,./-]", v.strip()) else v.strip(),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("shell", ["sh", "bash"])
@pytest.mark.parametrize("era", list(ADD_EXPORT))
def test_quoted_values_reach_the_remote_shell_unchanged(real_processes: None, shell: str, era: str) -> None:
    """Each era's add_export + `export K=V;` in a real shell gives back the original value."""
    quoting = "shell" if era == "shell" else "double"
    values = {"TRICKY": TRICKY, "EMPTY": "", "PLAIN": "/usr/bin:/bin", "JSON": '{"a": [1, "b c"]}',
              "SLURM_JOB_CPUS_PER_NODE": "64(x2)", "DOLLAR": "$PATH${HOME}", "TRAILING": "x\\"}
    lines, _ = env_file_lines(values, quoting)
    exports = ""
    for line in lines:  # as runner.main reads the file, then PDSHRunner.get_cmd
        key, val = (line + "\n").split("=", maxsplit=1)
        exports += f"export {key.strip()}={ADD_EXPORT[era](val)}; "
    script = exports + "env -0"
    out = subprocess.run([shell, "-c", script], capture_output=True, check=True, env={"PATH": os.defpath}).stdout
    got = dict(item.split("=", 1) for item in out.decode().split("\0") if item)
    assert {k: got[k] for k in values} == values


@pytest.mark.timeout(30)
def test_the_env_file_writer(real_processes: None, tmp_path: Path) -> None:
    """The program the chief runs before deepspeed: private file, deny-list, and the user's own env files."""
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    (home / ".deepspeed_env").write_text("NCCL_IB_DISABLE=1\n\nDETLAUNCH_NODE_RANK=7\n")
    (cwd / ".deepspeed_env").write_text("NCCL_IB_DISABLE=0\n")
    out = tmp_path / "env"
    env = {**env_sample(), "HOME": str(home)}
    r = subprocess.run([sys.executable, "-S", envfile.__file__, "--quoting", "double", str(out)],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    text = out.read_text()
    assert text.endswith("NCCL_IB_DISABLE=1\nNCCL_IB_DISABLE=0\n")  # theirs last: they win, in deepspeed's order
    assert "DETLAUNCH_NODE_RANK" not in text and "HOSTNAME" not in text and "MULTI" not in text
    assert f"HOME={home}\n" in text and "TRICKY=" in text
    assert "detlaunch: warning: not exporting MULTI to the ranks: its value holds a newline" in r.stderr
    # Never over an existing file (the folder is fresh and private; anything there is not ours).
    again = subprocess.run([sys.executable, "-S", envfile.__file__, str(out)], env=env, capture_output=True,
                           timeout=20)
    assert again.returncode != 0 and out.read_text() == text
    # --replace: the layer's own file of the last attempt, written again by a restarted attempt.
    out.write_text("stale\n")
    again = subprocess.run([sys.executable, "-S", envfile.__file__, "--replace", str(out)], env=env,
                           capture_output=True, timeout=20)
    assert again.returncode == 0 and "stale" not in out.read_text() and "TRICKY=" in out.read_text()


@pytest.mark.timeout(10)
def test_commands_hostfile_and_pdsh_ssh_args() -> None:
    assert create_hostfile([2, 4], ["10.0.0.1", "10.0.0.2"]) == "10.0.0.1 slots=2\n10.0.0.2 slots=4\n"
    assert create_run_command(master_address="localhost", master_port=29500, num_gpus=2) == [
        "deepspeed", "--num_gpus", "2", "--master_addr", "localhost", "--master_port", "29500",
        "--no_python", "--no_local_rank"]
    assert create_run_command(master_address="10.0.0.1", master_port=1234, hostfile_path="/p/hostfile",
                              optional_args=["--bind_cores_to_rank"]) == [
        "deepspeed", "-H", "/p/hostfile", "--master_addr", "10.0.0.1", "--master_port", "1234", "--no_python",
        "--no_local_rank", "--no_ssh_check", "--launcher", "pdsh", "--bind_cores_to_rank"]
    # Appended to the user's value, never replacing it.
    assert pdsh_ssh_args_append("-vv -o LogLevel=ERROR ", "/j/ssh config", 2222) == (
        "-vv -o LogLevel=ERROR -F '/j/ssh config' -p 2222")
    assert pdsh_ssh_args_append(None, "/j/c", 22) == pdsh_ssh_args_append("  ", "/j/c", 22) == "-F /j/c -p 22"


@pytest.mark.timeout(10)
def test_accelerator_and_network_environment() -> None:
    assert accelerator_env({}, []) == {"DS_ACCELERATOR": "cpu"}
    assert accelerator_env({"DS_ACCELERATOR": "cuda"}, []) == {}  # the user's choice stands
    assert accelerator_env({}, ["/dev/nvidia0"]) == {}
    assert accelerator_env({"CUDA_VISIBLE_DEVICES": "0,1"}, []) == {}
    assert accelerator_env({"CUDA_VISIBLE_DEVICES": "-1"}, []) == {"DS_ACCELERATOR": "cpu"}
    gpu = {"CUDA_VISIBLE_DEVICES": "2,3", "DET_INTER_NODE_NETWORK_INTERFACE": "eth1"}
    assert network_env(gpu) == {"NCCL_SOCKET_IFNAME": "eth1"}
    assert network_env({**gpu, "NCCL_SOCKET_IFNAME": "ib0"}) == {}
    assert network_env({"DET_INTER_NODE_NETWORK_INTERFACE": "eth1"}) == {}
    # One node: --num_gpus, unless GPUs are assigned through CUDA_VISIBLE_DEVICES (deepspeed
    # would ignore it and take GPUs 0..N-1).
    assert one_node_gpu_args({}, [], 2) == 2
    assert one_node_gpu_args({"CUDA_VISIBLE_DEVICES": "0,1"}, [], 2) == 2  # no GPU here: CPU ranks
    assert one_node_gpu_args({"CUDA_VISIBLE_DEVICES": "2,3"}, ["/dev/nvidia2"], 2) is None
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES lists 2 device"):
        one_node_gpu_args({"CUDA_VISIBLE_DEVICES": "2,3"}, ["/dev/nvidia2"], 4)


# -- the plan ------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("command", "script"), [
    (("/v/bin/python", "-u", "train.py", "--epochs", "3"), ("/v/bin/python", "-u", "train.py")),
    (("python3", "-m", "pkg.train", "--x"), ("python3", "-m", "pkg.train")),
    (("python3.11", "-W", "ignore", "-X", "dev", "t.py", "a"), ("python3.11", "-W", "ignore", "-X", "dev", "t.py")),
    (("python", "-mpkg.train", "a"), ("python", "-mpkg.train")),
    (("python", "-c", "code", "a"), ("python", "-c", "code")),
    (("./train", "--epochs", "3"), ("./train",)),
])
def test_local_rank_goes_right_after_the_script(command: tuple[str, ...], script: tuple[str, ...]) -> None:
    """deepspeed's --local_rank=N lands where a script's own argparse sees it, never among Python's options."""
    assert command[:script_end(command)] == script


def test_dry_run_shows_the_chief_and_worker_chains(launcher: Launcher) -> None:
    ssh_port, master = free_port("127.0.0.2"), free_port()
    args = ["--layer", "deepspeed", "--hosts", "127.0.0.1:2,127.0.0.2:2", "--ssh-port", str(ssh_port),
            "--master-port", str(master), "--dry-run"]
    env = {"PDSH_SSH_ARGS_APPEND": "-o LogLevel=QUIET", "MULTI": "one\ntwo"}
    chief = launcher.run(*args, "--node-rank", "0", DS, env=env)
    worker = launcher.run(*args, "--node-rank", "1", DS, env=env)
    assert chief.returncode == worker.returncode == 0, chief.output + worker.output
    plan = json.loads(launcher.run(*args, "--format", "json", "--node-rank", "0", DS, env=env).stdout)
    run_dir = os.path.dirname(plan["supervisor"]["socket"])
    folder = f"{run_dir}/deepspeed"
    sshd, ds = plan["commands"]
    assert (sshd["name"], sshd["daemon"]) == ("sshd", True)
    client = next(f for f in plan["files"] if f.endswith("/client/ssh_config"))
    assert ds["argv"][1:-1] == [
        *RUNNER, "-H", f"{folder}/hostfile", "--master_addr", "127.0.0.1", "--master_port", str(master),
        "--no_ssh_check", "--launcher", "pdsh", SHIM, str(len(plan["rank_wrapper"]) + 3), "-"]
    # Over pdsh the rank command and its directory are one word no remote shell changes (rank_shim.py).
    assert rank_shim.decode_words(ds["argv"][-1:]) == ([*plan["rank_wrapper"], *plan["command"]], str(ROOT))
    assert (ds["name"], ds["daemon"], ds["stop_signal"]) == ("deepspeed", False, int(signal.SIGKILL))
    assert ds["env"]["DS_ENV_FILE"] == f"{folder}/env"
    assert ds["env"]["PDSH_SSH_ARGS_APPEND"] == f"-o LogLevel=QUIET -F {client} -p {ssh_port}"
    assert plan["rank_wrapper"][-3:] == ["--rank-env", "RANK", "--"]
    assert plan["wait_for_sshd"] == [f"127.0.0.1:{ssh_port}", f"127.0.0.2:{ssh_port}"]  # pdsh reaches the chief too
    assert folder in plan["dirs"] and f"{folder}/hostfile" in plan["files"]
    writer = plan["prelaunch"][-1]
    assert writer[:5] == [sys.executable, "-S", envfile.__file__, "--quoting", "double"]
    assert writer[-2:] == ["--replace", f"{folder}/env"] and writer[5:-2] == [a for p in DENY for a in ("--deny", p)]
    assert (plan["env"]["USE_DEEPSPEED"], plan["env"]["DS_ACCELERATOR"]) == ("1", "cpu")
    # The text tree says the same, and what would not be exported.
    assert re.search(r"├── writes /\S*/detlaunch-[0-9a-f]+/deepspeed/hostfile\n", chief.stdout)
    assert re.search(r"├── then runs: \S+ -S \S+/envfile.py --quoting double --deny 'BASH_FUNC_.\*' ", chief.stdout)
    assert "--deny '.*CUDA_VISIBLE_DEVICES' --deny SLURM_PROCID" in chief.stdout
    assert "[stop with SIGKILL]" in chief.stdout and " --words=" in chief.stdout  # the rank command, encoded
    assert "detlaunch: warning: deepspeed: not exporting MULTI to the ranks: its value holds a newline" in chief.stderr
    assert "sshd -D -e -f" in worker.stdout and "[daemon, stop with SIGTERM]" in worker.stdout
    assert "deepspeed" not in worker.stdout.split("environment added")[0].replace("layer deepspeed", "")
    assert "USE_DEEPSPEED=1" in worker.stdout and "DET_CHIEF_IP=127.0.0.1" in worker.stdout
    # Nothing was created.
    assert not os.path.exists(run_dir)
    assert list((launcher.tmpdir).iterdir()) == []
    assert not (launcher.cache / "detlaunch").exists()


@pytest.mark.timeout(60)
def test_dry_run_one_node(launcher: Launcher) -> None:
    r = launcher.run("--layer", "deepspeed", "--nproc-per-node", "2", "--master-port", "29555", "--dry-run",
                     "--format", "json", DS, env={"DS_ACCELERATOR": "cpu"})
    plan = json.loads(r.stdout)
    [ds] = plan["commands"]
    # deepspeed runs rank_shim.py, which puts --local_rank=N right after the script (index `at` of the rank command).
    at = len(plan["rank_wrapper"]) + 3  # the wrapper, then python -u SCRIPT
    assert ds["argv"][1:13] == [*RUNNER, "--num_gpus", "2", "--master_addr", "localhost", "--master_port", "29555",
                               SHIM, str(at), "-", *plan["rank_wrapper"][:1]]
    assert ds["stop_signal"] == int(signal.SIGKILL) and ds["env"] == {}
    assert plan["prelaunch"] == [] and plan["files"] == [] and "DS_ACCELERATOR" not in plan["env"]


# -- real runs -------------------------------------------------------------------------------------------


def hosts_args(*extra: str) -> list[str]:
    return ["--layer", "deepspeed", "--hosts", "127.0.0.1:2,127.0.0.2:2", "--ssh-port", str(free_port("127.0.0.2")),
            "--master-port", str(free_port()), *extra]


@pytest.mark.timeout(300)
def test_one_node_two_ranks_all_reduce(launcher: Launcher) -> None:
    r = launcher.run("--layer", "deepspeed", "--nproc-per-node", "2", "--master-port", str(free_port()), DS,
                     timeout=240)
    assert r.returncode == 0, r.output
    for rank in (0, 1):
        assert rank_lines(r.stdout, rank)[-1] == (
            f"rank {rank} of 2: deepspeed.comm.all_reduce sum = 1 (chief 127.0.0.1)")
    assert "job finished: 2 rank(s) exited 0" in r.stderr


@pytest.mark.timeout(300)
def test_one_node_the_launch_runs_in_the_runners_process_past_its_imports(launcher: Launcher) -> None:
    """deepspeed's runner would start `python -u -m deepspeed.launcher.launch` (a new interpreter that
    imports deepspeed and torch again, ~2 s): the runner runs it in its own process instead."""
    r = launcher.run("--layer", "deepspeed", "--nproc-per-node", "2", "--master-port", str(free_port()),
                     "--no-warm-ranks", str(SCRIPTS / "ancestors.py"), timeout=240)  # a warm rank's parent: detlaunch
    assert r.returncode == 0, r.output
    for rank in (0, 1):
        ancestors = [json.loads(line) for line in rank_lines(r.stdout, rank)]
        starters = [a for a in ancestors if RUNNER[1] in a or "deepspeed.launcher.launch" in a]
        assert len(starters) == 1 and starters[0][1:3] == RUNNER, ancestors  # the runner, and no launch


def test_the_runner_hands_only_its_one_node_launch_to_this_process(real_processes: None) -> None:
    from detlaunch_deepspeed import runner

    shim = runner._RunnersSubprocess()
    here = shim.Popen([*runner.LAUNCH, "--world_info=e30=", "train.py"], env={"A": "1"})
    assert isinstance(here, runner._LaunchHere) and (here.args, here.env) == (["--world_info=e30=", "train.py"],
                                                                               {"A": "1"})
    other = shim.Popen([sys.executable, "-c", "raise SystemExit(5)"])  # pdsh, mpirun, ...: a real process
    assert isinstance(other, subprocess.Popen) and other.wait(30) == 5
    assert shim.CalledProcessError is subprocess.CalledProcessError  # the rest is subprocess's own


def test_the_in_process_launch_ends_with_the_status_a_real_interpreter_would_give(
        real_processes: None, capsys: pytest.CaptureFixture[str]) -> None:
    from detlaunch_deepspeed.runner import exit_status

    for code in (None, 0, 3, 255, 256, -15, "rank 1 failed"):
        real = subprocess.run([sys.executable, "-c", f"raise SystemExit({code!r})"], capture_output=True, text=True)
        assert exit_status(code) == real.returncode, code
    assert capsys.readouterr().err == "rank 1 failed\n"


@pytest.mark.timeout(300)
def test_one_node_failing_rank_exits_with_its_own_code(launcher: Launcher) -> None:
    r = launcher.run("--layer", "deepspeed", "--nproc-per-node", "2", "--master-port", str(free_port()), RANKS,
                     env={"FAIL_RANK": "1", "FAIL_CODE": "3", "SLEEP": "200"}, timeout=240)
    assert r.returncode == 3, r.output  # deepspeed alone exits 1
    assert report_line(r.stderr) == "detlaunch: job failed: rank 1 on node 0 (127.0.0.1) exited with code 3"
    assert "detlaunch:   | something broke in rank 1" in r.stderr
    assert r.duration < 150  # the survivor would sleep 200 s


@pytest.mark.timeout(400)
def test_two_nodes_all_reduce_over_pdsh_and_the_per_job_sshd(launcher: Launcher,
                                                              request: pytest.FixtureRequest) -> None:
    args = hosts_args()
    short_tmp = Path(tempfile.mkdtemp())  # short enough to hold the chief's run directory (socket paths)
    request.addfinalizer(lambda: shutil.rmtree(short_tmp, ignore_errors=True))
    home = Path(os.path.expanduser("~"))
    assert not (ROOT / ".deepspeed_env").exists() and not (home / ".deepspeed_env").exists()
    worker = launcher.start(*args, "--node-rank", "1", DS)
    # A chief-side DETLAUNCH_SSHD_SUPERVISOR never reaches the ranks: each registers with its own node.
    chief = launcher.start(*args, "--node-rank", "0", DS,
                           env={"DETLAUNCH_SSHD_SUPERVISOR": "/nonexistent.sock", "TMPDIR": str(short_tmp)})
    rc, rw = chief.wait(330), worker.wait(60)
    # The hostfile and env file lived in the chief's run directory, gone now; none in the user's directories.
    assert list(short_tmp.iterdir()) == []
    assert not (ROOT / ".deepspeed_env").exists() and not (home / ".deepspeed_env").exists()
    assert not (launcher.cache / "detlaunch" / "jobs").exists() or not any(
        (launcher.cache / "detlaunch" / "jobs").iterdir())
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    line = "of 4: deepspeed.comm.all_reduce sum = 6 (chief 127.0.0.1)"
    assert [rank_lines(rc.stdout, r)[-1:] for r in (0, 1)] == [[f"rank {r} {line}"] for r in (0, 1)]
    assert [rank_lines(rw.stdout, r)[-1:] for r in (2, 3)] == [[f"rank {r} {line}"] for r in (2, 3)]
    assert "job finished: 4 rank(s) exited 0" in rc.stderr
    assert "job finished: 2 rank(s) on node 1 exited 0" in rw.stderr
    assert launcher.leftovers() == []  # both sshds and their sessions are gone


@pytest.mark.timeout(300)
def test_each_nodes_ranks_see_that_nodes_own_cuda_visible_devices(launcher: Launcher) -> None:
    """deepspeed leaves CUDA_VISIBLE_DEVICES out of its env file and its launch sets the hostfile's slot
    indices: each node's ranks get their indices into that node's own list, from its sshd."""
    args = hosts_args()
    show = {"SHOW_ENV": f"CUDA_VISIBLE_DEVICES,{rank_shim.NODE_DEVICES}", "DS_ACCELERATOR": "cpu"}
    # --grace-period: these ranks end at once, and under load (8 on 2 cores) deepspeed's launch on the worker
    # took more than the default 5 s after them to end its ssh session, which the worker then killed (pdsh: 255)
    worker = launcher.start(*args, "--node-rank", "1", "--grace-period", "30", RANKS,
                            env={**show, "CUDA_VISIBLE_DEVICES": "GPU-w1,GPU-w2"})
    chief = launcher.start(*args, "--node-rank", "0", RANKS, env={**show, "CUDA_VISIBLE_DEVICES": "3,2"})
    rc, rw = chief.wait(240), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    own = {0: "3,2", 1: "3,2", 2: "GPU-w1,GPU-w2", 3: "GPU-w1,GPU-w2"}
    for job, ranks in ((rc, (0, 1)), (rw, (2, 3))):
        for r in ranks:
            assert [line for line in rank_lines(job.stdout, r) if " env " in line] == [
                f"rank {r} env CUDA_VISIBLE_DEVICES={own[r]!r}", f"rank {r} env {rank_shim.NODE_DEVICES}=None"]
    assert launcher.leftovers() == []


@pytest.mark.timeout(300)
def test_a_failing_rank_on_the_worker_stops_both_nodes_with_its_code(launcher: Launcher) -> None:
    args = hosts_args()
    env = {"FAIL_RANK": "2", "FAIL_CODE": "3", "SLEEP": "200"}
    worker = launcher.start(*args, "--node-rank", "1", RANKS, env=env)
    chief = launcher.start(*args, "--node-rank", "0", RANKS, env=env)
    rc, rw = chief.wait(240), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (3, 3), rc.output + rw.output
    cause = "detlaunch: job failed: rank 2 on node 1 (127.0.0.2) exited with code 3"
    assert report_line(rc.stderr) == report_line(rw.stderr) == cause
    assert "detlaunch:   | something broke in rank 2" in rc.stderr
    assert rc.duration < 200  # the survivors would sleep 200 s


ENV_RANK = """\
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} env " + repr((os.environ.get("DS_TRICKY"), "DS_MULTI" in os.environ,
      os.environ.get("DETLAUNCH_NODE_RANK"), os.environ.get("DET_CHIEF_IP"), os.environ.get("USE_DEEPSPEED"))))
print(f"rank {rank} sleeping", flush=True)
time.sleep(float(sys.argv[1]))
"""


def launch_processes(root: int) -> list[psutil.Process]:
    """deepspeed.launcher.launch processes under `root`: what deepspeed's `pkill -f` looks for."""
    return descendants_where(root, lambda p: "deepspeed.launcher.launch" in " ".join(p.cmdline()))


@pytest.mark.timeout(400)
def test_ctrl_c_stops_both_nodes_and_spares_another_deepspeed_job(launcher: Launcher, tmp_path: Path) -> None:
    """deepspeed alone answers Ctrl-C with `pkill -f .../python -u -m deepspeed.launcher.launch` on every
    host: an unrelated deepspeed job on the same machine would die with ours. Under detlaunch it lives on.

    This test also checks what reaches the ranks through the env file (every rank, the chief's too,
    arrives over ssh with a bare environment).
    """
    script = tmp_path / "env_rank.py"
    script.write_text(ENV_RANK)
    other_out = tmp_path / "unrelated.out"
    other_env = {k: v for k, v in os.environ.items() if not k.startswith("DETLAUNCH")}
    other_env.update(DS_ACCELERATOR="cpu", TMPDIR=str(tmp_path / "tmp"), PYTHONUNBUFFERED="1")
    with open(other_out, "wb") as out:
        other = subprocess.Popen([DEEPSPEED, "--num_gpus", "1", "--master_port", str(free_port()), "--no_python",
                                  "--no_local_rank", sys.executable, str(script), "600"],
                                 env=other_env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=tmp_path, start_new_session=True)
    try:
        args = hosts_args("--no-local-rank")  # the script takes its seconds as argv[1], as the bare job above
        env = {"DS_TRICKY": TRICKY, "DS_MULTI": "one\ntwo"}
        worker = launcher.start(*args, "--node-rank", "1", str(script), "600", env=env)
        chief = launcher.start(*args, "--debug", "--node-rank", "0", str(script), "600", env=env)
        for job, rank in ((chief, 0), (chief, 1), (worker, 2), (worker, 3)):
            job.wait_for_output(f"[rank={rank}] rank {rank} sleeping", timeout=240)
        deadline = time.monotonic() + 120
        while "rank 0 sleeping" not in other_out.read_text(errors="replace"):
            assert other.poll() is None and time.monotonic() < deadline, other_out.read_text(errors="replace")
            time.sleep(0.1)
        [victim] = launch_processes(other.pid)
        # deepspeed's own kill pattern would match it: same python, same module.
        assert " ".join(victim.cmdline()).startswith(f"{victim.cmdline()[0]} -u -m deepspeed.launcher.launch")

        os.killpg(chief.proc.pid, signal.SIGINT)  # Ctrl-C in the chief's terminal
        rc, rw = chief.wait(120), worker.wait(60)
        assert (rc.returncode, rw.returncode) == (130, 130), rc.output + rw.output
        assert "job interrupted by SIGINT" in rc.stderr
        assert "node 0 was interrupted by SIGINT" in rw.stderr
        # The runner never ran its handler (which would pkill through pdsh while any sshd still answers).
        assert re.search(r"\[node 0\] deepspeed \(pid \d+\) ended: killed by SIGKILL", rc.stderr), rc.stderr
        assert launcher.leftovers() == []
        time.sleep(1.5)  # deepspeed's handler would pkill, then sleep 1 s, then exit
        assert other.poll() is None and victim.is_running() and victim.status() != psutil.STATUS_ZOMBIE

        expected = (TRICKY, False, None, "127.0.0.1", "1")
        for result, rank in ((rc, 0), (rc, 1), (rw, 2), (rw, 3)):
            assert rank_lines(result.stdout, rank)[0] == f"rank {rank} env {expected!r}"
        assert "not exporting DS_MULTI to the ranks: its value holds a newline" in rc.stderr
    finally:
        try:
            os.killpg(other.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        other.wait()
