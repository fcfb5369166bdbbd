"""A job id is a plain name: it names the job's directory, so no value may reach another folder.

Every source is checked the same way (the flag, DETLAUNCH_JOB_ID, the config file, a scheduler's variable, a
third-party provider's ClusterInfo): one line, exit 2, nothing made outside the job folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from detlaunch.cli.main import main
from detlaunch.errors import ClusterError
from detlaunch.planning.cluster import ClusterInfo, job_id_problem
from support.discovery import clean_env

pytestmark = pytest.mark.timeout(60)

GOOD = ["dl-4622226388", "12.0", "run_7", "a", "A" * 128, "d3a1f2-44.1"]
BAD = ["", "../x", "..", ".", "-x", "_x", "a/b", "../../../../tmp/x", "a b", "x\n", "é", "a;b", "$x", "A" * 129]


@pytest.mark.parametrize("value", GOOD)
def test_plain_names_are_job_ids(value: str) -> None:
    assert job_id_problem(value) is None


@pytest.mark.parametrize("value", BAD)
def test_anything_else_is_not(value: str) -> None:
    assert job_id_problem(value) in ("is not a plain name", f"is {len(value)} characters long")


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def run(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str, **env: str) -> tuple[int, list[str]]:
    home = tmp_path / "home"
    code = main(["--layer", "horovod", "--dry-run", *argv],
                env=clean_env(os.environ, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), **env))
    assert not (tmp_path / "x").exists() and not home.exists()  # the horovod plan's keys went nowhere
    return code, capsys.readouterr().err.splitlines()


def test_the_flag_the_variable_and_the_config_file_refuse_a_path(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, script: str) -> None:
    escape = f"../../../../../../../../{tmp_path.relative_to('/')}/x"
    config = tmp_path / "c.toml"
    config.write_text(f'[detlaunch]\njob-id = "{escape}"\n')
    for argv, env, where in [(["--job-id", escape], {}, "argument --job-id: "),
                             ([], {"DETLAUNCH_JOB_ID": escape}, "DETLAUNCH_JOB_ID="),
                             (["--config", str(config)], {}, "[detlaunch] job-id=")]:
        code, err = run(capsys, tmp_path, *argv, script, **env)
        assert code == 2 and len(err) == 1, err
        assert where in err[0] and f"{escape!r} is not a plain name" in err[0], err


def test_a_schedulers_job_id_is_checked_and_named(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  script: str) -> None:
    slurm = {"SLURM_JOB_ID": "../x", "SLURM_JOB_NODELIST": "localhost", "SLURM_NNODES": "1",
             "SLURM_TASKS_PER_NODE": "1", "SLURMD_NODENAME": "localhost"}
    code, err = run(capsys, tmp_path, script, **slurm)
    assert (code, err) == (2, ["detlaunch: error: job id '../x' from SLURM_JOB_ID=../x is not a plain name; a job id "
                               "names the job's directory: letters, digits, '.', '_' and '-' only, starting with a "
                               "letter or digit, at most 128 (give --job-id NAME)"])
    code, err = run(capsys, tmp_path, "--job-id", "mine", script, **slurm)  # the user's own id wins
    assert code == 0, err
    info = tmp_path / "cluster.json"
    info.write_text(json.dumps({"master_url": "http://127.0.0.1:1", "cluster_id": "c", "agent_id": "a",
                                "slot_ids": [0], "task_id": "1.trial", "allocation_id": "a/../../x",
                                "session_token": "t", "task_type": "COMMAND"}))
    code, err = run(capsys, tmp_path, script, DET_CLUSTER_INFO=str(info), DET_RESOURCES_ID="r")
    assert code == 2 and len(err) == 1 and f"job id 'a/../../x' from allocation_id of {info}" in err[0], err


def test_a_third_party_providers_job_id_is_checked_too() -> None:
    with pytest.raises(ClusterError) as e:
        ClusterInfo(node_addrs=("a",), slots=(1,), node_rank=0, chief_addr="a", job_id="x/y", provider="ray")
    assert str(e.value).startswith("job id 'x/y' from the ray provider is not a plain name; ")
