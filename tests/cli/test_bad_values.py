"""Bad numbers and bad paths: one line naming what is wrong, exit 2, never a traceback, never a hang.

Almost everything runs the real ``detlaunch.cli.main.main`` in-process (milliseconds a case); those cases stop
before any process starts (--dry-run, or an error found before the supervisor). The option lists come from
the parsers themselves (every layer's), so a new number option is in the property test at once. A few real
runs (--layer direct, a rank that fails at once) check that a value which passes is also safe at run time.
"""

from __future__ import annotations

import argparse
import inspect
import os
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from detlaunch.cli.main import main
from detlaunch.planning.config import NUMBERS, Number, build_parser
from detlaunch.planning.plugin_manager import PluginSet
from detlaunch.testing.runner import Completed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.helpers import free_port
from support.jobs import Launcher

pytestmark = pytest.mark.timeout(60)


def run(capsys: pytest.CaptureFixture[str], *argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    code = main(list(argv), env={"PATH": os.environ["PATH"], **(env or {})})
    return code, capsys.readouterr().err


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('trained')\n")
    return str(path)


@pytest.mark.parametrize(("args", "line"), [
    (["--grace-period", "nan"], "argument --grace-period: 'nan' is not a finite number; valid: 0..3600 s"),
    (["--grace-period", "-1"], "argument --grace-period: '-1' is out of range; valid: 0..3600 s"),
    (["--start-timeout", "inf"], "argument --start-timeout: 'inf' is not a finite number; valid: 0.001..604800 s"),
    (["--start-timeout", "1e400"], "argument --start-timeout: '1e400' is not a finite number; valid: 0.001..604800 s"),
    (["--heartbeat", "0"], "argument --heartbeat: '0' is out of range; valid: 0.01..60 s"),
    (["--master-port", "0"], "argument --master-port: '0' is out of range; valid: 1..65535"),
    (["--master-port", "70000"], "argument --master-port: '70000' is out of range; valid: 1..65535"),
    (["--link-port", "-5"], "argument --link-port: '-5' is out of range; valid: 1..65535"),
    (["--control-port", "-5"], "argument --control-port: '-5' is out of range; valid: 1..65535"),  # its old name
    (["--nproc-per-node", "0"], "argument --nproc-per-node: '0' is out of range; valid: 1..4096"),
    (["--nnodes", "two"], "argument --nnodes: 'two' is not an integer; valid: 1..65536"),
    (["--ranks", "0,-1"], "argument --ranks: '-1' is out of range; valid: 0..2147483647"),
])
def test_a_bad_number_on_the_command_line(capsys: pytest.CaptureFixture[str], script: str, args: list[str],
                                          line: str) -> None:
    assert run(capsys, "--layer", "torchrun", "--dry-run", *args, script) == (
        2, f"detlaunch: error: {line} (see detlaunch --help)\n")


@pytest.mark.parametrize(("layer", "args", "line"), [
    ("torchrun", ["--master_port=99999"], "--master_port=99999: '99999' is out of range; valid: 1..65535"),
    ("torchrun", ["--nproc_per_node=0"], "--nproc_per_node=0: '0' is out of range; valid: 1..4096"),
    ("deepspeed", ["--num_gpus", "0"], "--num_gpus=0: '0' is out of range; valid: 1..4096"),
    ("horovod", ["-np", "100000"], "-np=100000: '100000' is out of range; valid: 1..4096"),
])
def test_a_bad_number_in_a_launchers_spelling(capsys: pytest.CaptureFixture[str], script: str, layer: str,
                                              args: list[str], line: str) -> None:
    """The launcher's own spelling meets the same range as detlaunch's option (a converted value too)."""
    assert run(capsys, "--layer", layer, "--dry-run", *args, script) == (2, f"detlaunch: error: {line}\n")


@pytest.mark.parametrize(("prefix", "why"), [
    ("{rank.foo}", "names an unknown field 'rank.foo'"),
    ("{rank[0]}", "names an unknown field 'rank[0]'"),
    ("{gpu}", "names an unknown field 'gpu'"),
    ("{rank!x}", "is not a valid template (Unknown conversion specifier x)"),
    ("{rank", "is not a valid template (expected '}' before end of string)"),
])
def test_a_bad_prefix_template(capsys: pytest.CaptureFixture[str], script: str, prefix: str, why: str) -> None:
    code, err = run(capsys, "--layer", "torchrun", "--dry-run", "--prefix", prefix, script)
    assert (code, err.count("\n")) == (2, 1), err
    assert err.startswith(f"detlaunch: error: argument --prefix: {prefix!r} {why}; use {{rank}}, {{node}}, {{host}}")


@pytest.mark.parametrize("port", ["70000", "-5", "0"])
def test_a_bad_ssh_port_is_refused_before_sshd_sees_it(capsys: pytest.CaptureFixture[str], script: str,
                                                       port: str) -> None:
    what = "is out of range"
    assert run(capsys, "--layer", "horovod", "--dry-run", "--ssh-port", port, script) == (
        2, f"detlaunch: error: argument --ssh-port: '{port}' {what}; valid: 1..65535 (see detlaunch --help)\n")
    code, err = run(capsys, "--layer", "horovod", "--dry-run", "--hosts", "127.0.0.1:1,127.0.0.2:1",
                    "--node-rank", "0", script, env={"DTRAIN_SSH_PORT": port})
    assert (code, err) == (2, f"detlaunch: error: DTRAIN_SSH_PORT='{port}': '{port}' {what}; valid: 1..65535\n")


def test_the_highest_master_port_leaves_none_for_the_link(capsys: pytest.CaptureFixture[str], script: str) -> None:
    two = ["--layer", "torchrun", "--dry-run", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "65535"]
    assert run(capsys, *two, script) == (
        2, "detlaunch: error: --master-port 65535 leaves no port for the link between nodes (master port + 1): "
           "give --link-port PORT or a lower --master-port\n")
    assert run(capsys, *two, "--link-port", "65534", script)[0] == 0
    assert run(capsys, *two, "--control-port", "65534", script)[0] == 0  # --link-port's old name
    assert run(capsys, "--layer", "torchrun", "--dry-run", "--master-port", "65535", script)[0] == 0  # one node


def test_a_layers_number_is_checked_too(capsys: pytest.CaptureFixture[str], script: str) -> None:
    assert run(capsys, "--layer", "horovod", "--dry-run", "--cycle-time-ms", "nan", script) == (
        2, "detlaunch: error: argument --cycle-time-ms: 'nan' is not a finite number; valid: 0..60000 ms "
           "(see detlaunch --help)\n")


def test_the_environment_and_the_config_file_are_checked_by_the_same_table(
        capsys: pytest.CaptureFixture[str], script: str, tmp_path: Path) -> None:
    assert run(capsys, "--layer", "torchrun", "--dry-run", script, env={"DETLAUNCH_GRACE_PERIOD": "nan"}) == (
        2, "detlaunch: error: DETLAUNCH_GRACE_PERIOD='nan': 'nan' is not a finite number; valid: 0..3600 s; "
           "fix or unset DETLAUNCH_GRACE_PERIOD\n")
    config = tmp_path / "d.toml"
    config.write_text("[detlaunch]\nstart_timeout = inf\n")  # a TOML float
    assert run(capsys, "--layer", "torchrun", "--config", str(config), "--dry-run", script) == (
        2, f"detlaunch: error: [detlaunch] start_timeout=inf: 'inf' is not a finite number; valid: 0.001..604800 s; "
           f"fix it in {config}\n")


def test_defaults_come_from_the_table(capsys: pytest.CaptureFixture[str], script: str) -> None:
    import json
    assert run(capsys, "--layer", "torchrun", "--dry-run", "--format", "json", script)[0] == 0
    # (the plan went to stdout; read it again)
    main(["--layer", "torchrun", "--dry-run", "--format", "json", script], env={"PATH": os.environ["PATH"]})
    plan = json.loads(capsys.readouterr().out)
    assert plan["supervisor"]["grace_period"] == NUMBERS["grace_period"].default == 30.0
    assert plan["supervisor"]["start_timeout"] == NUMBERS["start_timeout"].default == 300.0
    assert plan["supervisor"]["heartbeat"] == NUMBERS["heartbeat"].default == 1.0
    assert NUMBERS["master_port"].default == 29500


# -- paths -------------------------------------------------------------------------------------------


@pytest.fixture
def odd(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Paths of every odd kind: a directory, a FIFO, a socket, a device, a dangling link, a missing file."""
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("x = 1\n")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    # a Unix socket path must be short
    with tempfile.TemporaryDirectory(prefix="dl-") as short:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(os.path.join(short, "s"))
        try:
            yield {"dir": str(tmp_path / "dir"), "fifo": str(tmp_path / "fifo"), "file": str(tmp_path / "file"),
                   "dangling": str(tmp_path / "dangling"), "missing": str(tmp_path / "missing"),
                   "socket": os.path.join(short, "s"), "device": "/dev/null"}
        finally:
            sock.close()


@pytest.mark.parametrize(("kind", "why"), [
    ("dir", "Is a directory"), ("fifo", "a FIFO, not a regular file"),
    ("device", "a character device, not a regular file"), ("socket", "No such device or address"),
])
def test_config_and_hostfile_must_be_regular_files(capsys: pytest.CaptureFixture[str], script: str,
                                                   odd: dict[str, str], kind: str, why: str) -> None:
    path = odd[kind]
    assert run(capsys, "--layer", "torchrun", "--config", path, "--dry-run", script) == (
        2, f"detlaunch: error: cannot read config file {path}: {why}; give a TOML file\n")
    assert run(capsys, "--layer", "torchrun", "--hostfile", path, "--dry-run", script) == (
        2, f"detlaunch: error: cannot read --hostfile {path}: {why}\n")


def test_job_dir_that_is_a_file(capsys: pytest.CaptureFixture[str], script: str, odd: dict[str, str]) -> None:
    path = odd["file"]
    assert run(capsys, "--layer", "torchrun", "--job-dir", path, script) == (
        2, f"detlaunch: error: --job-dir {path} exists and is not a directory; choose another --job-dir\n")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory to another user")
def test_job_dir_of_another_user(capsys: pytest.CaptureFixture[str], script: str, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    assert run(capsys, "--layer", "torchrun", "--job-dir", str(theirs), script) == (
        2, f"detlaunch: error: --job-dir {theirs} belongs to uid 65534, not to you (uid 0); choose another --job-dir\n")
    assert sorted(os.listdir(theirs)) == []  # nothing written into it


def test_job_dir_under_a_file(capsys: pytest.CaptureFixture[str], script: str, odd: dict[str, str]) -> None:
    path = os.path.join(odd["file"], "sub")
    assert run(capsys, "--layer", "torchrun", "--job-dir", path, script) == (
        2, f"detlaunch: error: cannot use --job-dir {path}: Not a directory; choose another --job-dir\n")


# -- the property: whatever the values, exit 0/1/2, one line, no traceback, no hang ---------------------

LAYERS = ["torchrun", "horovod", "deepspeed", "direct"]
# The options whose type is checked text, not a number; every other typed option must be a config.Number,
# so that no number escapes the one range check (--restart-backoff 3e6 once reached select: a traceback).
TEXT_TYPES = {"ranks", "prefix", "restart_on", "no_restart_on", "job_id", "preflight", "nnodes",  # nnodes: N or MIN:MAX
              "spawn", "exclude_hosts", "ssh_opts"}  # never empty; --ssh-opts splits as a shell would


def layer_parser(layer: str) -> argparse.ArgumentParser:
    """The parser `detlaunch --layer LAYER` uses: the core options and the layer's own (as cli.run builds it)."""
    plugins = PluginSet({"PATH": os.environ["PATH"]})
    plugins.load_plugins()
    plugins.load_layer(layer)
    plugins.check_hooks()
    parser = build_parser(plugins.layer_names())
    plugins.hooks.add_options(parser)
    return parser


def checked_type(action: argparse.Action) -> object:
    return inspect.unwrap(action.type) if callable(action.type) else action.type  # a launcher flag's check wraps it


def numeric_options(layer: str) -> dict[str, argparse.Action]:
    """Every option of the layer that takes a number (its long spelling), read from the parser itself."""
    return {next(s for s in a.option_strings if s.startswith("--")): a for a in layer_parser(layer)._actions
            if isinstance(checked_type(a), Number) or a.dest == "ranks"}


NUMERIC = {layer: sorted(numeric_options(layer)) for layer in LAYERS}


@pytest.mark.parametrize("layer", LAYERS)
def test_every_number_is_a_checked_number(layer: str) -> None:
    typed = {a.dest for a in layer_parser(layer)._actions
             if a.type is not None and not isinstance(checked_type(a), Number)}
    assert typed == TEXT_TYPES
    assert {"--max-restarts", "--max-node-restarts", "--restart-backoff", "--restart-backoff-max", "--grace-period",
            "--master-port", "--ranks"} <= set(NUMERIC[layer])
    assert {"horovod": {"--cycle-time-ms", "--ssh-port"}, "deepspeed": {"--ssh-port"}}.get(layer, set()) <= set(
        NUMERIC[layer])


TEXT = ["--master-addr", "--node-addr", "--hosts", "--cluster", "--job-id", "--format"]
PATHS = ["--config", "--hostfile", "--job-dir", "--log-dir"]
PATH_KINDS = ["dir", "fifo", "file", "dangling", "missing", "socket", "device"]

numbers = st.one_of(st.integers(-2**70, 2**70).map(str), st.floats(allow_nan=True, allow_infinity=True).map(str),
                    st.sampled_from(["nan", "-inf", "1e400", "3e6", "1e300", "0x10", "1_000", " 3 ", "", "\u0663",
                                     "1,2", ",", "-0"]))
texts = st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_option_values_never_crash_or_hang(capsys: pytest.CaptureFixture[str], script: str,
                                                   odd: dict[str, str], data: st.DataObject) -> None:
    layer = data.draw(st.sampled_from(LAYERS))
    args: list[str] = []
    for _ in range(data.draw(st.integers(1, 3))):
        kind = data.draw(st.sampled_from(["number", "text", "path"]))
        if kind == "number":
            args += [data.draw(st.sampled_from(NUMERIC[layer])), data.draw(numbers)]
        elif kind == "text":
            args += [data.draw(st.sampled_from(TEXT)), data.draw(texts)]
        else:
            args += [data.draw(st.sampled_from(PATHS)), odd[data.draw(st.sampled_from(PATH_KINDS))]]
    as_env = data.draw(st.booleans())
    env = {}
    if as_env:  # the same values as DETLAUNCH_* variables
        env = {"DETLAUNCH_" + k[2:].upper().replace("-", "_"): v for k, v in zip(args[::2], args[1::2], strict=True)}
        args = []
    code = main(["--layer", layer, "--dry-run", *args, "--", script], env={"PATH": os.environ["PATH"], **env})
    captured = capsys.readouterr()
    assert code in (0, 1, 2), (args, env, captured.err)
    assert "Traceback" not in captured.err, (args, env, captured.err)
    if code != 0:
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("detlaunch: error: "), (args, env, captured.err)


# -- real runs: a value that passes the check must not break the job later (timers, timestamps) ---------

# Every option in seconds (metavar S), whatever its type: a number outside config.Number is run too.
SECONDS = sorted(a.option_strings[0] for a in layer_parser("direct")._actions if a.metavar == "S")
RESTART_AT_ONCE = ["--max-restarts", "1", "--restart-on", "3", "--restart-backoff", "0"]


@pytest.fixture
def fails_at_once(tmp_path: Path) -> str:
    path = tmp_path / "fail.py"
    path.write_text("raise SystemExit(3)\n")
    return str(path)


def assert_one_line_or_the_ranks_code(done: Completed) -> None:
    """Refused (exit 2, one error line), or run to the end (the rank's exit 3): never a traceback."""
    assert "Traceback" not in done.stderr, done.output
    assert done.returncode in (2, 3), done.output
    if done.returncode == 2:
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("detlaunch: error: "), done.output


def test_the_seconds_options_are_all_found() -> None:
    assert {"--grace-period", "--start-timeout", "--heartbeat", "--hang-timeout", "--dump-budget",
            "--dedupe-window", "--restart-backoff", "--restart-backoff-max"} <= set(SECONDS)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("value", ["3e6", "1e300"])
def test_huge_seconds_in_a_real_run(launcher: Launcher, fails_at_once: str, value: str) -> None:
    """Each option in seconds, far too large, with a rank that fails at once and a restart to wait for."""
    for option in SECONDS:
        both = ["--restart-backoff-max", value] if option == "--restart-backoff" else []  # the first <= the cap
        assert_one_line_or_the_ranks_code(launcher.run("--layer", "direct", *RESTART_AT_ONCE, option, value, *both,
                                                       fails_at_once, timeout=60))


@pytest.mark.timeout(240)
def test_the_largest_valid_seconds_in_a_real_run(launcher: Launcher, fails_at_once: str) -> None:
    """Each option in seconds at the top of its range runs to the rank's exit code (the backoff: see below)."""
    for option in SECONDS:
        if option != "--restart-backoff":
            high = f"{NUMBERS[option[2:].replace('-', '_')].high:g}"
            done = launcher.run("--layer", "direct", "--master-port", str(free_port()), *RESTART_AT_ONCE, option, high,
                                fails_at_once, timeout=60)
            assert (done.returncode, "Traceback" in done.stderr) == (3, False), done.output


@pytest.mark.timeout(60)
def test_a_days_backoff_waits_and_ctrl_c_ends_it(launcher: Launcher, fails_at_once: str) -> None:
    job = launcher.start("--layer", "direct", "--master-port", str(free_port()), "--max-restarts", "1000000",
                         "--restart-on", "3", "--restart-backoff", "86400", "--restart-backoff-max", "86400",
                         fails_at_once)
    job.wait_for_output("restart 1 of 1000000 in ", timeout=30)
    job.send_signal(signal.SIGINT)
    done = job.wait(30)
    assert (done.returncode, "Traceback" in done.stderr) == (130, False), done.output
    assert "SIGINT received while waiting to restart: not restarting" in done.stderr


def test_dedupe_with_a_prefix_of_its_own_is_refused(capsys: pytest.CaptureFixture[str], script: str) -> None:
    """Folding reads the default prefix: with another one it would silently fold nothing."""
    assert run(capsys, "--layer", "torchrun", "--dry-run", "--dedupe", "--prefix", "{rank}@{host} ", script) == (
        2, "detlaunch: error: --dedupe folds lines that carry the default prefix '[rank={rank}]' only: give "
           "--prefix or --dedupe, not both\n")
    assert run(capsys, "--layer", "torchrun", "--dry-run", "--prefix", "{rank}@{host} ", script)[0] == 0


@pytest.mark.parametrize("value", ["\x85", "a\u2028b", "a\rb", "x\x1cy"])
def test_a_value_holding_a_line_break_of_any_kind_stays_one_error_line(capsys: pytest.CaptureFixture[str],
                                                                        script: str, value: str) -> None:
    """Found by the property test above: a NEL ('\\x85') in a value the error names split its line in two."""
    code = main(["--layer", "torchrun", "--dry-run", "--hostfile", f"/nonexistent/{value}", "--", script],
                env={"PATH": os.environ["PATH"]})
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("detlaunch: error: "), err
