"""The per-job sshd's sessions (detlaunch.ssh): what every rank that arrives over ssh gets from its node.

The launchers export the chief's environment to every node but leave CUDA_VISIBLE_DEVICES out, so each
node's sshd sets its own (tests/layers/test_horovod.py and test_deepspeed.py run it for real).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from detlaunch import ClusterInfo, Config, ConfigError, StageContext
from detlaunch.ssh import SshLayout, ssh_client_parts, sshd_parts
from detlaunch_horovod.layer import import_time_env

pytestmark = pytest.mark.timeout(10)


def worker_ctx(tmp_path: Path, env: dict[str, str], node_rank: int = 1) -> StageContext:
    cluster = ClusterInfo(node_addrs=("127.0.0.1", "127.0.0.2"), slots=(2, 2), node_rank=node_rank,
                          chief_addr="127.0.0.1",
                          job_id="dl-test", provider="test")
    config = Config(layer="horovod", command=("train.py",), launcher_args=(), options={}, env=env)
    return StageContext(config=config, cluster=cluster, run_dir=str(tmp_path / "run"), shared_dir=str(tmp_path),
                        user_command=("train.py",), env=env)


def set_env_line(ctx: StageContext, extra: dict[str, str] | None = None) -> str:
    config = Path(SshLayout.for_job(ctx).node_dir(1), "sshd_config")
    lines = sshd_parts(ctx, env=extra).files[str(config)].splitlines()
    [line] = [line for line in lines if line.startswith("SetEnv")]  # sshd keeps only the first SetEnv line
    return line


def test_each_session_gets_its_nodes_own_cuda_visible_devices(tmp_path: Path) -> None:
    socket = tmp_path / "run" / "supervisor.sock"
    ctx = worker_ctx(tmp_path, {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "PATH": "/bin"})
    assert set_env_line(ctx) == f'SetEnv DETLAUNCH_SSHD_SUPERVISOR="{socket}" CUDA_VISIBLE_DEVICES="4,5,6,7"'
    # where the node has none, its ranks have none (not the chief's, not every GPU)
    assert set_env_line(worker_ctx(tmp_path, {})) == f'SetEnv DETLAUNCH_SSHD_SUPERVISOR="{socket}"'
    # an empty list is a list: no GPU for this node's ranks
    assert set_env_line(worker_ctx(tmp_path, {"CUDA_VISIBLE_DEVICES": ""})).endswith(' CUDA_VISIBLE_DEVICES=""')
    # a layer adds its own
    assert set_env_line(worker_ctx(tmp_path, {}), {"X_NODE": "GPU-aa"}).endswith(' X_NODE="GPU-aa"')


def test_a_value_sshd_cannot_carry_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        sshd_parts(worker_ctx(tmp_path, {"CUDA_VISIBLE_DEVICES": '0,"1'}))
    assert str(e.value) == ("CUDA_VISIBLE_DEVICES='0,\"1': this node's sshd cannot pass a value holding a quote, a "
                            "backslash or a control character on to the ranks it starts; fix the value")


def test_a_worker_expects_the_chiefs_launcher_path_in_its_ranks(tmp_path: Path) -> None:
    """horovodrun hands its environment, the chief's, to the ranks it starts over ssh: its PATH has the per-job ssh
    first. A worker's rank template is made with that PATH (RankWrapper.warm_env), so its ranks are forked warm
    where the nodes were started alike (else a PATH that differs starts each one cold, after the template's import)."""
    env = {"PATH": "/venv/bin:/usr/bin"}
    chief, worker = worker_ctx(tmp_path, env, node_rank=0), worker_ctx(tmp_path, env)
    launcher_path = ssh_client_parts(chief, [1]).env["PATH"]
    assert launcher_path == f"{tmp_path}/ssh/client/bin:/venv/bin:/usr/bin"
    assert import_time_env(worker) == {"PYTHONUNBUFFERED": "1", "PATH": launcher_path}
    assert import_time_env(chief) == {"PYTHONUNBUFFERED": "1"}  # its ranks inherit horovodrun's, PATH included
