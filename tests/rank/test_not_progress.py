"""Output a layer declares not progress (RankWrapper.not_progress): horovod's stall warning, which a
rank prints every 60 s while it waits in a collective, does not move the wrapper's output mark, so the
hang watch still sees a hang. The wrapper's real parts on a real progress file; no process started."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest
from detlaunch.progress import OUTPUT_RECORD, create_progress_file, read_progress
from detlaunch.rank import wrapped_rank
from detlaunch.rank.output import Output
from detlaunch.rank.progress import OutputMark
from detlaunch.rank.wrapped_rank import Stream, WrappedRank
from detlaunch_horovod.layer import STALL_WARNINGS

# A stall warning as horovod 0.28's stall_inspector.cc logs it: one message, one write, its first line first.
STALL = (b"[2026-12-02 11:50:01.123456: W /tmp/pip-wheel-x/horovod/common/stall_inspector.cc:107] "
         b"One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are "
         b"waiting for remainder of ranks for more than 60 seconds. This may indicate that different ranks are "
         b"trying to submit different tensors or that only subset of ranks is submitting tensors, which will "
         b"cause deadlock. \nMissing ranks:\n1: [allreduce.stuck]\n")
OUT, ERR = 101, 102  # the two streams' fds (never read here: the reads are handed to take())


@pytest.fixture
def rank(tmp_path: Path) -> WrappedRank:
    w = WrappedRank(0, ["train.py"], None, None, None, grace=1.0)
    w.output_mark = OutputMark(create_progress_file(str(tmp_path), 0))
    w.not_progress = tuple(text.encode() for text in STALL_WARNINGS)
    w.streams = {OUT: Stream(b"[rank=0] ", Output(None, None), False),
                 ERR: Stream(b"[rank=0] ", Output(None, None), True)}
    return w


def marks(w: WrappedRank, tmp_path: Path) -> int:
    beat = read_progress(str(tmp_path / "progress-0"), OUTPUT_RECORD)
    return 0 if beat is None else beat.count


def test_horovods_stall_warning_is_not_progress_but_the_output_around_it_is(rank: WrappedRank, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rank.take(OUT, b"step 1\n")
    rank.take(ERR, b"step 1 warns\n" + STALL)  # a line of the rank's own first: progress
    assert marks(rank, tmp_path) == 2
    monkeypatch.setattr(wrapped_rank, "NOT_PROGRESS_BURST", 0.0)
    rank.take(ERR, STALL)
    rank.take(ERR, b"step 2 warns\n")  # after the message (and its burst): the rank's own output again
    assert marks(rank, tmp_path) == 3
    monkeypatch.setattr(wrapped_rank, "NOT_PROGRESS_BURST", 60.0)
    rank.take(ERR, STALL)
    rank.take(ERR, b"2: [allreduce.stuck]\n")  # the rest of a long message, in a read of its own
    assert marks(rank, tmp_path) == 3
    rank.take(OUT, b"step 3\n")  # right after, but on the other stream: the rank's own
    assert marks(rank, tmp_path) == 4


def test_a_line_counts_once_it_ends_so_a_warning_written_a_piece_at_a_time_is_still_not_progress(
        rank: WrappedRank, tmp_path: Path) -> None:
    """horovod logs through std::cerr, unbuffered: the header's pieces come as writes of their own."""
    header, body = STALL.split(b"] ", 1)
    for piece in (b"[", header[1:12], header[12:], b"] ", body[:-1]):
        rank.take(ERR, piece)
    rank.take(ERR, b"\n")  # std::endl, after the message
    assert marks(rank, tmp_path) == 0
    rank.take(OUT, b"epoch 1: ")  # the rank's own line, in pieces too: progress once it ends
    assert marks(rank, tmp_path) == 0
    rank.take(OUT, b"loss 0.5\rloss 0.4")  # a progress bar's \r ends a line
    assert marks(rank, tmp_path) == 1

def test_without_declared_text_every_read_is_progress(rank: WrappedRank, tmp_path: Path) -> None:
    rank.not_progress = ()
    rank.take(ERR, STALL)
    assert marks(rank, tmp_path) == 1


def test_the_declared_text_is_what_the_installed_horovod_prints() -> None:
    """Each text is a string constant of horovod's own library (the C++ stall inspector's LOG lines)."""
    horovod = pytest.importorskip("horovod")
    libraries = glob.glob(os.path.join(os.path.dirname(horovod.__file__), "torch", "mpi_lib_v2*.so"))
    if not libraries:
        pytest.skip("horovod was built without its torch extension")
    data = Path(libraries[0]).read_bytes()
    for text in STALL_WARNINGS:
        assert text.encode() in data, text
