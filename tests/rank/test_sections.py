"""detlaunch.section(name): each rank's timed work, in its progress file, read back by the supervisor."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import detlaunch
import pytest
from detlaunch.progress import create_progress_file, read_progress, read_sections
from detlaunch.rank import progress as progress_module
from detlaunch.rank import sections

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A process that has not used a section yet (the module maps the file on first use)."""
    monkeypatch.setattr(sections, "_buf", None)
    monkeypatch.setattr(sections, "_slots", {})
    monkeypatch.setattr(progress_module, "_buf", None)
    yield


@pytest.fixture
def rank_file(fresh: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = create_progress_file(str(tmp_path), 3)
    monkeypatch.setenv("DETLAUNCH_PROGRESS_FILE", path)
    return path


def test_without_detlaunch_a_section_only_runs_what_it_wraps(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DETLAUNCH_PROGRESS_FILE", raising=False)

    @detlaunch.section("fwd")
    def forward(x: int) -> int:
        return x + 1

    with detlaunch.section("step"):
        assert forward(1) == 2
    assert sections._buf is sections._DISABLED


def test_calls_and_time_of_each_section_reach_the_file(rank_file: str) -> None:
    @detlaunch.section("fwd")
    def forward(x: int) -> int:
        return x * 2

    for i in range(5):
        with detlaunch.section("step"):
            time.sleep(0.002)
            forward(i)
    figures = read_sections(rank_file)
    assert set(figures) == {"step", "fwd"}
    assert figures["step"][0] == 5 and figures["fwd"][0] == 5
    assert 0.01 <= figures["step"][1] < 5.0 and figures["fwd"][1] < figures["step"][1]
    detlaunch.progress(7)  # the heartbeat's record is untouched by the table
    beat = read_progress(rank_file)
    assert beat is not None and beat.step == 7


def test_a_section_that_raises_is_counted_and_the_error_goes_on(rank_file: str) -> None:
    with pytest.raises(ZeroDivisionError), detlaunch.section("bad"):
        1 / 0  # noqa: B018
    assert read_sections(rank_file)["bad"][0] == 1


def test_names_are_kept_whole_or_cut_at_a_character(rank_file: str) -> None:
    long = "é" * 40  # 80 bytes of UTF-8: cut to 28 characters, never in the middle of one
    with detlaunch.section(long), detlaunch.section("ünïcode"):
        pass
    assert set(read_sections(rank_file)) == {"é" * 28, "ünïcode"}


def test_more_names_than_slots_are_said_once_and_not_timed(rank_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(progress_module.MAX_SECTIONS + 3):
        with detlaunch.section(f"s{i}"):
            pass
    assert len(read_sections(rank_file)) == progress_module.MAX_SECTIONS
    assert capsys.readouterr().err.count("section names") == 1


def test_a_missing_or_short_file_reads_as_no_sections(tmp_path: Path) -> None:
    assert read_sections(str(tmp_path / "nope")) == {}
    short = tmp_path / "short"
    short.write_bytes(b"\0" * 192)
    assert read_sections(str(short)) == {}
