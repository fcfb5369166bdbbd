"""What every rank gets unless set (planning/rank_defaults.py): torchrun's NCCL error handling for every
layer, and a persistent, private torch.compile cache instead of the job's fresh TMPDIR (issue 24, items 5
and 8). The plan and the dry run, in this process; milliseconds. The ranks themselves: tests/node/
test_rank_defaults_job.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.plan import LaunchPlan, render_json, render_text
from detlaunch.planning.rank_defaults import compile_cache_dir, rank_defaults
from detlaunch.testing.loaded_layer import LoadedLayer, clean_env

pytestmark = pytest.mark.timeout(30)

VARS = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME")


def plan_of(tmp_path: Path, layer_name: str, **env: str) -> LaunchPlan:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    full = {**{k: v for k, v in clean_env(os.environ).items() if k not in VARS}, "TMPDIR": str(tmp_path), **env}
    layer = LoadedLayer.load(layer_name, full)
    cluster = ClusterInfo(node_addrs=("127.0.0.1",), slots=(1,), node_rank=0, chief_addr="127.0.0.1", job_id="t")
    return layer.plan(layer.config([str(script)], full), cluster)


@pytest.mark.parametrize("layer", ["torchrun", "direct", "horovod", "deepspeed"])
def test_every_layers_ranks_get_torchruns_nccl_error_handling_and_a_persistent_compile_cache(
        tmp_path: Path, layer: str) -> None:
    cache = tmp_path / "cache"
    plan = plan_of(tmp_path, layer, XDG_CACHE_HOME=str(cache))
    assert plan.rank_defaults == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                                  "TORCHINDUCTOR_CACHE_DIR": str(cache / "detlaunch" / "torch-compile")}
    assert json.loads(render_json(plan))["rank_defaults"] == plan.rank_defaults
    text = render_text(plan)
    assert "every rank gets, unless its environment has it:\n  TORCHINDUCTOR_CACHE_DIR=" in text
    assert "  TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in text
    assert not cache.exists()  # planning touches no disk: the supervisor makes the folder


def test_what_the_user_set_is_left_alone(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "horovod", TORCH_NCCL_ASYNC_ERROR_HANDLING="3", TORCHINDUCTOR_CACHE_DIR="/data/ic")
    assert plan.rank_defaults == {}
    assert "every rank gets" not in render_text(plan)


def test_the_cache_is_in_the_users_own_cache_dir_never_the_temp_dir() -> None:
    home = os.path.expanduser("~")
    assert compile_cache_dir({}) == os.path.join(home, ".cache", "detlaunch", "torch-compile")
    assert compile_cache_dir({"XDG_CACHE_HOME": "relative/cache"}) == compile_cache_dir({})  # XDG: absolute only
    assert "TRITON_CACHE_DIR" not in rank_defaults({})  # inductor keeps Triton's under its own cache dir
