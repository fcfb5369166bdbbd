"""Each layer accepts its launcher's own flags (docs/LAUNCHER_FLAGS.md): every row of every table, through
`--dry-run --format json` (in-process: nothing starts), and the tables against the installed launchers' parsers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import detlaunch_deepspeed.flags
import detlaunch_deepspeed.layer
import detlaunch_horovod.flags
import detlaunch_horovod.layer
import detlaunch_torchrun.flags
import detlaunch_torchrun.layer
import pytest
from detlaunch import ConfigError
from detlaunch.cli.main import main
from detlaunch.launcher_flags import LauncherFlag, _FlagAction, check_launcher_args
from detlaunch.planning.config import build_parser
from support.helpers import free_port
from support.jobs import ROOT

pytestmark = pytest.mark.timeout(60)

TABLES = {"torchrun": detlaunch_torchrun.flags.TABLE, "horovod": detlaunch_horovod.flags.TABLE,
          "deepspeed": detlaunch_deepspeed.flags.TABLE}
MODULES = {"torchrun": detlaunch_torchrun.layer, "horovod": detlaunch_horovod.layer,
           "deepspeed": detlaunch_deepspeed.layer}
LAUNCHER = {"torchrun": "torchrun", "horovod": "horovodrun", "deepspeed": "deepspeed"}
DOC = (ROOT / "docs" / "LAUNCHER_FLAGS.md").read_text()
WORD = {"map": "mapped", "pass": "passed", "refuse": "refused", "own": "detlaunch's"}


def rows(does: str) -> list[tuple[str, LauncherFlag]]:
    return [(layer, row) for layer, table in TABLES.items() for row in table if row.does == does]


def row_id(case: tuple[str, LauncherFlag]) -> str:
    return f"{case[0]}:{case[1].names[-1]}"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("raise SystemExit('this script must not run')\n")
    return path


@pytest.fixture
def dry(tmp_path: Path, script: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., tuple[int, Any, str]]]:
    """detlaunch --layer L ARGS --dry-run --format json train.py, in this process: (exit code, plan, stderr)."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    monkeypatch.chdir(tmp_path)

    def run(layer: str, *args: str) -> tuple[int, Any, str]:
        port = [] if any(re.match(r"--master[-_]port", a) for a in args) else ["--master-port", str(free_port())]
        rc = main(["--layer", layer, *port, *args, "--dry-run", "--format", "json", str(script)], env)
        out, err = capsys.readouterr()
        return rc, json.loads(out) if rc == 0 else None, err

    yield run
    assert not list((tmp_path / "cache").glob("**/*")), "a dry run wrote to the job directory"


def launcher_argv(plan: Any) -> list[str]:
    return list(plan["commands"][-1]["argv"])


def contains(argv: list[str], part: list[str]) -> bool:
    return any(argv[i : i + len(part)] == part for i in range(len(argv) - len(part) + 1))


def one_error_line(rc: int, err: str) -> str:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("detlaunch: error: "), err
    return lines[0].removeprefix("detlaunch: error: ")


# -- the tables against the installed launchers ------------------------------------------------------


class _Parser(Exception):
    pass


