"""`detlaunch report` in this interpreter (cli.main(argv)): what a user sees for good logs, bad ones and
bad arguments; and the page a job leaves in its --log-dir (cli/report.page_at_end). No process is started."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from detlaunch.cli.main import main
from detlaunch.cli.report import page_at_end
from support.story_logs import simulated_job, write_logs

pytestmark = pytest.mark.timeout(30)


def test_the_page_is_written_and_said_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_logs(tmp_path / "logs", simulated_job(16))
    out = tmp_path / "job.html"
    assert main(["report", str(tmp_path / "logs"), "-o", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"detlaunch: wrote {out} (") and err[0].endswith(
        "KiB: 16 rank(s), 3 attempt(s)): failed: the job hung: no rank showed progress for 30.0 s (--hang-timeout) "
        "(exit 124)")
    page = out.read_text()
    assert page.startswith("<!doctype html>") and page.count('class="lane rank') == 16
    assert list(tmp_path.glob("*.tmp")) == []


def test_a_cut_log_gives_one_warning_line_and_a_page_of_what_could_be_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chief = write_logs(tmp_path, simulated_job(8))[0]
    chief.write_text(chief.read_text()[:-40])  # the job's last line, cut mid-write
    out = tmp_path / "page.html"
    assert main(["report", str(chief), "-o", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    lines = len(chief.read_text().splitlines())
    assert err[0] == f"detlaunch: warning: {chief}: its last line (line {lines}) is cut short: the page shows what " \
                     "could be read"
    page = out.read_text()
    assert "is cut short" in page and page.count('class="lane rank') == 8
    assert "the logs end before the job did" in page  # job_finished was the line cut


@pytest.mark.parametrize(("args", "code", "line"), [
    (["no-such.jsonl"], 2, "detlaunch: error: no-such.jsonl: no such file or directory"),
    ([], 2, "detlaunch: error: the following arguments are required: EVENTS (see detlaunch report --help)"),
    (["x", "--format", "svg"], 2, "detlaunch: error: argument --format: invalid choice: 'svg' (choose from "),
])
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], code: int, line: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["report", *args]) == code
    captured = capsys.readouterr()
    assert len(captured.err.splitlines()) == 1 and captured.err.startswith(line) and captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_a_file_with_no_event_in_it_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("hello\nworld\n")
    assert main(["report", "notes.txt"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "detlaunch: error: no event could be read from notes.txt (notes.txt: 2 line(s) could not be read (line 1: "
        "not JSON: Expecting value: line 1 column 1 (char 0)): the page shows what could be read)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_the_trace_goes_to_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_logs(tmp_path, simulated_job(8))
    assert main(["report", str(tmp_path), "--format", "trace", "-o", "-"]) == 0
    trace = json.loads(capsys.readouterr().out)
    assert trace["displayTimeUnit"] == "ms" and trace["otherData"]["job"] == "sim-job"


def test_the_page_at_the_end_of_a_job_is_written_into_its_log_dir_and_never_fails_it(tmp_path: Path) -> None:
    write_logs(tmp_path, simulated_job(16))
    assert page_at_end(str(tmp_path), None) is None
    page = (tmp_path / "report.html").read_text()
    assert page.count('class="lane rank') == 16  # the worker's log, in the same folder, is read too
    assert page_at_end(str(tmp_path / "nothing-here"), None) is None  # no log: no page, nothing said
    (tmp_path / "report.html").unlink()
    (tmp_path / "report.html").mkdir()  # something that cannot be replaced by a page
    problem = page_at_end(str(tmp_path), None)
    assert problem is not None and problem.startswith(f"the job's page {tmp_path}/report.html could not be written: ")
    assert list(tmp_path.glob("*.tmp")) == []


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory", "device"])
def test_an_output_that_exists_and_is_not_a_regular_file_is_not_replaced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    """Security round 2, item 3: `-o /dev/null` as root would have made /dev/null a regular file."""
    write_logs(tmp_path / "logs", simulated_job(2))
    out = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(out)
    elif kind == "symlink":
        (tmp_path / "target").write_text("kept\n")
        out.symlink_to(tmp_path / "target")
    elif kind == "directory":
        out.mkdir()
    else:  # a character device: /dev/null's own numbers (the suite runs as root; a user cannot make one)
        if os.getuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(out, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    before = os.lstat(out)
    assert main(["report", str(tmp_path / "logs"), "-o", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"detlaunch: error: {out} exists and is not a regular file: not replaced; give -o a new path (or - for stdout)"]
    after = os.lstat(out)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert kind != "symlink" or (tmp_path / "target").read_text() == "kept\n"


def test_what_a_log_says_cannot_drive_the_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Security round 2, item 9: the root cause comes from a rank's output; its escapes are shown, not sent."""
    (chief,) = write_logs(tmp_path, simulated_job(2))[:1]
    chief.write_text(chief.read_text().replace("no rank showed progress", "no rank\\u001b]0;pwned\\u0007\\u001b[2J"))
    assert main(["report", str(chief), "-o", str(tmp_path / "page.html")]) == 0
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "no rank\\x1b]0;pwned\\x07\\x1b[2J" in err
