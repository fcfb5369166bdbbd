"""The per-job sshd's sessions (detlaunch.ssh): what every rank that arrives over ssh gets from its node.

The launchers export the chief's environment to every node but leave CUDA_VISIBLE_DEVICES out, so each
node's sshd sets its own (tests/layers/test_horovod.py and test_deepspeed.py run it for real).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from detlaunch import ClusterInfo, Config, ConfigError, StageContext
from detlaunch.ssh import SshLayout, sshd_parts

pytestmark = pytest.mark.timeout(10)


def worker_ctx(tmp_path: Path, env: dict[str, str]) -> StageContext:
    cluster = ClusterInfo(node_addrs=("127.0.0.1", "127.0.0.2"), slots=(2, 2), node_rank=1, chief_addr="127.0.0.1",
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