def grab_parser(parse_args: Callable[..., Any], *args: Any) -> argparse.ArgumentParser:
    """The parser a launcher's parse_args builds, caught when it is about to parse."""
    def fake(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        raise _Parser(self)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = fake  # type: ignore[method-assign]
    try:
        parse_args(*args)
    except _Parser as caught:
        parser = caught.args[0]
        assert isinstance(parser, argparse.ArgumentParser)
        return parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise AssertionError(f"{parse_args} never parsed")


def launcher_parser(layer: str) -> argparse.ArgumentParser:
    if layer == "torchrun":
        from torch.distributed.run import get_args_parser

        return get_args_parser()
    if layer == "horovod":
        import horovod.runner.launch

        return grab_parser(horovod.runner.launch.parse_args)
    import deepspeed.launcher.runner

    return grab_parser(deepspeed.launcher.runner.parse_args, [])


def installed_flags(layer: str) -> list[tuple[list[str], bool]]:
    """Each flag of the installed launcher's parser (its spellings, whether it takes a value), read in a Python of
    its own: importing deepspeed's runner alone takes seconds, which the fast loop must not pay."""
    show = ("import json, sys; sys.path.insert(0, sys.argv[1]); from test_launcher_flags import launcher_parser; "
            "print(json.dumps([[a.option_strings, a.nargs != 0] for a in launcher_parser(sys.argv[2])._actions "
            "if a.option_strings]))")
    r = subprocess.run([sys.executable, "-c", show, str(Path(__file__).parent), layer], capture_output=True,
                       text=True, timeout=110, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]  # the launcher's import may print first (deepspeed's accelerator)
    return [(list(names), bool(value)) for names, value in json.loads(last)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layer", sorted(TABLES))
def test_the_table_has_every_flag_of_the_installed_launcher_and_no_other(layer: str, real_processes: None) -> None:
    table = TABLES[layer]
    flags = installed_flags(layer)
    assert len(flags) > 20
    for names, takes_value in flags:
        matching = [row for row in table if set(row.names) & set(names)]
        assert matching, f"{LAUNCHER[layer]} has {names}: add a row to {layer}'s flags.py " \
                         "and docs/LAUNCHER_FLAGS.md"
        # One row per flag, or one per spelling where detlaunch has one of them (-H maps, --hostfile is its own).
        assert {n for row in matching for n in row.names} == set(names), matching
        for row in matching:
            assert row.value == takes_value, f"{row.names}: takes a value is {takes_value}"
    known = {s for names, _ in flags for s in names}
    not_its_own = detlaunch_horovod.flags.NOT_HOROVODRUNS if layer == "horovod" else ()  # mpirun's -x
    stale = [row.names for row in table if not set(row.names) <= known and row.names[0] not in not_its_own]
    assert not stale, f"{LAUNCHER[layer]} no longer has {stale}"


def doc_line(row: LauncherFlag) -> str:
    """The row's line in docs/LAUNCHER_FLAGS.md: its names, what detlaunch does, and how (or why not)."""
    how = row.why if row.does == "refuse" else row.doc
    if row.does == "pass" and how == "passed to the launcher":
        how = "handed to the launcher as typed"
    return f"| {', '.join(f'`{n}`' for n in row.names)} | {WORD[row.does]} | {how} |"


def doc_section(doc: str, layer: str) -> str:
    return doc.split(f"## {LAUNCHER[layer]} (`--layer {layer}`)")[1].split("\n## ")[0]


def doc_rows(doc: str, layer: str) -> list[str]:
    return [line for line in doc_section(doc, layer).splitlines() if line.startswith("| `")]


def write_doc_tables() -> None:
    """`python tests/planning/test_launcher_flags.py` rewrites the doc's tables from plugins/*/flags.py."""
    doc = DOC
    for layer, table in TABLES.items():
        section = doc_section(doc, layer)
        old = "\n".join(doc_rows(doc, layer))
        doc = doc.replace(section, section.replace(old, "\n".join(doc_line(row) for row in table)), 1)
    (ROOT / "docs" / "LAUNCHER_FLAGS.md").write_text(doc)


@pytest.mark.parametrize("layer", sorted(TABLES))
def test_the_docs_table_is_the_layers_table_line_for_line(layer: str) -> None:
    """Every column of every row, in the table's order: the doc cannot drift from what the code does."""
    want = [doc_line(row) for row in TABLES[layer]]
    have = doc_rows(DOC, layer)
    wrong = [f"doc:  {h}\ncode: {w}" for h, w in zip(have, want, strict=False) if h != w]
    assert have == want, ("docs/LAUNCHER_FLAGS.md differs from the table in flags.py "
                          "(python tests/planning/test_launcher_flags.py rewrites it):\n" + "\n".join(wrong)
                          + f"\n{len(have)} rows in the doc, {len(want)} in the code")


# -- every row, through the real command line ------------------------------------------------------------


@pytest.mark.parametrize("case", rows("pass"), ids=row_id)
def test_a_launcher_only_flag_reaches_the_launcher_as_typed(case: tuple[str, LauncherFlag], dry: Any) -> None:
    layer, row = case
    first, last = row.names[0], row.spellings[-1]
    given = [[first, "x1"], [f"{last}=x2"]] if row.value else [[first], [last]]
    expected = [[first, "x1"], [last, "x2"]] if row.value else [[first], [last]]
    for args, want in zip(given, expected, strict=True):
        rc, plan, err = dry(layer, *args)
        assert rc == 0, err
        assert contains(launcher_argv(plan), want), (want, launcher_argv(plan))


@pytest.mark.parametrize("case", rows("refuse"), ids=row_id)
def test_a_flag_detlaunch_cannot_honour_is_one_line_saying_why(case: tuple[str, LauncherFlag], dry: Any) -> None:
    layer, row = case
    for spelling in (row.names[0], row.spellings[-1]):
        rc, _, err = dry(layer, *([spelling, "x"] if row.value else [spelling]))
        typed = f"{spelling}=x" if row.value else spelling
        assert one_error_line(rc, err) == f"{typed}: {row.why}"


@pytest.mark.parametrize("case", rows("own"), ids=row_id)
def test_a_flag_of_detlaunchs_own_spelling_is_detlaunchs(case: tuple[str, LauncherFlag]) -> None:
    layer, row = case
    parser = build_parser()
    MODULES[layer].detlaunch_add_options(parser)
    for spelling in row.names:
        action = parser._option_string_actions.get(spelling)
        assert action is not None and not isinstance(action, _FlagAction), spelling


def test_the_max_restarts_row_follows_detlaunchs_own_option() -> None:
    """Refused while detlaunch has no max_restarts option (issue 13), mapped onto it once it has."""
    [row] = [r for r in TABLES["torchrun"] if "--max-restarts" in r.names]
    assert row.dest == "max_restarts"
    parser = build_parser()
    MODULES["torchrun"].detlaunch_add_options(parser)
    action = parser._option_string_actions["--max_restarts"]
    has_dest = any(a.dest == "max_restarts" for a in build_parser()._actions)
    assert isinstance(action, _FlagAction) and bool(action.refuse_why) is not has_dest
    assert has_dest  # issue 13 landed: detlaunch restarts the whole job, and torchrun's spelling maps onto it
    assert not action.refuse_why


def _wrapper(plan: Any) -> list[str]:
    return list(plan["rank_wrapper"])


def _log_dir(plan: Any) -> str:
    argv = _wrapper(plan)
    return argv[argv.index("--log-dir") + 1]


# (layer, first name of the row) -> [(args, what the plan must show, or the start of the error line)]
MAPPED: dict[tuple[str, str], list[tuple[list[str], Callable[[Any], bool] | str]]] = {
    ("torchrun", "--nnodes"): [
        (["--nnodes=1:2", "--master_addr", "127.0.0.1", "--max-restarts", "1"],
         lambda p: p["cluster"]["slots"] == [1, 1] and p["supervisor"]["min_nodes"] == 1),
        (["--nnodes", "2", "--master_addr", "127.0.0.1", "--node_rank", "0"],
         lambda p: p["cluster"]["slots"] == [1, 1])],
    ("torchrun", "--nproc-per-node"): [
        (["--nproc_per_node=2"], lambda p: p["cluster"]["slots"] == [2]),
        (["--nproc-per-node", "2"], lambda p: contains(launcher_argv(p), ["--nproc-per-node", "2"])),
        (["--nproc_per_node", "auto"], "--nproc-per-node=auto: detlaunch counts the visible GPUs itself"),
        (["--nproc-per-node", "1", "--nproc_per_node=2"], "--nproc_per_node=2 contradicts --nproc-per-node 1")],
    ("torchrun", "--standalone"): [
        (["--standalone"], lambda p: p["cluster"]["slots"] == [1] and "--standalone" not in launcher_argv(p))],
    ("torchrun", "--max-restarts"): [
        (["--max_restarts=3"], lambda p: p["restarts"]["max_restarts"] == 3)],
    ("torchrun", "--log-dir"): [
        (["--log_dir", "logs"], lambda p: contains(_wrapper(p), ["--log-dir", os.path.abspath("logs")]))],
    ("torchrun", "-r"): [
        (["-r", "3", "--log_dir", "logs"], lambda p: contains(_wrapper(p), ["--console-ranks", "-1"])),
        (["--redirects=3"], lambda p: contains(_wrapper(p), ["--console-ranks", "-1"])
         and "/detlaunch/logs/" in _log_dir(p)),
        (["--redirects", "0:3,1:0", "--log-dir", "logs"], "--redirects 0:3,1:0: detlaunch applies one setting"),
        (["--redirects", "0"], lambda p: "--console-ranks" not in _wrapper(p)),
        # Both: torchrun redirects to the files and tails the tee'd ones to the console: files and console.
        (["--tee", "3", "-r", "3", "--log-dir", "logs"],
         lambda p: contains(_wrapper(p), ["--log-dir", os.path.abspath("logs")])
         and "--console-ranks" not in _wrapper(p)),
        (["--redirects=3", "--tee=0", "--log-dir", "logs"],
         lambda p: contains(_wrapper(p), ["--console-ranks", "-1"])),
        (["--tee", "3", "-r", "3", "--local-ranks-filter", "1", "--nproc-per-node", "2", "--log-dir", "logs"],
         lambda p: contains(_wrapper(p), ["--console-ranks", "1"]))],
    ("torchrun", "-t"): [
        (["-t", "3", "--log-dir", "logs"],
         lambda p: contains(_wrapper(p), ["--log-dir", os.path.abspath("logs")])
         and "--console-ranks" not in _wrapper(p)),
        (["--tee", "1", "--log-dir", "logs"], "--tee 1: detlaunch writes each rank's output to DIR/rank-N.log"),
        (["--tee", "3", "--redirects", "3"], lambda p: "--console-ranks" not in _wrapper(p) and "logs" in _log_dir(p))],
    ("torchrun", "-m"): [
        (["-m"], "--module: '/"),  # the fixture's command is a script's path
        (["-m", "--no_python"], "--module runs COMMAND under Python and --no-python runs it without")],
    ("torchrun", "--no-python"): [
        (["--no_python"], "command not found or not executable: /"),  # the fixture's script is not executable
        (["--no-python"], "command not found or not executable: /")],
    ("torchrun", "--run-path"): [(["--run_path"], lambda p: p["command"][-1].endswith("train.py"))],
    ("deepspeed", "--no_python"): [(["--no_python"], "command not found or not executable: /")],
    ("torchrun", "--local-ranks-filter"): [
        (["--local_ranks_filter=0", "--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
          "--node-rank", "0"], lambda p: contains(_wrapper(p), ["--console-ranks", "0,2"])),
        (["--local-ranks-filter", "1", "--nproc-per-node", "2"],
         lambda p: contains(_wrapper(p), ["--console-ranks", "1"])),
        (["--local-ranks-filter", "0", "--nnodes", "2", "--master-addr", "127.0.0.1", "--node-rank", "0"],
         "--local-ranks-filter 0 on 2 nodes needs --nproc-per-node N")],
    ("torchrun", "--node-rank"): [
        (["--node_rank=1", "--nnodes", "2", "--master_addr", "127.0.0.1", "--local_addr", "127.0.0.2"],
         lambda p: p["role"] == "worker" and contains(launcher_argv(p), ["--local-addr", "127.0.0.2"]))],
    ("torchrun", "--master-addr"): [
        (["--master_addr=127.0.0.3"], lambda p: p["cluster"]["chief_addr"] == "127.0.0.3"
         and contains(launcher_argv(p), ["--master-addr", "127.0.0.3"]))],
    ("torchrun", "--master-port"): [
        (["--master_port", "29811"], lambda p: contains(launcher_argv(p), ["--master-port", "29811"]))],
    ("torchrun", "--local-addr"): [
        (["--nnodes", "2", "--master_addr", "127.0.0.1", "--node-rank", "1", "--local-addr=127.0.0.2"],
         lambda p: p["cluster"]["node_addrs"] == ["127.0.0.1", "127.0.0.2"])],
    ("torchrun", "--shutdown-timeout"): [
        (["--shutdown_timeout=7"], lambda p: p["supervisor"]["grace_period"] == 7.0)],
    ("horovod", "-np"): [
        (["-np", "2"], lambda p: p["cluster"]["slots"] == [2] and contains(launcher_argv(p), ["-np", "2"])),
        (["-np", "2", "-H", "localhost:2"], lambda p: p["cluster"]["slots"] == [2]),
        (["--num-proc=3", "-H", "localhost:2"], "-np 3 but -H localhost:2 gives 2 slots")],
    ("horovod", "--network-interfaces"): [
        (["--network-interfaces", "lo", "-H", "127.0.0.1:1,127.0.0.2:1", "--node-rank", "0"],
         lambda p: contains(launcher_argv(p), ["--network-interface", "lo"]))],
    ("horovod", "--verbose"): [(["--verbose"], lambda p: "--verbose" in launcher_argv(p))],
    ("horovod", "-p"): [(["-p", "12999"], lambda p: contains(launcher_argv(p), ["-p", "12999"]))],
    ("horovod", "--gloo-timeout-seconds"): [
        (["--gloo-timeout-seconds", "99"], lambda p: contains(launcher_argv(p), ["--gloo-timeout-seconds", "99"]))],
    ("horovod", "-H"): [(["-H", "localhost:2"], lambda p: p["cluster"]["slots"] == [2])],
    ("horovod", "-hostfile"): [(["-hostfile", "hosts"], lambda p: p["cluster"]["slots"] == [2])],
    ("horovod", "--gloo"): [(["--gloo"], lambda p: launcher_argv(p).count("--gloo") == 1)],
    ("horovod", "--mpi"): [(["--mpi"], "horovod was built without MPI support")],
    ("horovod", "-x"): [  # the fixture's environment is this test's: HOME is set
        (["-x", "DL_A=a 'b' $c", "-x", "HOME", "-x", "DL_A=2"],
         lambda p: p["env"]["DL_A"] == "2" and p["env"]["HOME"] == os.environ["HOME"]),
        (["-x", "DL_NOT_SET_ANYWHERE"], "-x DL_NOT_SET_ANYWHERE: DL_NOT_SET_ANYWHERE is not set here"),
        (["-x", "A-B=1"], "-x A-B=1: give -x NAME or -x NAME=VALUE")],
    ("deepspeed", "-H"): [
        (["-H", "hosts2", "--node_rank", "0", "--ssh_port", "12777"],
         lambda p: p["cluster"]["node_addrs"] == ["127.0.0.1", "127.0.0.2"]
         and "-p 12777" in p["commands"][-1]["env"]["PDSH_SSH_ARGS_APPEND"])],
    ("deepspeed", "-i"): [
        (["--include", "localhost:0,1"], lambda p: contains(launcher_argv(p), ["--num_gpus", "2"])
         and p["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"),
        (["-i", "localhost:1"], lambda p: p["cluster"]["slots"] == [1] and p["env"]["CUDA_VISIBLE_DEVICES"] == "1"),
        # Hosts left out are not nodes; a host's devices listed are its ranks, named in CUDA_VISIBLE_DEVICES.
        (["--hostfile", "hosts3", "--include", "127.0.0.1:1,3@127.0.0.3", "--node_rank", "1"],
         lambda p: p["cluster"]["node_addrs"] == ["127.0.0.1", "127.0.0.3"] and p["cluster"]["slots"] == [2, 4]
         and p["role"] == "worker" and "CUDA_VISIBLE_DEVICES" not in p["env"]),
        (["-H", "hosts3", "-i", "127.0.0.1:1,3@127.0.0.3", "--node_rank", "0"],
         lambda p: p["env"]["CUDA_VISIBLE_DEVICES"] == "1,3"
         and p["cluster"]["slots"] == [2, 4]),
        (["--hostfile", "hosts3", "--include", "127.0.0.9"], "--include 127.0.0.9: 127.0.0.9 is not a host of "
         "--hostfile (127.0.0.1, 127.0.0.2, 127.0.0.3)"),
        (["--hostfile", "hosts3", "--include", "127.0.0.2:2"], "--include 127.0.0.2:2: 127.0.0.2 has no device 2"),
        (["--include", "h1:0,1@h2"], "--include h1:0,1@h2: h1 is not a host of the job: without --hostfile"),
        (["--include", "localhost:0", "--num_gpus", "1"], "--include picks the hosts and devices, --num_nodes and"),
        (["-i", "localhost:0", "-e", "localhost:1"], "--include and --exclude exclude each other")],
    ("deepspeed", "-e"): [
        (["--hostfile", "hosts3", "--exclude", "127.0.0.2@127.0.0.3:0", "--node_rank", "1"],
         lambda p: p["cluster"]["node_addrs"] == ["127.0.0.1", "127.0.0.3"] and p["cluster"]["slots"] == [4, 3]
         and p["env"]["CUDA_VISIBLE_DEVICES"] == "1,2,3"),
        (["--hosts", "127.0.0.1:2,127.0.0.2:2", "-e", "127.0.0.1:0", "--node_rank", "0"],
         lambda p: p["cluster"]["slots"] == [1, 2] and p["env"]["CUDA_VISIBLE_DEVICES"] == "1"),
        (["--exclude", "localhost:1"], "--exclude localhost:1: without --hostfile or --hosts, detlaunch counts"),
        (["-H", "hosts3", "--exclude", "127.0.0.1@127.0.0.2@127.0.0.3"], "--exclude 127.0.0.1@127.0.0.2@127.0.0.3 "
         "leaves no device of --hostfile to run on")],
    ("deepspeed", "--num_nodes"): [
        (["--num_nodes", "2", "--master_addr", "127.0.0.1", "--node_rank", "1", "--node-addr", "127.0.0.2"],
         lambda p: p["role"] == "worker" and p["cluster"]["node_rank"] == 1),
        (["--hostfile", "hosts3", "--num_nodes", "2", "--node_rank", "1"],  # deepspeed: the first N hosts
         lambda p: p["cluster"]["node_addrs"] == ["127.0.0.1", "127.0.0.2"] and p["cluster"]["slots"] == [4, 2])],
    ("deepspeed", "--num_gpus"): [
        (["--num_gpus", "2"], lambda p: contains(launcher_argv(p), ["--num_gpus", "2"])),
        (["--num_accelerators=2"], lambda p: p["cluster"]["slots"] == [2]),
        (["-H", "hosts3", "--num_gpus", "1", "--num_nodes", "2", "--node_rank", "0"],  # devices 0..N-1 of each host
         lambda p: p["cluster"]["slots"] == [1, 1] and p["env"]["CUDA_VISIBLE_DEVICES"] == "0")],
    ("deepspeed", "--master_port"): [
        (["--master_port", "29812"], lambda p: contains(launcher_argv(p), ["--master_port", "29812"]))],
    ("deepspeed", "--master_addr"): [
        (["--master_addr", "127.0.0.3"], lambda p: contains(launcher_argv(p), ["--master_addr", "127.0.0.3"])
         and "127.0.0.3" in launcher_argv(p)[launcher_argv(p).index("--master_port") + 2 :])],
    ("deepspeed", "--node_rank"): [
        (["--num_nodes", "2", "--master_addr", "127.0.0.1", "--node_rank", "1", "--node-addr", "127.0.0.2"],
         lambda p: p["cluster"]["node_rank"] == 1)],
    ("deepspeed", "--launcher"): [
        (["--launcher", "pdsh"], lambda p: "--launcher" not in launcher_argv(p)),
        (["--launcher=slurm"], "--launcher slurm: detlaunch's deepspeed layer starts the ranks")],
    ("deepspeed", "--no_local_rank"): [
        (["--no_local_rank"], lambda p: "--no_local_rank" in launcher_argv(p)),
        ([], lambda p: "--no_local_rank" not in launcher_argv(p))],
    ("deepspeed", "--enable_each_rank_log"): [
        (["--enable_each_rank_log", "logs"], lambda p: contains(_wrapper(p), ["--log-dir", os.path.abspath("logs")]))],
    ("deepspeed", "--ssh_port"): [
        (["-H", "hosts2", "--node_rank", "0", "--ssh_port", "12778"],
         lambda p: "-p 12778" in p["commands"][-1]["env"]["PDSH_SSH_ARGS_APPEND"])],
}


def test_every_mapped_row_has_cases() -> None:
    assert {(layer, row.names[0]) for layer, row in rows("map")} == set(MAPPED)


@pytest.mark.parametrize("key", sorted(MAPPED), ids=lambda k: f"{k[0]}:{k[1]}")
def test_a_mapped_flag_sets_detlaunchs_option(key: tuple[str, str], dry: Any, tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("localhost slots=2\n")
    (tmp_path / "hosts2").write_text("127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
    (tmp_path / "hosts3").write_text("127.0.0.1 slots=4\n127.0.0.2 slots=2\n127.0.0.3 slots=4\n")
    layer, _ = key
    for args, expect in MAPPED[key]:
        rc, plan, err = dry(layer, *args)
        if isinstance(expect, str):
            assert one_error_line(rc, err).startswith(expect), (args, err)
        else:
            assert rc == 0, (args, err)
            assert expect(plan), (args, json.dumps(plan, indent=1)[:3000])


def test_torchruns_ways_to_name_the_script_run_as_torchrun_runs_them(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """-m MODULE, --no-python, --redirects 3 alone: what torchrun's tutorials type (issue 29)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "run.sh").chmod(0o755)

    def plan(layer: str, *args: str) -> tuple[Any, list[str]]:
        rc = main(["--layer", layer, "--master-port", str(free_port()), "--dry-run", "--format", "json", *args],
                  dict(os.environ))
        out, err = capsys.readouterr()
        assert rc == 0, err
        return json.loads(out), err.splitlines()

    assert plan("torchrun", "-m", "pkg.train", "--lr", "1")[0]["command"] == [
        sys.executable, "-u", "-m", "pkg.train", "--lr", "1"]
    assert plan("deepspeed", "--module", "pkg.train")[0]["command"][1:] == ["-u", "-m", "pkg.train"]
    assert plan("torchrun", "--no_python", "./run.sh", "a")[0]["command"] == ["./run.sh", "a"]
    (tmp_path / "x.py").write_text("#!/bin/sh\n")
    (tmp_path / "x.py").chmod(0o755)
    assert plan("deepspeed", "--no_python", "./x.py")[0]["command"] == ["./x.py"]
    shown, err = plan("torchrun", "--redirects", "3", "x.py")
    logs = _log_dir(shown)
    assert logs.startswith(str(tmp_path / "cache" / "detlaunch" / "logs")) and not os.path.exists(logs)
    assert err == [f"detlaunch: --redirects 3 without --log-dir: each rank's output goes to {logs}/rank-N.log"]


# -- planning: a flag that would contradict the plan never reaches the launcher ---------------------------


@pytest.mark.parametrize(("layer", "args"), [
    ("torchrun", ["--nproc_per_node=2"]), ("torchrun", ["--nproc", "2"]), ("torchrun", ["--nnodes=2"]),
    ("horovod", ["-np", "2", "-H", "localhost:2"]), ("horovod", ["--num-p", "2"]),
    ("deepspeed", ["--num_gpus", "2"]), ("deepspeed", ["--num_g", "2"]),
])
def test_a_launcher_argument_that_detlaunch_plans_is_refused_while_planning(layer: str, args: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"would reach .* contradict detlaunch's plan|elastic"):
        check_launcher_args(TABLES[layer], args, LAUNCHER[layer])


@pytest.mark.parametrize(("layer", "args", "start"), [
    ("torchrun", ["--nproc", "2"], "--nproc would reach torchrun and contradict detlaunch's plan"),
    ("horovod", ["--num-p", "2"], "--num-p would reach horovodrun and contradict detlaunch's plan"),
    ("deepspeed", ["--num_g", "2"], "--num_g would reach deepspeed and contradict detlaunch's plan"),
])
def test_an_abbreviation_before_the_separator_is_refused_not_handed_on(layer: str, args: list[str], start: str,
                                                                       tmp_path: Path, script: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    rc = main(["--layer", layer, "--master-port", str(free_port()), "--dry-run", *args, "--", str(script)], env)
    assert one_error_line(rc, capsys.readouterr().err).startswith(start)


def test_launcher_only_flags_before_the_separator_still_pass() -> None:
    check_launcher_args(TABLES["torchrun"], ["--rdzv-backend", "c10d", "--monitor_interval=1"], "torchrun")
    check_launcher_args(TABLES["horovod"], ["--tcp", "--log-level", "INFO"], "horovodrun")


# -- unknown options name the fix ----------------------------------------------------------------


def test_an_unknown_option_says_to_add_the_separator(dry: Any) -> None:
    rc, _, err = dry("torchrun", "--not-a-flag", "3")
    assert one_error_line(rc, err) == (
        "unknown option --not-a-flag: if it is for the launcher, add -- before the script "
        "(detlaunch --layer torchrun --not-a-flag ... -- train.py); "
        "detlaunch --layer torchrun --help lists its options")


RANKS_PER_NODE = "for the ranks per node, give --nproc-per-node N"


@pytest.mark.parametrize(("layer", "args", "line"), [
    ("deepspeed", ["-np", "2"], f"unknown option -np: {RANKS_PER_NODE} (or deepspeed's own --num_gpus N); "
     "-np is horovodrun's spelling"),
    ("torchrun", ["--num_gpus", "2"], f"unknown option --num_gpus: {RANKS_PER_NODE}; --num_gpus is deepspeed's "
     "spelling"),
    ("direct", ["-np", "2"], f"unknown option -np: {RANKS_PER_NODE}; -np is horovodrun's spelling"),
    ("horovod", ["--num_gpus", "2"], f"unknown option --num_gpus: {RANKS_PER_NODE}; --num_gpus is deepspeed's "
     "spelling"),
])
def test_another_launchers_flag_names_what_this_layer_takes(dry: Any, layer: str, args: list[str],
                                                            line: str) -> None:
    """Not `add -- before the script`: the layer's launcher has no such flag either and would refuse it."""
    rc, _, err = dry(layer, *args)
    assert one_error_line(rc, err) == line


def test_another_launchers_flag_before_the_separator_is_refused_while_planning(
        tmp_path: Path, script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    rc = main(["--layer", "deepspeed", "--master-port", str(free_port()), "--dry-run", "-np", "2", "--", str(script)],
              env)
    assert one_error_line(rc, capsys.readouterr().err) == (
        f"-np: {RANKS_PER_NODE} (or deepspeed's own --num_gpus N); -np is horovodrun's spelling")


def test_a_near_miss_names_detlaunchs_spelling(dry: Any) -> None:
    rc, _, err = dry("horovod", "--fusion_threshold_mbb", "3")
    assert one_error_line(rc, err) == "unknown option --fusion_threshold_mbb: did you mean --fusion-threshold-mb?"
    rc, _, err = dry("torchrun", "--grace_period=3x")
    assert one_error_line(rc, err) == "unknown option --grace_period=3x: did you mean --grace-period?"


def test_a_launcher_flag_after_the_separator_is_not_taken_for_the_command(tmp_path: Path, script: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    rc = main(["--layer", "torchrun", "--dry-run", "--", "--nproc_per_node=2", str(script)], env)
    assert one_error_line(rc, capsys.readouterr().err) == (
        "--nproc_per_node=2 is not a command: give detlaunch's and the launcher's flags before `--` and the command "
        "after it (detlaunch --layer NAME [FLAGS] -- train.py [ARGS])")


def test_a_layer_given_after_a_launcher_flag_with_a_value_is_one_line_saying_where_it_goes(
        tmp_path: Path, script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """detlaunch reads --layer before it knows the layer's flags: `-np 2` hides what follows it."""
    rc = main(["-np", "2", "--layer", "horovod", "--dry-run", str(script)], {**os.environ, "TMPDIR": str(tmp_path)})
    assert one_error_line(rc, capsys.readouterr().err).startswith(
        "no layer chosen: add --layer NAME, before the launcher's own flags (installed: ")


if __name__ == "__main__":
    write_doc_tables()
