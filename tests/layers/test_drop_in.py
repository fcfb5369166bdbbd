"""A torchrun or deepspeed user's command line and script, unchanged, under detlaunch: real jobs on CPU (gloo).

- deepspeed scripts that parse --local_rank get each rank's own value, as deepspeed's launcher passes it;
- on one node, --master-addr reaches the ranks (deepspeed's runner alone would export 127.0.0.1);
- a real ZeRO-2 training of a small model runs under --layer deepspeed, on one node and on two.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from support.helpers import free_port, rank_lines
from support.jobs import EXAMPLES, SCRIPTS, Launcher

LOCAL_RANK = str(SCRIPTS / "local_rank_args.py")
ZERO2 = str(SCRIPTS / "zero2_train.py")
MASTER_ADDR = str(SCRIPTS / "master_addr_allreduce.py")


@pytest.mark.timeout(300)
def test_a_deepspeed_script_parsing_local_rank_gets_its_own_and_the_master_addr_given(launcher: Launcher) -> None:
    r = launcher.run("--layer", "deepspeed", "--num_gpus", "2", "--master_addr", "127.0.0.5",
                     "--master_port", str(free_port()), LOCAL_RANK, "--epochs", "3", timeout=240)
    assert r.returncode == 0, r.output
    for rank in (0, 1):
        assert rank_lines(r.stdout, rank) == [f"argv --local_rank={rank} --epochs 3 LOCAL_RANK={rank} "
                                              "MASTER_ADDR=127.0.0.5"]
    assert "job finished: 2 rank(s) exited 0" in r.stderr


@pytest.mark.timeout(200)
def test_torchrun_flags_in_torchruns_spelling_and_the_master_addr_on_one_node(launcher: Launcher) -> None:
    r = launcher.run("--layer", "torchrun", "--nproc_per_node=2", "--master_addr", "127.0.0.5",
                     f"--master_port={free_port('127.0.0.5')}", "--local-ranks-filter", "1", MASTER_ADDR, timeout=150)
    assert r.returncode == 0, r.output
    assert rank_lines(r.stdout, 0) == []  # --local-ranks-filter 1: only local rank 1 on the console
    assert rank_lines(r.stdout, 1) == ["rank 1: all_reduce sum = 2 MASTER_ADDR=127.0.0.5"]
    assert "job finished: 2 rank(s) exited 0" in r.stderr


def check_zero2(stdout: str, ranks: range) -> None:
    pattern = re.compile(rf"rank (\d) of {len(ranks)}: zero stage 2, loss ([\d.]+) -> ([\d.]+), params (-?[\d.]+)$")
    results = []
    for rank in ranks:
        found = [m for line in rank_lines(stdout, rank) if (m := pattern.match(line))]
        assert found, f"rank {rank} printed no result:\n{stdout}"
        results.append(found[-1])
    for m in results:
        assert float(m.group(3)) < float(m.group(2)) / 2, f"the loss did not go down: {m.group(0)}"
    assert len({m.group(4) for m in results}) == 1, "the ranks' parameters differ"


@pytest.mark.timeout(500)
def test_a_zero2_training_over_two_nodes(launcher: Launcher, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """As DeepSpeed's own test model runs: --deepspeed_config, and initialize(args=...) checks --local_rank;
    deepspeed's own spelling of the port (--master_port)."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 16, "train_batch_size": 32,
                                  "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
                                  "zero_optimization": {"stage": 2}}))
    args = ["--layer", "deepspeed", "--hosts", "127.0.0.1:1,127.0.0.2:1", "--ssh-port", str(free_port("127.0.0.2")),
            "--master_port", str(free_port())]
    short_tmp = Path(tempfile.mkdtemp())  # short enough for the chief's socket path
    request.addfinalizer(lambda: shutil.rmtree(short_tmp, ignore_errors=True))
    script = [ZERO2, "--deepspeed_config", str(config)]
    worker = launcher.start(*args, "--node-rank", "1", *script)
    chief = launcher.start(*args, "--node-rank", "0", *script, env={"TMPDIR": str(short_tmp)})
    rc, rw = chief.wait(420), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    check_zero2(rc.stdout + rw.stdout, range(2))
    assert "job finished: 2 rank(s) exited 0" in rc.stderr


@pytest.mark.timeout(300)
def test_horovodrun_flags_in_horovodruns_spelling(launcher: Launcher) -> None:
    """`-np 2 -H localhost:2` as a horovodrun user types it: the plan's ranks, no extra rank, no false root cause."""
    r = launcher.run("--layer", "horovod", "-np", "2", "-H", "localhost:2", "-p", str(free_port()),
                     str(EXAMPLES / "hvd_allreduce.py"), timeout=240)
    assert r.returncode == 0, r.output
    assert [rank_lines(r.stdout, rank)[-1:] for rank in (0, 1)] == [
        [f"rank {rank} of 2: hvd.allreduce sum = 1 (chief localhost)"] for rank in (0, 1)], r.output
    assert "job finished: 2 rank(s) exited 0" in r.stderr


@pytest.mark.timeout(200)
def test_torchruns_redirects_and_tee_write_per_rank_files(launcher: Launcher, tmp_path: Path) -> None:
    """`--redirects 3`: each rank's output in its file only; `--tee 3`: in its file and on the console."""
    for flag, on_console in (("--redirects", False), ("--tee", True)):
        logs = tmp_path / flag.strip("-")
        r = launcher.run("--layer", "torchrun", "--nproc_per_node=2", f"--master_port={free_port()}", flag, "3",
                         "--log_dir", str(logs), MASTER_ADDR, timeout=150)
        assert r.returncode == 0, r.output
        for rank in (0, 1):
            line = f"rank {rank}: all_reduce sum = 2 MASTER_ADDR=localhost"
            assert rank_lines(r.stdout, rank) == ([line] if on_console else []), r.output
            assert line in (logs / f"rank-{rank}.log").read_text()
