"""--spawn, planned only (no process starts): what each node is started with, word for word; the bad
requests that are one line; a plugin's own spawner through the detlaunch_spawners hook."""

from __future__ import annotations

import os
import shlex
import socket
import sys
from pathlib import Path

import detlaunch
import psutil
import pytest
from detlaunch.cli.main import main
from detlaunch.cli.spawning import launches_for
from detlaunch.planning.command_line import CommandLine
from detlaunch.planning.plugin_manager import PluginSet
from detlaunch.planning.spawn import NodeLaunch, SpawnRequest
from support.discovery import clean_env

pytestmark = pytest.mark.timeout(60)

TRICKY = "my dir/$x 'é\"q\".py"
ARGS = ["a b", "$HOME", "`id`; ls", "ünï", "--lr=1e-3"]


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cwd = tmp_path / "it's a $dir"
    (cwd / "my dir").mkdir(parents=True)
    (cwd / TRICKY).write_text("print('hi')\n")
    monkeypatch.chdir(cwd)
    return cwd


def run(capsys: pytest.CaptureFixture[str], *argv: str, **env: str) -> tuple[int, list[str], list[str]]:
    code = main(list(argv), env=clean_env(os.environ, **env))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_each_node_gets_the_same_words_its_rank_the_directory_and_the_variables(
        capsys: pytest.CaptureFixture[str], here: Path) -> None:
    (here / ".deepspeed_env").write_text("NCCL_DEBUG=INFO\nDL_X=a 'b' $c\n")
    argv = ["--layer", "direct", "--spawn", "ssh", "--hosts", "127.0.0.1:2,10.0.0.2:2,10.0.0.3:2", "--ssh-opts",
            "-p 2222 -F 'my cfg'", "--export", "DL_MINE", "--dry-run", TRICKY, *ARGS]
    code, out, err = run(capsys, *argv, DL_MINE="x y", HOME=str(here / "home"))
    assert code == 0 and err == [], err
    assert [line.split(":")[0] for line in out] == ["node 0 (127.0.0.1)", "node 1 (10.0.0.2)", "node 2 (10.0.0.3)"]
    node = [sys.executable, "-m", "detlaunch", "--spawned", f"{detlaunch.__version__},stdin"]
    local = shlex.split(out[0].split(": ", 1)[1])  # node 0 is this machine: no ssh
    assert local == [*node, "--node-rank", "0", *argv]
    for rank, host in ((1, "10.0.0.2"), (2, "10.0.0.3")):
        ssh = shlex.split(out[rank].split(": ", 1)[1])
        assert ssh[:-1] == ["ssh", "-T", "-o", "BatchMode=yes", "-p", "2222", "-F", "my cfg", "--", host]
        assert shlex.split(ssh[-1]) == ["cd", str(here), "&&", "exec", *node, "--node-rank", str(rank), *argv]
    # The variables are on no command line (any local user reads those): each node reads them on its stdin.
    assert not any(value in line for line in out for value in ("INFO", "a 'b' $c", "x y"))


def test_node_0_runs_here_when_its_address_is_one_of_this_machines(capsys: pytest.CaptureFixture[str],
                                                                    here: Path) -> None:
    """Not only loopback's and the host name: an address one of this machine's interfaces holds (no ssh
    session to itself). 127.0.0.2 is not one (lo holds 127.0.0.1): the real-ssh tests reach it over ssh."""
    own = next((a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                if a.family == socket.AF_INET and not a.address.startswith("127.")), None)
    if own is None:
        pytest.skip("this machine has no address but loopback")
    for node0, first_word in ((own, sys.executable), ("127.0.0.2", "ssh")):
        code, out, err = run(capsys, "--layer", "direct", "--spawn", "ssh", "--hosts", f"{node0},10.0.0.2",
                             "--dry-run", TRICKY)
        assert code == 0 and err == [], err
        assert [shlex.split(line.split(": ", 1)[1])[0] for line in out] == [first_word, "ssh"], out


