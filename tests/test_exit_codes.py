"""The one table of detlaunch's exit codes (exit_codes.py): its names, the README's section, and the rank
wrapper's literal codes (rank/ imports nothing above it) all agree with it. Milliseconds."""

from __future__ import annotations

import errno
import re
import signal

import detlaunch.exit_codes as exit_codes
import pytest
from detlaunch.errors import ConfigError, DetlaunchError
from detlaunch.outcome import ProcessEnd
from detlaunch.rank import wrapper
from support import paths

pytestmark = pytest.mark.timeout(10)

README = (paths.ROOT / "README.md").read_text()


def test_every_row_names_its_constant() -> None:
    for row in exit_codes.TABLE:
        value = getattr(exit_codes, row.name)
        assert row.code == (f"{value}+N" if row.name == "SIGNAL_BASE" else str(value)), row
    named = {name for name, v in vars(exit_codes).items() if name.isupper() and isinstance(v, int)}
    assert named - {row.name for row in exit_codes.TABLE} == {"INTERRUPTED"}  # 128+2: a row of 128+N
    assert exit_codes.INTERRUPTED == exit_codes.by_signal(signal.SIGINT) == 130


def test_the_readme_shows_the_table() -> None:
    section = README[README.index("## Exit codes"):]
    section = section[: section.index("\n## ")]
    rows = [line for line in section.splitlines() if re.match(r"^\| `", line)]
    assert rows == [f"| `{row.code}` | {row.meaning} |" for row in exit_codes.TABLE]


def test_errors_exit_with_their_codes() -> None:
    assert (DetlaunchError.exit_code, ConfigError.exit_code) == (exit_codes.FAILED, exit_codes.USAGE)


def test_the_rank_wrappers_codes_are_the_tables(capfd: pytest.CaptureFixture[str]) -> None:
    assert wrapper.main(["--no-such-option", "x", "--", "true"]) == exit_codes.USAGE
    assert "unknown option --no-such-option" in capfd.readouterr().err
    for error, code in ((errno.ENOENT, exit_codes.NOT_FOUND), (errno.EACCES, exit_codes.CANNOT_RUN)):
        rank = wrapper.WrappedRank(0, ["/no/such/train.py"], None, None, None, grace=1.0)
        assert rank.cannot_start(OSError(error, "nope")) == code
        assert ProcessEnd.from_wait_status(rank.status or 0) == ProcessEnd(code)



def test_isolation_is_stdlib_only_and_its_codes_are_the_tables() -> None:
    """isolation.py runs as a lone file (tests/node/test_escape.py, as another user): it keeps its own copies."""
    import ast
    import sys

    from detlaunch.system import isolation

    tree = ast.parse(open(isolation.__file__).read())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported
    assert (isolation.INTERNAL, isolation.KILLED) == (exit_codes.INTERNAL, exit_codes.by_signal(signal.SIGKILL))
    for status, code in ((0, 0), (3 << 8, 3), (signal.SIGKILL, 137)):
        assert isolation._shell_code(status) == ProcessEnd.from_wait_status(status).code == code
