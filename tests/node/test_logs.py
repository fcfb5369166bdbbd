"""`--log-dir DIR`: one file per rank with every line of that rank, plus the console; `--ranks` filters the console."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.helpers import free_port, rank_lines
from support.jobs import Launcher

pytestmark = pytest.mark.timeout(120)

N = 200


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "talk.py"
    path.write_text(
        "import os, sys\n"
        "rank = int(os.environ['RANK'])\n"
        f"for i in range({N}):\n"
        "    print(f'out {i} of rank {rank}', flush=True)\n"
        "    if i % 50 == 0:\n"
        "        print(f'err {i} of rank {rank}', file=sys.stderr, flush=True)\n"
    )
    return str(path)


def expected_out(rank: int) -> list[str]:
    return [f"out {i} of rank {rank}" for i in range(N)]


def expected_err(rank: int) -> list[str]:
    return [f"err {i} of rank {rank}" for i in range(0, N, 50)]


def file_lines(path: Path, rank: int) -> tuple[list[str], list[str]]:
    """A rank's log file, split back into what came from its stdout and from its stderr (order kept)."""
    lines = path.read_text().splitlines()
    assert all(line.startswith(f"[rank={rank}] ") for line in lines), lines
    lines = rank_lines(path.read_text(), rank)
    return [x for x in lines if x.startswith("out ")], [x for x in lines if x.startswith("err ")]


def test_log_dir_has_one_file_per_rank_and_the_console_has_everything(
        launcher: Launcher, tmp_path: Path, script: str) -> None:
    logs = tmp_path / "logs"
    r = launcher.run("--layer", "torchrun", "--master-port", str(free_port()), "--nproc-per-node", "2",
                     "--log-dir", str(logs), script)
    assert r.returncode == 0, r.output
    assert sorted(p.name for p in logs.glob("rank-*.log")) == ["rank-0.log", "rank-1.log"]
    for rank in (0, 1):
        out, err = file_lines(logs / f"rank-{rank}.log", rank)
        assert (out, err) == (expected_out(rank), expected_err(rank))
        assert len(rank_lines((logs / f"rank-{rank}.log").read_text(), rank)) == N + len(err)  # nothing else
        assert rank_lines(r.stdout, rank) == expected_out(rank)  # the console still gets it, streams apart
        assert rank_lines(r.stderr, rank) == expected_err(rank)


def test_ranks_filters_the_console_but_not_the_files(
        launcher: Launcher, tmp_path: Path, script: str) -> None:
    logs = tmp_path / "logs"
    r = launcher.run("--layer", "torchrun", "--master-port", str(free_port()), "--nproc-per-node", "2",
                     "--log-dir", str(logs), "--ranks", "0", script)
    assert r.returncode == 0, r.output
    assert rank_lines(r.stdout, 0) == expected_out(0)
    assert rank_lines(r.stderr, 0) == expected_err(0)
    assert "[rank=1]" not in r.output
    assert re.fullmatch(r"detlaunch: job finished: 2 rank\(s\) exited 0 in \d+\.\d\d s", r.stderr.splitlines()[-1])
    for rank in (0, 1):
        assert file_lines(logs / f"rank-{rank}.log", rank) == (expected_out(rank), expected_err(rank))