def test_horovods_x_reaches_every_node(capsys: pytest.CaptureFixture[str], here: Path) -> None:
    """mpirun's -x under --layer horovod: a bare NAME is exported to every node (as --export), NAME=VALUE goes
    as the argument it is (each node's horovod layer sets it for its processes)."""
    argv = ["--layer", "horovod", "--spawn", "ssh", "-H", "10.0.0.2:1,10.0.0.3:1", "--export", "DL_MINE",
            "-x", "DL_X", "-x", "DL_V=a b", "--dry-run", TRICKY]
    code, out, err = run(capsys, *argv, DL_MINE="1", DL_X="x y")
    assert code == 0 and err == [], err
    for line in out:
        words = shlex.split(shlex.split(line.split(": ", 1)[1])[-1])
        assert words[-5:] == argv[-5:] and "x y" not in line, words  # DL_X's value: on the nodes' stdin
    code, _, err = run(capsys, *argv)
    assert code == 2 and err == ["detlaunch: error: --export DL_MINE: DL_MINE is not set here; set it, or drop it "
                                 "from --export"], err


def test_spawn_comes_from_the_environment_or_the_config_file_too(capsys: pytest.CaptureFixture[str],
                                                                 here: Path) -> None:
    (here / "detlaunch.toml").write_text('[detlaunch]\nspawn = "ssh"\n')
    argv = ["--layer", "direct", "--hosts", "10.0.0.2,10.0.0.3", "--dry-run", TRICKY]
    for extra, env in ((["--config", "detlaunch.toml"], {}), ([], {"DETLAUNCH_SPAWN": "ssh"})):
        code, out, err = run(capsys, *extra, *argv, **env)
        assert code == 0 and err == [], err
        assert [line.split(": ")[0] for line in out] == ["node 0 (10.0.0.2)", "node 1 (10.0.0.3)"], out


@pytest.mark.parametrize(("argv", "env", "line"), [
    (["--spawn", "nope", "--hosts", "a,b"], {}, "--spawn nope: no such spawner (installed: "),
    (["--spawn", "ssh"], {}, "--spawn ssh needs the nodes: give --hosts H:S,H:S or --hostfile FILE"),
    (["--spawn", "ssh", "--hosts", "a,b", "--node-rank", "1"], {},
     "--spawn ssh starts every node with its own --node-rank: drop --node-rank"),
    (["--spawn", "ssh", "--hosts", "a,b", "--export", "DL_UNSET"], {},
     "--export DL_UNSET: DL_UNSET is not set here; set it, or drop it from --export"),
    (["--spawn", "ssh", "--hosts", "a,b", "--export", "A-B"], {}, "--export 'A-B': not a variable name"),
    (["--spawn", "srun"], {}, "--spawn srun runs inside a SLURM allocation (salloc, sbatch): SLURM_JOB_ID is not set"),
    (["--spawned", "0.0.1,stdin"], {}, f" runs detlaunch {detlaunch.__version__}, the spawning command 0.0.1: "
     "install the same detlaunch on every node"),
])
def test_a_request_that_cannot_be_met_is_one_line(capsys: pytest.CaptureFixture[str], here: Path, argv: list[str],
                                                  env: dict[str, str], line: str) -> None:
    code, _, err = run(capsys, "--layer", "direct", *argv, "--dry-run", TRICKY, **env)
    assert code == 2 and len(err) == 1 and line in err[0], err


def test_a_bad_env_file_line_is_one_line(capsys: pytest.CaptureFixture[str], here: Path) -> None:
    (here / ".deepspeed_env").write_text("OK=1\nnot a pair\n")
    code, _, err = run(capsys, "--layer", "direct", "--spawn", "ssh", "--hosts", "a,b", "--dry-run", TRICKY,
                       HOME=str(here))
    assert code == 2 and err == [f"detlaunch: error: {here}/.deepspeed_env:2: 'not a pair' is not KEY=VALUE; "
                                 "fix it (deepspeed's env file)"]


