"""Values that named nothing, hung or gave a traceback (security round 2, item 6), each one line and exit 2, in this
interpreter (cli.main(argv)): nothing is started, not even for --dry-run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from detlaunch.cli.main import main

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    return "train.py"


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(("flag", "value", "line"), [
    ("--spawn", "", "detlaunch: error: argument --spawn: '' names no spawner (ssh or srun): give one, or leave "
                    "--spawn out (see detlaunch --help)"),
    ("--exclude-hosts", "", "detlaunch: error: argument --exclude-hosts: '' names no file: give one, or leave "
                            "--exclude-hosts out (see detlaunch --help)"),
    ("--ssh-opts", "'x", "detlaunch: error: argument --ssh-opts: cannot be split as a shell would (no closing "
                         "quotation): quote it as for a POSIX shell, e.g. --ssh-opts '-p 2222 -F cfg' (see detlaunch "
                         "--help)"),
    ("--exclude-hosts", "/dev/zero", "detlaunch: error: cannot read --exclude-hosts /dev/zero: a character device, "
                                     "not a regular file"),
])
def test_a_value_that_names_nothing_or_cannot_be_read_is_one_line(script: str, capsys: pytest.CaptureFixture[str],
                                                                  flag: str, value: str, line: str) -> None:
    assert main(["--layer", "direct", "--nproc-per-node", "1", flag, value, "--dry-run", script]) == 2
    assert one_line(capsys) == line


def test_an_exclusion_file_that_is_a_fifo_does_not_hang_even_a_dry_run(script: str, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "excluded")
    assert main(["--layer", "direct", "--nproc-per-node", "1", "--exclude-hosts", str(tmp_path / "excluded"),
                 "--dry-run", script]) == 2
    assert one_line(capsys) == f"detlaunch: error: cannot read --exclude-hosts {tmp_path}/excluded: a FIFO, not a " \
                               "regular file"


def test_the_same_checks_hold_for_the_variables(script: str, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETLAUNCH_SSH_OPTS", "-o 'unclosed")
    assert main(["--layer", "direct", "--nproc-per-node", "1", "--dry-run", script]) == 2
    assert one_line(capsys).startswith("detlaunch: error: DETLAUNCH_SSH_OPTS=\"-o 'unclosed\": cannot be split as a "
                                       "shell would (no closing quotation)")
