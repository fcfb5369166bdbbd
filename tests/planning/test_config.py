"""Options: precedence (flag > DETLAUNCH_* > config file > default), `--` handling, resolve_command."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from detlaunch.cli.main import main
from detlaunch.errors import ConfigError
from detlaunch.planning.config import (
    apply_defaults,
    build_parser,
    check_sections,
    parse,
    read_config_file,
    resolve_command,
)
from support.helpers import free_port

pytestmark = pytest.mark.timeout(30)


def parse_options(
    argv: list[str],
    env: dict[str, str] | None = None,
    sections: dict[str, dict[str, Any]] | None = None,
    with_layer_option: bool = False,
) -> tuple[dict[str, Any], list[str], list[str]]:
    """Parse as the CLI does; optionally with the option a layer named "demo" adds through its hook."""
    parser = build_parser(["demo"])
    core = {a.dest for a in parser._actions}
    if with_layer_option:
        parser.add_argument_group("demo").add_argument("--fusion-threshold-mb", type=int, default=16)
    layer_dests = {"demo": {a.dest for a in parser._actions} - core}
    apply_defaults(parser, env or {}, sections or {}, layer_dests, "detlaunch.toml")
    ns, launcher_args, command = parse(parser, argv, env or {})
    return vars(ns), launcher_args, command


# -- precedence -----------------------------------------------------------------------------------


def test_defaults() -> None:
    o, launcher_args, command = parse_options(["train.py"])
    assert (o["nproc_per_node"], o["master_port"], o["grace_period"], o["start_timeout"]) == (None, 29500, 30.0, 300.0)
    assert (o["dry_run"], o["format"], o["ranks"], o["log_dir"]) == (False, "text", None, None)
    assert (launcher_args, command) == ([], ["train.py"])


@pytest.mark.parametrize(("flag", "env", "file", "expected"), [
    (None, None, None, 30.0),
    (None, None, 7, 7.0),
    (None, "8", 7, 8.0),
    ("9", "8", 7, 9.0),
    ("9", None, 7, 9.0),
    ("9", "8", None, 9.0),
])
def test_core_option_precedence(flag: str | None, env: str | None, file: int | None, expected: float) -> None:
    argv = (["--grace-period", flag] if flag else []) + ["train.py"]
    o, _, _ = parse_options(argv, env={"DETLAUNCH_GRACE_PERIOD": env} if env else {},
                            sections={"detlaunch": {"grace_period": file}} if file is not None else {})
    assert o["grace_period"] == expected


@pytest.mark.parametrize(("argv", "env", "file", "expected"), [
    ([], {}, {}, None),
    (["--link-port", "7001"], {}, {}, 7001),
    (["--control-port", "7002"], {}, {}, 7002),  # --link-port's old name
    ([], {"DETLAUNCH_LINK_PORT": "7003"}, {}, 7003),
    ([], {"DETLAUNCH_CONTROL_PORT": "7004"}, {}, 7004),
    ([], {"DETLAUNCH_CONTROL_PORT": "7004", "DETLAUNCH_LINK_PORT": "7003"}, {}, 7003),  # the new name wins
    ([], {}, {"link-port": 7005}, 7005),
    ([], {}, {"control_port": 7006}, 7006),
    (["--link-port", "7001"], {"DETLAUNCH_CONTROL_PORT": "7004"}, {"control_port": 7006}, 7001),
])
def test_the_link_port_under_its_name_and_its_old_one(argv: list[str], env: dict[str, str], file: dict[str, int],
                                                      expected: int | None) -> None:
    o, _, _ = parse_options([*argv, "train.py"], env=env, sections={"detlaunch": file} if file else {})
    assert o["link_port"] == expected and "control_port" not in o


@pytest.mark.parametrize(("flag", "env", "file", "expected"), [
    (None, None, None, 16),
    (None, None, 32, 32),
    (None, "64", 32, 64),
    ("128", "64", 32, 128),
])
def test_layer_option_precedence(flag: str | None, env: str | None, file: int | None, expected: int) -> None:
    argv = (["--fusion-threshold-mb", flag] if flag else []) + ["train.py"]
    o, _, _ = parse_options(argv, env={"DETLAUNCH_FUSION_THRESHOLD_MB": env} if env else {},
                            sections={"demo": {"fusion_threshold_mb": file}} if file is not None else {},
                            with_layer_option=True)
    assert o["fusion_threshold_mb"] == expected


def test_config_file_keys_may_use_dashes_and_lists() -> None:
    o, _, _ = parse_options(["train.py"], sections={"detlaunch": {"nproc-per-node": 3, "ranks": [0, 2],
                                                                  "dry_run": True, "log_dir": "logs"}})
    assert (o["nproc_per_node"], o["ranks"], o["dry_run"], o["log_dir"]) == (3, (0, 2), True, "logs")


def test_flags_from_the_environment() -> None:
    env = {"DETLAUNCH_DRY_RUN": "yes", "DETLAUNCH_RANKS": "1,3", "DETLAUNCH_FORMAT": "json",
           "DETLAUNCH_HOSTS": "a:1,b:2", "DETLAUNCH_NPROC_PER_NODE": "4"}
    o, _, _ = parse_options(["train.py"], env=env)
    assert (o["dry_run"], o["ranks"], o["format"], o["hosts"], o["nproc_per_node"]) == (True, (1, 3), "json",
                                                                                        "a:1,b:2", 4)
    o, _, _ = parse_options(["train.py"], env={"DETLAUNCH_DRY_RUN": "0"}, sections={"detlaunch": {"dry_run": True}})
    assert o["dry_run"] is False


def test_an_empty_environment_variable_counts_as_unset() -> None:
    o, _, _ = parse_options(["train.py"], env={"DETLAUNCH_NPROC_PER_NODE": "", "DETLAUNCH_GRACE_PERIOD": ""},
                            sections={"detlaunch": {"grace_period": 7}})
    assert (o["nproc_per_node"], o["grace_period"]) == (None, 7.0)


@pytest.mark.parametrize(("sections", "message"), [
    ({"detlaunch": {"nproc_per_node": 0}},
     "[detlaunch] nproc_per_node=0: '0' is out of range; valid: 1..4096; fix it in detlaunch.toml"),
    ({"detlaunch": {"master_port": 70000}},
     "[detlaunch] master_port=70000: '70000' is out of range; valid: 1..65535; fix it in detlaunch.toml"),
    ({"detlaunch": {"grace_period": True}},
     "[detlaunch] grace_period=True: write a single value (a string or a number); fix it in detlaunch.toml"),
    ({"detlaunch": {"format": "xml"}},
     "[detlaunch] format='xml': choose one of text, json; fix it in detlaunch.toml"),
    ({"detlaunch": {"dry_run": "perhaps"}},
     "[detlaunch] dry_run='perhaps' is not a yes/no value: write 1 or 0; fix it in detlaunch.toml"),
    ({"detlaunch": {"bogus": 1}}, "config file detlaunch.toml: unknown option 'bogus' in [detlaunch]"),
    ({"detlaunch": {"fusion_threshold_mb": 1}},  # a layer's option belongs in the layer's section
     "config file detlaunch.toml: unknown option 'fusion_threshold_mb' in [detlaunch]"),
    ({"demo": {"grace_period": 1}},  # and a core option in [detlaunch]
     "config file detlaunch.toml: unknown option 'grace_period' in [demo]"),
])
def test_bad_config_values(sections: dict[str, dict[str, Any]], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_options(["train.py"], sections=sections, with_layer_option=True)
    assert str(e.value) == message


def test_a_section_for_another_installed_layer_is_ignored() -> None:
    o, _, _ = parse_options(["train.py"], sections={"horovod": {"fusion_threshold_mb": 1}, "detlaunch": {}},
                            with_layer_option=True)
    assert o["fusion_threshold_mb"] == 16  # the chosen layer's default, not [horovod]'s 1


def test_read_config_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[detlaunch]\nnproc_per_node = 2  # two\n\n[torchrun]\n")
    assert read_config_file(str(path)) == {"detlaunch": {"nproc_per_node": 2}, "torchrun": {}}
    assert read_config_file(None) == {}
    with pytest.raises(ConfigError, match=r"^config file not found: .*missing\.toml$"):
        read_config_file(str(tmp_path / "missing.toml"))
    path.write_text("[detlaunch]\nnproc_per_node = \n")
    with pytest.raises(ConfigError, match=r"^config file .*c\.toml is not valid TOML: "):
        read_config_file(str(path))
    path.write_text("layer = 'torchrun'\n")
    with pytest.raises(ConfigError, match=r"^config file .*c\.toml: 'layer' must be a \[section\]$"):
        read_config_file(str(path))


def test_check_sections() -> None:
    check_sections({"detlaunch": {}, "torchrun": {}}, ["horovod", "torchrun"], "c.toml")
    with pytest.raises(ConfigError) as e:
        check_sections({"torchrunn": {}}, ["horovod", "torchrun"], "c.toml")
    assert str(e.value) == "config file c.toml: unknown section [torchrunn]; use [detlaunch], [horovod], [torchrun]"


# -- `--` handling ----------------------------------------------------------------------------------


def test_without_separator_the_first_non_option_starts_the_command() -> None:
    o, launcher_args, command = parse_options(
        ["--nproc-per-node", "2", "train.py", "--nproc-per-node", "5", "--lr", "0.1", "--", "x"])
    assert o["nproc_per_node"] == 2
    assert launcher_args == []
    assert command == ["train.py", "--nproc-per-node", "5", "--lr", "0.1", "--", "x"]


def test_launcher_args_go_before_the_separator() -> None:
    o, launcher_args, command = parse_options(
        ["--rdzv-backend", "c10d", "--nproc-per-node", "2", "--monitor-interval", "3", "--", "train.py", "--layer",
         "x"])
    assert o["nproc_per_node"] == 2 and o["layer"] is None
    assert launcher_args == ["--rdzv-backend", "c10d", "--monitor-interval", "3"]
    assert command == ["train.py", "--layer", "x"]


def test_max_restarts_before_the_separator_is_detlaunchs_own() -> None:
    o, launcher_args, command = parse_options(["--rdzv-backend", "c10d", "--max-restarts", "3", "--", "train.py"])
    assert (o["max_restarts"], launcher_args, command) == (3, ["--rdzv-backend", "c10d"], ["train.py"])


def test_a_separator_after_the_command_started_belongs_to_the_command() -> None:
    o, launcher_args, command = parse_options(["--nproc-per-node", "2", "train.py", "--epochs", "3", "--", "--x"])
    assert (o["nproc_per_node"], launcher_args) == (2, [])
    assert command == ["train.py", "--epochs", "3", "--", "--x"]


def test_an_unknown_option_without_separator_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"^unknown option --rdzv-backend: if it is for the launcher, add -- before "):
        parse_options(["--rdzv-backend", "c10d", "train.py"])


def test_a_bad_flag_value_is_one_line() -> None:
    with pytest.raises(ConfigError) as e:
        parse_options(["--master-port", "http", "train.py"])
    assert str(e.value) == "argument --master-port: 'http' is not an integer; valid: 1..65535 (see detlaunch --help)"


def dry_run_json(argv: list[str], capsys: pytest.CaptureFixture[str], env: dict[str, str] | None = None) -> Any:
    code = main(["--layer", "torchrun", "--master-port", str(free_port()), "--dry-run", "--format", "json", *argv],
                {"PATH": os.environ["PATH"], **(env or {})})
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), err
    return json.loads(out)


def split_torchrun(plan: Any) -> tuple[list[str], list[str]]:
    argv = plan["commands"][0]["argv"]
    i = argv.index("--no-python")
    return argv[:i], argv[i + 1:]


def test_launcher_overrides_reach_torchruns_argv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    plan = dry_run_json(["--rdzv-backend", "c10d", "--monitor-interval", "3", "--", str(script),
                         "--epochs", "3", "--nproc-per-node", "9"], capsys)
    own, ranks = split_torchrun(plan)
    assert own[-4:] == ["--rdzv-backend", "c10d", "--monitor-interval", "3"]  # after ours: torchrun takes the last
    assert own[own.index("--nproc-per-node") + 1] == "1"  # the script's --nproc-per-node is the script's
    assert ranks == plan["rank_wrapper"] + [sys.executable, "-u", str(script), "--epochs", "3",
                                             "--nproc-per-node", "9"]


def test_the_users_command_keeps_its_own_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    plan = dry_run_json(["--nproc-per-node", "2", str(script), "--master-port", "1", "--dry-run", "--", "-x"],
                        capsys)
    own, ranks = split_torchrun(plan)
    assert own[own.index("--nproc-per-node") + 1] == "2"
    assert own[own.index("--master-port") + 1] != "1"
    assert plan["command"] == [sys.executable, "-u", str(script), "--master-port", "1", "--dry-run", "--", "-x"]
    assert ranks[len(plan["rank_wrapper"]):] == plan["command"]


def test_a_separator_inside_the_command_is_the_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    plan = dry_run_json(["--nproc-per-node", "2", str(script), "--", "--layer", "nope", "-h"], capsys)
    own, _ = split_torchrun(plan)
    assert (plan["layer"], own[own.index("--nproc-per-node") + 1]) == ("torchrun", "2")
    assert plan["command"] == [sys.executable, "-u", str(script), "--", "--layer", "nope", "-h"]


def test_precedence_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    config = tmp_path / "detlaunch.toml"
    config.write_text("[detlaunch]\ngrace_period = 7\nnproc_per_node = 3\n")
    plan = dry_run_json(["--config", str(config), str(script)], capsys)
    assert (plan["supervisor"]["grace_period"], plan["cluster"]["slots"]) == (7.0, [3])
    env = {"DETLAUNCH_GRACE_PERIOD": "8", "DETLAUNCH_CONFIG": str(config)}
    plan = dry_run_json([str(script)], capsys, env)
    assert (plan["supervisor"]["grace_period"], plan["cluster"]["slots"]) == (8.0, [3])
    plan = dry_run_json(["--grace-period", "9", "--nproc-per-node", "1", str(script)], capsys, env)
    assert (plan["supervisor"]["grace_period"], plan["cluster"]["slots"]) == (9.0, [1])
    assert "--grace" in plan["rank_wrapper"] and plan["rank_wrapper"][plan["rank_wrapper"].index("--grace") + 1] == "9"


def test_the_layer_may_come_from_the_environment_or_the_config_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    port = str(free_port())
    code = main(["--dry-run", "--format", "json", "--master-port", port, str(script)],
                {"PATH": os.environ["PATH"], "DETLAUNCH_LAYER": "torchrun"})
    out, err = capsys.readouterr()
    assert (code, err, json.loads(out)["layer"]) == (0, "", "torchrun")
    config = tmp_path / "c.toml"
    config.write_text("[detlaunch]\nlayer = 'torchrun'\n")
    code = main(["--config", str(config), "--dry-run", "--format", "json", "--master-port", port, str(script)],
                {"PATH": os.environ["PATH"]})
    out, err = capsys.readouterr()
    assert (code, err, json.loads(out)["layer"]) == (0, "", "torchrun")


# -- resolve_command ------------------------------------------------------------------------------


def test_a_python_script_runs_under_this_python_unbuffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert resolve_command(["train.py", "--lr", "1"], {}) == (sys.executable, "-u", "train.py", "--lr", "1")


def test_other_commands_run_as_given(tmp_path: Path) -> None:
    tool = tmp_path / "mytool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert resolve_command(["mytool", "x.py"], {"PATH": str(tmp_path)}) == ("mytool", "x.py")
    assert resolve_command([str(tool), "-v"], {"PATH": ""}) == (str(tool), "-v")
    assert resolve_command(["python3", "-c", "pass"], {"PATH": os.environ["PATH"]}) == ("python3", "-c", "pass")


@pytest.mark.parametrize(("command", "message"), [
    ([], "no command given: detlaunch --layer NAME [OPTIONS] train.py [ARGS...]"),
    (["missing.py"], "script not found: missing.py (relative to {cwd})"),
    (["no-such-tool-4711"], "command not found: no-such-tool-4711 (not on PATH)"),
    (["{tmp}/plain"], "command not found or not executable: {tmp}/plain"),
    (["{tmp}"], "command not found or not executable: {tmp}"),
])
def test_resolve_command_errors(tmp_path: Path, command: list[str], message: str) -> None:
    (tmp_path / "plain").write_text("not executable")
    command = [c.format(tmp=tmp_path) for c in command]
    with pytest.raises(ConfigError) as e:
        resolve_command(command, {"PATH": str(tmp_path)})
    assert str(e.value) == message.format(tmp=tmp_path, cwd=os.getcwd())


def test_parser_errors_never_exit() -> None:
    parser = build_parser()
    with pytest.raises(ConfigError) as e:  # argparse would print usage and exit 2; one line instead
        parser.parse_args(["--format", "xml"])
    assert str(e.value) == ("argument --format: invalid choice: 'xml' (choose from 'text', 'json') "
                            "(see detlaunch --help)")


def test_max_restarts_restarts_the_job_and_torchrun_never_restarts(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    plan = dry_run_json(["--max-restarts", "3", "--restart-backoff", "2", str(script)], capsys)
    own, _ = split_torchrun(plan)
    assert own[own.index("--max-restarts") + 1] == "0" and own.count("--max-restarts") == 1
    assert plan["restarts"]["max_restarts"] == 3 and plan["restarts"]["backoff"]["initial"] == 2.0
    plan = dry_run_json([str(script)], capsys, env={"DETLAUNCH_MAX_RESTARTS": "2"})
    assert plan["restarts"]["max_restarts"] == 2
    assert "DETLAUNCH_MAX_RESTARTS" in plan["unset_env"]  # a detlaunch nested in the job does not restart by itself


def test_dry_run_text_shows_the_restart_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    code = main(["--layer", "torchrun", "--master-port", str(free_port()), "--dry-run", "--max-restarts", "2",
                 str(script)], {"PATH": os.environ["PATH"]})
    out, _ = capsys.readouterr()
    assert code == 0
    assert "restarts: at most 2 after failures, 2 after lost nodes (job-wide, counted by the chief)" in out.splitlines()
    assert "  between attempts: at most 50 s for every thread of the last attempt's processes to end and, where " \
           "nvidia-smi is found, their GPU memory to be freed (--release-timeout)" in out.splitlines()


@pytest.mark.parametrize("flag", ["--max_restarts", "--max_restarts=3"])
def test_torchruns_own_restart_flag_becomes_detlaunchs_job_wide_restarts(flag: str, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 13: torchrun's --max_restarts is mapped onto detlaunch's restarts, never silently defeated."""
    script = tmp_path / "train.py"
    script.write_text("")
    plan = dry_run_json([flag, *([] if "=" in flag else ["3"]), str(script)], capsys)
    own, _ = split_torchrun(plan)
    assert plan["restarts"]["max_restarts"] == 3
    assert own[own.index("--max-restarts") + 1] == "0" and own.count("--max-restarts") == 1  # torchrun: none
