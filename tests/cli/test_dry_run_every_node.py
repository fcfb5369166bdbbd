"""`--dry-run` of a host list without --node-rank: every node's plan in turn, planned in this process (nothing
starts). deepspeed's chief says in words what its runner's argv carries: the hostfile of the attempt, what pdsh
runs on every host, the rank command its encoded word holds."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from detlaunch.cli.main import main
from detlaunch_deepspeed import rank_shim
from support.discovery import clean_env
from support.helpers import free_port

pytestmark = pytest.mark.timeout(60)

HOSTS = ("10.0.0.1", "10.0.0.2", "10.0.0.3")


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("".join(f"{h} slots=2\n" for h in HOSTS))
    (tmp_path / "train.py").write_text("raise SystemExit('this script must not run')\n")
    return tmp_path


def dry(capsys: pytest.CaptureFixture[str], job: Path, *args: str) -> tuple[int, str, str]:
    env = clean_env(os.environ, TMPDIR=str(job / "tmp"), XDG_CACHE_HOME=str(job / "cache"), HOME=str(job))
    (job / "tmp").mkdir(exist_ok=True)
    code = main(["--layer", "deepspeed", "--hostfile", "hosts", "--master-port", str(free_port()), *args,
                 "--dry-run", "train.py"], env=env)
    out, err = capsys.readouterr()
    assert list((job / "tmp").iterdir()) == [] and not (job / "cache").exists(), "a dry run wrote files"
    return code, out, err


def test_every_node_of_the_hostfile_and_what_the_chief_runs_in_words(capsys: pytest.CaptureFixture[str],
                                                                        job: Path) -> None:
    code, out, err = dry(capsys, job)
    assert code == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0].startswith("every node of --hostfile (3 hosts), as each node's detlaunch would run it")
    heads = [line.split(" · ")[0] for line in lines if line.startswith("node ")]
    assert heads == ["node 0 of 3 (chief)", "node 1 of 3 (worker)", "node 2 of 3 (worker)"]
    chief = out.split("\n\nnode 1 of 3")[0]
    assert f"        hostfile: {'; '.join(f'{h} slots=2' for h in HOSTS)}\n" in chief
    assert "pdsh runs on every host of the hostfile, over that host's per-job sshd" in chief
    assert "characters)  [stop with SIGKILL]" in chief  # the encoded word, shortened in the text

    code, out, err = dry(capsys, job, "--format", "json")
    assert code == 0, err
    plans = json.loads(out)
    assert [(p["role"], p["cluster"]["node_rank"]) for p in plans] == [("chief", 0), ("worker", 1), ("worker", 2)]
    assert len({p["cluster"]["job_id"] for p in plans}) == 1
    runner = plans[0]["commands"][-1]
    words, cwd = rank_shim.decode_words(runner["argv"][-1:])
    assert runner["notes"][-1] == f"the --words= word, decoded: in {cwd}, {shlex.join(words)}"  # true to the argv
    assert words == [*plans[0]["rank_wrapper"], *plans[0]["command"]] and cwd == str(job)
    assert [c["notes"] for c in plans[1]["commands"]] == [[]]  # a worker runs its sshd only


def test_a_job_whose_nodes_can_move_says_the_hostfile_is_the_attempts(capsys: pytest.CaptureFixture[str],
                                                                         job: Path) -> None:
    code, out, err = dry(capsys, job, "--spares", "1", "--max-node-restarts", "1")
    assert code == 0, err
    assert (f"hostfile (a later attempt on other nodes, a spare in a lost node's place or fewer nodes, writes its "
            f"own): {HOSTS[0]} slots=2; {HOSTS[1]} slots=2\n") in out
    assert f"\nspare node 2 ({HOSTS[2]}): runs no rank until it takes a lost node's place" in out


def test_with_a_node_rank_it_is_that_node_only(capsys: pytest.CaptureFixture[str], job: Path) -> None:
    code, out, err = dry(capsys, job, "--node-rank", "1")
    assert code == 0, err
    assert out.startswith("node 1 of 3 (worker)") and "node 0 of 3" not in out
