"""Every core option is declared once (detlaunch/options.py's Option), and what the declaration says holds
everywhere: the flag, its DETLAUNCH_* variable, its config-file key, its range and default, its old names,
and, for a supervision option, the plan that carries it to the supervisor and the dry run that shows it."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any

import pytest
from detlaunch.numbers import Number
from detlaunch.options import Option, OptionGroup, env_name
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.config import NUMBERS, OLD_NAMES, apply_defaults, build_parser, core_options, parse
from detlaunch.planning.plan import SUPERVISION_OPTIONS, LaunchPlan, render_json, render_text, supervision_settings
from detlaunch.testing.loaded_layer import LoadedLayer, clean_env
from support import paths

OPTIONS = [o for group in core_options() for o in group.options]


def parsed(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    parser = build_parser(["torchrun"])
    apply_defaults(parser, env or {}, {}, {}, None)
    ns, _, _ = parse(parser, [*argv, "train.py"], env or {})
    return vars(ns)


def test_no_core_option_is_declared_outside_an_option_entry() -> None:
    """The modules that own core options call no add_argument of their own: the Option entries are the list."""
    for module in ("planning/config.py", "restarts/options.py", "ssh.py"):
        tree = ast.parse((paths.CORE / "detlaunch" / module).read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument"]
        lines = [c.lineno for c in calls]
        assert all(module == "planning/config.py" and "command" in ast.unparse(c) for c in calls), (module, lines)


def test_each_flag_is_declared_once_and_every_dest_is_its_flags() -> None:
    flags = [o.flag for o in OPTIONS] + [old for o in OPTIONS for old in o.old_flags]
    assert len(flags) == len(set(flags))
    assert all(o.dest == o.flag[2:].replace("-", "_") and o.env == "DETLAUNCH_" + o.dest.upper() for o in OPTIONS)


def test_the_numbers_table_is_the_declarations() -> None:
    numeric = {o.dest: o.type for o in OPTIONS if isinstance(o.type, Number)}
    assert {k: v for k, v in NUMBERS.items() if k != "ssh_port"} == numeric
    assert {"grace_period", "master_port", "max_restarts", "no_restart_exit_code", "link_port"} <= set(numeric)


@pytest.mark.parametrize("option", [o for o in OPTIONS if isinstance(o.type, Number) and o.type.default is not None],
                         ids=lambda o: o.flag)
def test_a_numeric_default_is_the_declared_one_from_every_source(option: Option) -> None:
    assert isinstance(option.type, Number)
    assert parsed([])[option.dest] == option.type.default
    value = option.type.high
    text = str(int(value)) if option.type.kind is int else f"{value:g}"
    assert parsed([option.flag, text])[option.dest] == value
    assert parsed([], {option.env: text})[option.dest] == value


def test_an_old_name_is_read_as_the_new_one_and_the_new_one_wins() -> None:
    assert OLD_NAMES == {"control_port": "link_port"}
    assert parsed(["--control-port", "3000"])["link_port"] == 3000
    assert parsed([], {env_name("control_port"): "3001"})["link_port"] == 3001
    assert parsed([], {env_name("control_port"): "3001", env_name("link_port"): "3002"})["link_port"] == 3002
    assert "--control-port PORT" not in build_parser(["torchrun"]).format_help()  # named in --link-port's help only


def test_an_exit_code_that_can_be_turned_off_is_a_number_too() -> None:
    option = NUMBERS["no_restart_exit_code"]
    assert (option("none"), option(" OFF "), option("3")) == (None, None, 3)
    assert option.describe() == "1..255, or none"


def plan_of(tmp_path: Path, *argv: str) -> LaunchPlan:
    """The plan `detlaunch --layer direct ARGV train.py` makes, in this process (no process started)."""
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    env = {**clean_env(os.environ), "TMPDIR": str(tmp_path)}
    layer = LoadedLayer.load("direct", env)
    cluster = ClusterInfo(node_addrs=("127.0.0.1",), slots=(1,), node_rank=0, chief_addr="127.0.0.1", job_id="t")
    return layer.plan(layer.config([*argv, str(script)], env), cluster)


def test_every_supervision_option_reaches_the_plan_its_json_and_the_supervisors_reads(tmp_path: Path) -> None:
    assert {o.dest for o in SUPERVISION_OPTIONS} >= {"grace_period", "start_timeout", "heartbeat", "hang_timeout",
                                                      "dump_budget", "prefix", "dedupe", "dedupe_window"}
    plan = plan_of(tmp_path, "--grace-period", "7", "--hang-timeout", "60", "--dedupe-window", "0.5")
    assert (plan.grace_period, plan.hang_timeout, plan.dedupe_window) == (7.0, 60.0, 0.5)
    assert plan.start_timeout == NUMBERS["start_timeout"].default
    supervisor = json.loads(render_json(plan))["supervisor"]
    assert all(supervisor[o.dest] == getattr(plan, o.dest) for o in SUPERVISION_OPTIONS)
    assert "; grace 7 s; start timeout 300 s; expects " in render_text(plan)
    with pytest.raises(AttributeError):
        plan.no_such_option  # noqa: B018


def test_a_new_supervision_option_is_one_entry(tmp_path: Path) -> None:
    """What `--hang-exit-code` would take: one Option with supervision=True, and its use (plan.hang_exit_code)."""
    new = Option("--hang-exit-code", type=Number(int, 1, 255, 124), metavar="N", supervision=True,
                 shown="hang exit code {}", help="the exit code of a hung job")
    parser = build_parser(["torchrun"])
    OptionGroup("new", (new,)).add_to(parser)
    apply_defaults(parser, {"DETLAUNCH_HANG_EXIT_CODE": "99"}, {}, {}, None)
    ns, _, _ = parse(parser, ["train.py"], {})
    settings = supervision_settings(vars(ns), (*SUPERVISION_OPTIONS, new))
    assert settings["hang_exit_code"] == 99 and settings["grace_period"] == NUMBERS["grace_period"].default