def test_srun_is_one_step_of_the_allocation(capsys: pytest.CaptureFixture[str], here: Path) -> None:
    code, out, err = run(capsys, "--layer", "direct", "--spawn", "srun", "--dry-run", TRICKY, SLURM_JOB_ID="41")
    assert code == 0, err
    [line] = out
    words = shlex.split(line.split(": ", 1)[1])
    assert words[:4] == ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", f"--chdir={here}"]
    assert words[4:] == [sys.executable, "-m", "detlaunch", "--spawned", detlaunch.__version__, "--layer", "direct",
                         "--spawn", "srun", "--dry-run", TRICKY]


class EchoSpawner:
    def launches(self, request: SpawnRequest) -> list[NodeLaunch]:
        return [NodeLaunch(("echo", host, *request.node_argv(node)), f"echo {node}", node)
                for node, host in enumerate(request.hosts)]


class EchoPlugin:
    @detlaunch.hookimpl
    def detlaunch_spawners(self, config: detlaunch.Config) -> dict[str, EchoSpawner]:
        return {"echo": EchoSpawner(), "ssh": EchoSpawner()}  # a built-in's name: the built-in was first


def test_a_plugins_spawner_comes_through_the_detlaunch_spawners_hook(here: Path) -> None:
    env = clean_env(os.environ)
    plugins = PluginSet(env)
    plugins.load_plugins()
    plugins.pm.register(EchoPlugin())
    plugins.check_hooks()
    argv = ["--layer", "direct", "--spawn", "echo", "--hosts", "a,b", TRICKY]
    config = CommandLine.read(argv, env).config(plugins.hooks)
    assert {"echo", "ssh", "srun"} <= set(plugins.hooks.spawners(config))
    launches = launches_for(plugins.hooks, config, argv)
    assert [launch.argv[:2] for launch in launches] == [("echo", "a"), ("echo", "b")]
    assert launches[1].argv[-len(argv):] == tuple(argv)
    ssh = launches_for(plugins.hooks, CommandLine.read([*argv[:3], "ssh", *argv[4:]], env).config(plugins.hooks),
                       argv)
    assert ssh[1].argv[0] == "ssh"


def test_the_variables_and_the_secret_reach_a_node_on_its_stdin_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a spawned node reads first (start_lines), read back as the node reads it: every value exactly, a
    newline, quotes and unicode included, then the job secret; a stop line first is a stop."""
    from detlaunch.cli import spawning

    variables = {"HF_TOKEN": "hf_abc", "DL_X": "a 'b' $c\nline two", "DL_U": "ünï"}
    for data, expected in ((spawning.start_lines("s3cret", variables), ("s3cret", variables)),
                           (spawning.start_lines("s3cret", {}), ("s3cret", {}))):
        r, w = os.pipe()
        os.write(w, data + b"stop\n")
        os.close(w)
        saved = os.dup(0)
        try:
            os.dup2(r, 0)
            assert spawning._take_the_start_lines() == expected
            assert os.read(0, 100) == b"stop\n"  # left for the watch
        finally:
            os.dup2(saved, 0)
            os.close(saved)
            os.close(r)


@pytest.mark.parametrize("host", ["a;touch /tmp/x", "$(id)", "h`id`", "-oProxyCommand=x", "a b", "h|x", "h'x"])
def test_a_host_with_a_shell_metacharacter_is_refused(capsys: pytest.CaptureFixture[str], here: Path,
                                                       host: str) -> None:
    """Security round 2, item 7: an older OpenSSH expands %h unquoted in a user's ProxyCommand."""
    code, out, err = run(capsys, "--layer", "direct", "--spawn", "ssh", "--hosts", f"10.0.0.2,{host}", "--dry-run",
                         TRICKY)
    assert code == 2 and out == [] and len(err) == 1, err
    said = {"is not a host name or address": True, "bad host": host in ("a;touch /tmp/x", "-oProxyCommand=x", "a b")}
    assert any(words in err[0] for words, expected in said.items() if expected), err  # --hosts' own check, or ours
