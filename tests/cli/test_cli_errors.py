"""Bad input: one clear line on stderr, exit 2, no traceback (unless --debug); and inputs that must just work.

Every case runs the real ``detlaunch`` in a subprocess (through the `launcher` fixture), once as the user
types it and once with ``--debug``, and checks exactly what the user sees.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import socket
from pathlib import Path

import pytest
from detlaunch.rank.output import PIPE_BUF
from support.helpers import free_port
from support.jobs import ROOT, Launcher

pytestmark = pytest.mark.timeout(60)

def installed() -> list[str]:
    """The layers installed now (other test modules install example layers while being collected)."""
    importlib.invalidate_caches()
    return sorted({ep.name for ep in importlib.metadata.entry_points(group="detlaunch.layers")})


def check_one_line_error(launcher: Launcher, args: list[str], expected: str,
                         env: dict[str, str] | None = None) -> None:
    """`args` fail with exit 2 and exactly `expected` on stderr; with --debug, a traceback then that line."""
    r = launcher.run(*args, env=env, timeout=30)
    assert (r.returncode, r.stderr, r.stdout) == (2, f"detlaunch: error: {expected}\n", ""), r.output
    d = launcher.run("--debug", *args, env=env, timeout=30)
    assert d.returncode == 2, d.output
    assert d.stderr.startswith("Traceback (most recent call last):\n"), d.stderr
    assert d.stderr.endswith(f"\ndetlaunch: error: {expected}\n"), d.stderr
    assert d.stdout == ""


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('trained')\n")
    return str(path)


def test_unknown_layer_names_the_installed_layers(launcher: Launcher, script: str) -> None:
    assert {"torchrun", "horovod", "deepspeed"} <= set(installed())
    check_one_line_error(launcher, ["--layer", "nope", script],
                         f"unknown layer 'nope'; installed layers: {', '.join(installed())}")


def test_no_layer(launcher: Launcher, script: str) -> None:
    check_one_line_error(launcher, [script],
                         "no layer chosen: add --layer NAME, before the launcher's own flags "
                         f"(installed: {', '.join(installed())})")


def test_no_layer_when_the_scripts_own_args_ask_for_help(launcher: Launcher, script: str) -> None:
    # `-h` after the script is the script's; it must not hide that no layer was chosen.
    check_one_line_error(launcher, [script, "-h"],
                         "no layer chosen: add --layer NAME, before the launcher's own flags "
                         f"(installed: {', '.join(installed())})")


def test_layer_found_after_an_option_that_takes_a_value(launcher: Launcher, script: str) -> None:
    # `--nproc-per-node 2` before `--layer`: the 2 is the option's value, not the start of the command.
    r = launcher.run("--nproc-per-node", "2", "--layer", "torchrun", "--master-port", str(free_port()),
                     "--dry-run", "--format", "json", script, timeout=30)
    assert r.returncode == 0, r.output
    assert '"layer": "torchrun"' in r.stdout


def test_no_script(launcher: Launcher) -> None:
    check_one_line_error(launcher, ["--layer", "torchrun"],
                         "no command given: detlaunch --layer NAME [OPTIONS] train.py [ARGS...]")


def test_script_not_found(launcher: Launcher) -> None:
    check_one_line_error(launcher, ["--layer", "torchrun", "nothere.py"],
                         f"script not found: nothere.py (relative to {ROOT})")


def test_command_not_on_path(launcher: Launcher) -> None:
    check_one_line_error(launcher, ["--layer", "torchrun", "no-such-command-4711", "--flag"],
                         "command not found: no-such-command-4711 (not on PATH)")


def test_unknown_option_before_the_script(launcher: Launcher, script: str) -> None:
    check_one_line_error(launcher, ["--layer", "torchrun", "--bogus", script],
                         "unknown option --bogus: if it is for the launcher, add -- before the script "
                         "(detlaunch --layer torchrun --bogus ... -- train.py); detlaunch --layer torchrun --help "
                         "lists its options")


def test_option_without_its_value(launcher: Launcher) -> None:
    check_one_line_error(launcher, ["--layer"], "argument --layer: expected one argument (see detlaunch --help)")


SLOTS_HELP = "slots must be a positive integer (e.g. 10.0.0.1:8)"


@pytest.mark.parametrize(("hosts", "expected"), [
    ("h1:x", f"bad --hosts entry 'h1:x': {SLOTS_HELP}"),
    ("h1:0", f"bad --hosts entry 'h1:0': {SLOTS_HELP}"),
    ("h1:", f"bad --hosts entry 'h1:': {SLOTS_HELP}"),
    ("", "--hosts is empty: write host:slots,host:slots (e.g. 10.0.0.1:8,10.0.0.2:8)"),
    ("h1,,h2", "--hosts has an empty entry in 'h1,,h2': remove the extra comma"),
    ("h1:2,h2:2,h1:2", "host h1 appears twice in --hosts: list each node once"),
    ("h1:2,H1:2", "host H1 (the same as h1) appears twice in --hosts: list each node once"),
    ("[nothost]:2", "bad --hosts entry 'nothost': write host:slots, or [ipv6]:slots"),
], ids=["letters", "zero", "no-slots", "empty", "empty-entry", "duplicate", "duplicate-case", "bad-ipv6"])
def test_bad_hosts(launcher: Launcher, script: str, hosts: str, expected: str) -> None:
    check_one_line_error(launcher, ["--layer", "torchrun", "--hosts", hosts, "--node-rank", "0", script], expected)


def test_node_rank_outside_the_host_list(launcher: Launcher, script: str) -> None:
    check_one_line_error(launcher, ["--layer", "torchrun", "--hosts", "h1:2,h2:2", "--node-rank", "2", script],
                         "--node-rank 2 is outside --hosts (2 hosts: valid ranks 0..1)")


def test_node_rank_outside_nnodes(launcher: Launcher, script: str) -> None:
    check_one_line_error(launcher, ["--layer", "torchrun", "--nnodes", "2", "--master-addr", "127.0.0.1",
                                    "--node-rank", "2", script],
                         "--node-rank 2 is outside --nnodes 2 (valid: 0..1)")


def test_hosts_and_nproc_per_node_disagree(launcher: Launcher, script: str) -> None:
    check_one_line_error(launcher, ["--layer", "torchrun", "--hosts", "h1:2,h2:2", "--node-rank", "1",
                                    "--nproc-per-node", "4", script],
                         "--nproc-per-node 4 disagrees with --hosts, which gives this node (h2) 2 slots: "
                         "drop one of them")


def test_hosts_and_master_addr_disagree(launcher: Launcher, script: str) -> None:
    check_one_line_error(launcher, ["--layer", "torchrun", "--hosts", "h1:2,h2:2", "--node-rank", "1",
                                    "--master-addr", "h2", script],
                         "--master-addr h2 disagrees with --hosts, whose first host (the chief) is h1: "
                         "drop --master-addr or list the chief first")


def test_nproc_per_node_zero(launcher: Launcher, script: str) -> None:
    check_one_line_error(launcher, ["--layer", "torchrun", "--nproc-per-node", "0", script],
                         "argument --nproc-per-node: '0' is out of range; valid: 1..4096 (see detlaunch --help)")


def test_two_nodes_without_master_addr(launcher: Launcher, script: str) -> None:
    check_one_line_error(launcher, ["--layer", "torchrun", "--nnodes", "2", "--node-rank", "1", script],
                         "--nnodes > 1 needs the chief's address: --master-addr ADDR")


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("DETLAUNCH_NPROC_PER_NODE", "abc", "DETLAUNCH_NPROC_PER_NODE='abc': 'abc' is not an integer; valid: 1..4096; "
     "fix or unset DETLAUNCH_NPROC_PER_NODE"),
    ("DETLAUNCH_NPROC_PER_NODE", "0", "DETLAUNCH_NPROC_PER_NODE='0': '0' is out of range; valid: 1..4096; "
     "fix or unset DETLAUNCH_NPROC_PER_NODE"),
    ("DETLAUNCH_MASTER_PORT", "70000", "DETLAUNCH_MASTER_PORT='70000': '70000' is out of range; valid: 1..65535; "
     "fix or unset DETLAUNCH_MASTER_PORT"),
    ("DETLAUNCH_GRACE_PERIOD", "-1", "DETLAUNCH_GRACE_PERIOD='-1': '-1' is out of range; valid: 0..3600 s; "
     "fix or unset DETLAUNCH_GRACE_PERIOD"),
    ("DETLAUNCH_DRY_RUN", "maybe", "DETLAUNCH_DRY_RUN='maybe' is not a yes/no value: write 1 or 0; "
     "fix or unset DETLAUNCH_DRY_RUN"),
    ("DETLAUNCH_FORMAT", "xml", "DETLAUNCH_FORMAT='xml': choose one of text, json; fix or unset DETLAUNCH_FORMAT"),
    ("DETLAUNCH_RANKS", "0,x", "DETLAUNCH_RANKS='0,x': 'x' is not an integer; valid: 0..2147483647; "
     "fix or unset DETLAUNCH_RANKS"),
], ids=["nproc-abc", "nproc-0", "port", "grace", "dry-run", "format", "ranks"])
def test_bad_environment_variable_is_named(launcher: Launcher, script: str, name: str, value: str,
                                           expected: str) -> None:
    check_one_line_error(launcher, ["--layer", "torchrun", script], expected, env={name: value})


# name -> (the config file's text, the error that follows "config file PATH"; {layer_sections} is filled in
# when the test runs, since other test modules install example layers while being collected)
CONFIG_CASES = {
    "not-toml": ("[detlaunch\nnproc_per_node = 2\n", " is not valid TOML: "),
    "unknown-key": ("[detlaunch]\nnproc_per_nodes = 2\n", ": unknown option 'nproc_per_nodes' in [detlaunch]"),
    "unknown-layer-key": ("[torchrun]\nmax_restarts = 2\n", ": unknown option 'max_restarts' in [torchrun]"),
    "unknown-section": ("[detlauch]\nnproc_per_node = 2\n",
                        ": unknown section [detlauch]; use [detlaunch], {layer_sections}"),
    "not-a-section": ("nproc_per_node = 2\n", ": 'nproc_per_node' must be a [section]"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_config_file(launcher: Launcher, script: str, tmp_path: Path, case: str) -> None:
    text, expected = CONFIG_CASES[case]
    expected = expected.replace("{layer_sections}", ", ".join(f"[{name}]" for name in installed()))
    path = tmp_path / "detlaunch.toml"
    path.write_text(text)
    args = ["--layer", "torchrun", "--config", str(path), script]
    if case == "not-toml":  # the parser's own words follow; check the start, and the one-line rule
        r = launcher.run(*args, timeout=30)
        assert r.returncode == 2, r.output
        assert r.stderr.startswith(f"detlaunch: error: config file {path}{expected}"), r.stderr
        assert r.stderr.count("\n") == 1 and r.stdout == "", r.output
        return
    check_one_line_error(launcher, args, f"config file {path}{expected}")


def test_config_file_value_is_checked_like_the_flag(launcher: Launcher, script: str, tmp_path: Path) -> None:
    path = tmp_path / "detlaunch.toml"
    path.write_text("[detlaunch]\nnproc_per_node = 0\n")
    check_one_line_error(launcher, ["--layer", "torchrun", "--config", str(path), script],
                         f"[detlaunch] nproc_per_node=0: '0' is out of range; valid: 1..4096; fix it in {path}")


def test_missing_config_file(launcher: Launcher, script: str, tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    check_one_line_error(launcher, ["--layer", "torchrun", "--config", str(path), script],
                         f"config file not found: {path}")
    check_one_line_error(launcher, ["--layer", "torchrun", script], f"config file not found: {path}",
                         env={"DETLAUNCH_CONFIG": str(path)})


def test_master_port_already_in_use(launcher: Launcher, script: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        check_one_line_error(launcher, ["--layer", "torchrun", "--master-port", str(port), script],
                             f"--master-port {port} is already in use on 127.0.0.1: pick a free port with "
                             "--master-port PORT")


def test_unusable_log_dir(launcher: Launcher, script: str, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    log_dir = tmp_path / "a-file" / "logs"
    check_one_line_error(launcher, ["--layer", "torchrun", "--master-port", str(free_port()),
                                    "--log-dir", str(log_dir), script],
                         f"cannot use --log-dir {log_dir}: {tmp_path / 'a-file'} is not a directory; pick another "
                         "--log-dir")
    assert list((launcher.tmpdir).iterdir()) == []  # nothing was started, no run directory


@pytest.mark.parametrize("args", [["--help"], ["--layer", "torchrun", "--help"], ["--layer", "torchrun", "-h"]])
def test_help_exits_0_and_lists_the_options(launcher: Launcher, args: list[str]) -> None:
    r = launcher.run(*args, timeout=30)
    assert (r.returncode, r.stderr) == (0, ""), r.output
    assert r.stdout.startswith("usage: detlaunch --layer NAME [OPTIONS] [LAUNCHER_ARGS... --] COMMAND [ARGS...]\n")
    for option in ("--layer LAYER", "--config FILE", "--dry-run", "--format {text,json}", "--debug",
                   "--nproc-per-node N", "--nnodes N|MIN:MAX", "--node-rank R", "--master-addr ADDR",
                   "--master-port PORT", "--hosts H:S,...", "--hostfile FILE", "--grace-period S",
                   "--log-dir DIR", "--ranks R,R"):
        assert f"\n  {option} " in r.stdout, option
    assert f"Installed layers: {', '.join(installed())}." in " ".join(r.stdout.split())


# -- inputs that must work, not error: real ranks through the torchrun layer ------------------------


def rank_script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "rank.py"
    path.write_text("import os, sys\nrank = int(os.environ['RANK'])\n" + body)
    return str(path)


def run_ranks(launcher: Launcher, script: str, nproc: int = 2,
              env: dict[str, str] | None = None) -> tuple[int, bytes, bytes, str]:
    job = launcher.start("--layer", "torchrun", "--master-port", str(free_port()),
                         "--nproc-per-node", str(nproc), script, env=env)
    r = job.wait(90)
    return r.returncode, job.out_path.read_bytes(), job.err_path.read_bytes(), r.output


def segments(data: bytes, rank: int) -> list[bytes]:
    """Every line of `rank` in the raw output, with its terminator (\\n, \\r or \\r\\n), prefix removed."""
    prefix = f"[rank={rank}] ".encode()
    return [s[len(prefix):] for s in re.findall(rb"[^\r\n]*(?:\r\n|\r|\n)", data) if s.startswith(prefix)]


@pytest.mark.timeout(120)
def test_invalid_utf8_passes_through_unchanged(launcher: Launcher, tmp_path: Path) -> None:
    script = rank_script(tmp_path, "os.write(1, b'bad \\xff\\xfe\\xc3( end\\n')\n"
                                   "os.write(1, b'\\x80\\x81 r%d\\n' % rank)\n")
    code, out, err, text = run_ranks(launcher, script)
    assert code == 0, text
    for rank in (0, 1):
        assert segments(out, rank) == [b"bad \xff\xfe\xc3( end\n", b"\x80\x81 r%d\n" % rank]
    assert re.fullmatch(rb"(\[rank=[01]\] [^\n]*\n)+", out), out
    assert b"detlaunch: job finished: 2 rank(s)" in err and b"rror" not in err, err


@pytest.mark.timeout(120)
def test_a_1mb_line_without_newline_arrives_whole_in_prefixed_pieces(
        launcher: Launcher, tmp_path: Path) -> None:
    script = rank_script(tmp_path, "data = b''.join(b'%d:%07d,' % (rank, i) for i in range(110_000))[:1 << 20]\n"
                                   "os.write(1, data)\n")
    code, out, _, text = run_ranks(launcher, script)
    assert code == 0, text
    lines = out.split(b"\n")
    assert lines.pop() == b""  # the output ends with a line end
    assert all(line.startswith((b"[rank=0] ", b"[rank=1] ")) for line in lines)
    assert all(len(line) + 1 <= PIPE_BUF for line in lines)  # every piece fits one atomic write
    for rank in (0, 1):
        pieces = [line[9:] for line in lines if line.startswith(b"[rank=%d] " % rank)]
        expected = b"".join(b"%d:%07d," % (rank, i) for i in range(110_000))[: 1 << 20]
        assert len(pieces) > (1 << 20) // PIPE_BUF
        assert b"".join(pieces) == expected  # no byte lost, none added, in order


@pytest.mark.timeout(120)
def test_carriage_return_progress_bars_are_prefixed_per_segment(
        launcher: Launcher, tmp_path: Path) -> None:
    script = rank_script(tmp_path, "import time\nfor i in range(5):\n"
                                   "    os.write(2, b'\\rprogress %d/4' % i)\n    time.sleep(0.01)\n"
                                   "os.write(2, b'\\n')\nos.write(1, b'a\\r\\nb\\rc\\n')\n")
    code, out, err, text = run_ranks(launcher, script)
    assert code == 0, text
    for rank in (0, 1):
        assert segments(err, rank) == [b"\r"] + [b"progress %d/4\r" % i for i in range(4)] + [b"progress 4/4\n"]
        assert segments(out, rank) == [b"a\r\n", b"b\r", b"c\n"]


@pytest.mark.timeout(120)
def test_stdout_and_stderr_are_kept_apart(launcher: Launcher, tmp_path: Path) -> None:
    script = rank_script(tmp_path, "for i in range(3):\n"
                                   "    os.write(1, b'out %d of r%d\\n' % (i, rank))\n"
                                   "    os.write(2, b'err %d of r%d\\n' % (i, rank))\n")
    code, out, err, text = run_ranks(launcher, script)
    assert code == 0, text
    for rank in (0, 1):
        assert segments(out, rank) == [b"out %d of r%d\n" % (i, rank) for i in range(3)]
        assert segments(err, rank) == [b"err %d of r%d\n" % (i, rank) for i in range(3)]
    assert b"err " not in out and b"out " not in err


@pytest.mark.timeout(120)
def test_a_long_tmpdir_still_works(launcher: Launcher, tmp_path: Path) -> None:
    # A TMPDIR of ~120 bytes (common under pytest, CI runners, deep home dirs): the supervisor's socket path
    # would not fit AF_UNIX's 108 bytes there, so the run directory must go elsewhere.
    long_tmp = tmp_path / ("t" * 60)
    long_tmp.mkdir()
    script = rank_script(tmp_path, "print('rank', rank, 'ok')\n")
    code, out, err, text = run_ranks(launcher, script, nproc=1, env={"TMPDIR": str(long_tmp)})
    assert (code, out) == (0, b"[rank=0] rank 0 ok\n"), text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [["--dry-run"], ["--dry-run", "--format", "json"]])
def test_a_reader_that_stops_early_ends_it_quietly(real_processes: None, script: str, args: list[str]) -> None:
    """`detlaunch --dry-run | head -1`: the closed pipe is the reader's choice, not a traceback."""
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)  # the reader is gone before detlaunch writes its first line
    done = subprocess.run([sys.executable, "-m", "detlaunch", "--layer", "torchrun", "--nproc-per-node", "2",
                           *args, script], stdout=w, stderr=subprocess.PIPE, timeout=50)
    os.close(w)
    assert done.returncode == 141 and done.stderr == b"", done.stderr.decode()
