"""The restart options (options.py): flags, variables and config-file values into a RestartPolicy, or one clear line."""

from __future__ import annotations

import argparse
import signal

import pytest
from detlaunch.errors import ConfigError
from detlaunch.planning.config import Parser
from detlaunch.restarts.options import RESTARTS, policy_from_options
from detlaunch.restarts.policy import RestartPolicy

pytestmark = pytest.mark.timeout(60)


def parse_restart(*argv: str) -> RestartPolicy:
    parser = Parser(prog="detlaunch")
    RESTARTS.add_to(parser)
    return policy_from_options(vars(parser.parse_args(argv)))


def test_options_parse_into_a_policy() -> None:
    p = parse_restart("--max-restarts", "3", "--restart-on", "ImportError,start_failure",
                      "--no-restart-on", "3, SIGTERM,Hang,torch.OutOfMemoryError", "--restart-backoff", "0.5",
                      "--restart-backoff-max", "10", "--no-restart-exit-code", "none")
    assert p.max_restarts == 3 and p.node_restarts == 3
    assert p.restart_on == ("ImportError", "start-failure")
    assert p.no_restart_on == (3, 128 + signal.SIGTERM, "hang", "torch.OutOfMemoryError")
    assert (p.backoff_initial, p.backoff_cap, p.no_restart_exit_code) == (0.5, 10.0, None)
    assert parse_restart() == RestartPolicy()


def test_options_from_the_environment_or_a_config_file_come_as_text() -> None:
    p = policy_from_options({"max_restarts": "2", "restart_on": "user-error", "restart_backoff": "0"})
    assert (p.max_restarts, p.restart_on, p.backoff_initial) == (2, ("user-error",), 0.0)


@pytest.mark.parametrize(("argv", "message"), [
    (["--max-restarts", "-1"], "argument --max-restarts: '-1' is out of range; valid: 0..1000000"),
    (["--max-restarts", "two"], "argument --max-restarts: 'two' is not an integer; valid: 0..1000000"),
    (["--max-node-restarts", "1e9"], "argument --max-node-restarts: '1e9' is not an integer; valid: 0..1000000"),
    (["--restart-backoff", "nan"], "argument --restart-backoff: 'nan' is not a finite number; valid: 0..86400 s"),
    (["--restart-backoff-max", "inf"], "'inf' is not a finite number; valid: 0..86400 s"),
    (["--restart-backoff", "-2"], "'-2' is out of range; valid: 0..86400 s"),
    (["--restart-backoff", "3e6"], "'3e6' is out of range; valid: 0..86400 s"),  # a timer would overflow
    (["--restart-on", "rank-faild"], "argument --restart-on: invalid list of exit codes"),
    (["--restart-on", "hangs"], "argument --restart-on: invalid list of exit codes"),
    (["--no-restart-on", "300"], "argument --no-restart-on: invalid list of exit codes"),
    (["--no-restart-exit-code", "0"], "argument --no-restart-exit-code: '0' is out of range; valid: 1..255, or none"),
    (["--restart-backoff", "20", "--restart-backoff-max", "5"],
     "--restart-backoff 20 is more than --restart-backoff-max 5: raise the maximum or lower the first backoff"),
    (["--restart-on", "3", "--no-restart-on", "3,4"], "3 is in both --restart-on and --no-restart-on: keep it in one"),
    (["--restart-on", "interrupted"], "'interrupted' cannot be in --restart-on or --no-restart-on"),
])
def test_bad_option_values_are_one_clear_line(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_restart(*argv)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_text_values_name_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--max-restarts 'x': 'x' is not an integer; valid: 0\.\.1000000$"):
        policy_from_options({"max_restarts": "x"})
    with pytest.raises(ConfigError, match=r"^--restart-backoff '1e300': '1e300' is out of range; valid: 0\.\.86400 s$"):
        policy_from_options({"restart_backoff": "1e300"})
    with pytest.raises(ConfigError, match="the backoff jitter 2.0 is out of range"):
        RestartPolicy(backoff_jitter=2.0)


def test_the_options_are_a_group_of_their_own() -> None:
    parser = argparse.ArgumentParser()
    RESTARTS.add_to(parser)
    group = [g for g in parser._action_groups if g.title and g.title.startswith("restarts")]
    assert {a.dest for a in group[0]._group_actions} == {
        "max_restarts", "max_node_restarts", "restart_on", "no_restart_on", "no_restart_exit_code",
        "restart_backoff", "restart_backoff_max", "release_timeout"}


