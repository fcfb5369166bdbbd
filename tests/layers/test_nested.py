"""Nested layers (examples/nested/): an outer layer starts an inner detlaunch on each of its ranks,
and the inner job takes its chief from DET_CHIEF_IP instead of rediscovering it.

The outer job is `detlaunch --layer mpirun --hosts 127.0.0.3:2` (or torchrun): one node whose
address (and so DET_CHIEF_IP) is 127.0.0.3, an address nothing else would pick. Each of its two
ranks runs `detlaunch --layer torchrun --nnodes 2 --node-rank R` without --master-addr.
"""

from __future__ import annotations

import json

import pytest
from detlaunch.testing import Completed, DetlaunchRunner
from support import paths
from support.helpers import free_port
from support.plugin_examples import MPIRUN, ensure_installed

ensure_installed(MPIRUN)

pytestmark = pytest.mark.timeout(180)
NESTED = paths.EXAMPLES / "nested"
CHIEF = "127.0.0.3"


def free_ports() -> tuple[int, int]:
    """A free port for the inner torchrun's store, and one for the inner job link (the next one)."""
    port = free_port(CHIEF)
    return port, port + 1


def inner_args(node_rank: int, port: int, control: int) -> list[str]:
    return ["--layer", "torchrun", "--nnodes", "2", "--node-rank", str(node_rank), "--nproc-per-node", "1",
            "--master-port", str(port), "--link-port", str(control)]


@pytest.mark.parametrize("node_rank", [0, 1], ids=["inner-chief", "inner-worker"])
def test_the_inner_plan_takes_its_chief_from_det_chief_ip(detlaunch_runner: DetlaunchRunner, node_rank: int) -> None:
    detlaunch_runner.env.pop("DET_CHIEF_IP", None)
    port, control = free_ports()
    args = [*inner_args(node_rank, port, control), "--dry-run", "--format", "json", str(NESTED / "inner.py")]
    run = detlaunch_runner.run(*args, env={"DET_CHIEF_IP": CHIEF}, timeout=60)
    assert run.returncode == 0, run.output
    plan = json.loads(run.stdout)
    assert (plan["cluster"]["chief_addr"], plan["cluster"]["sources"]["chief"]) == (CHIEF, "DET_CHIEF_IP")
    assert plan["env"]["DET_CHIEF_IP"] == CHIEF  # and it passes it on, to a layer nested one level deeper
    [torchrun] = plan["commands"]
    assert torchrun["argv"][torchrun["argv"].index("--master-addr") + 1] == CHIEF
    assert plan["supervisor"]["control"] == f"{CHIEF}:{control}"

    # Without DET_CHIEF_IP, the same command has no chief at all: the variable is what made it work.
    alone = detlaunch_runner.run(*args, timeout=60)
    assert (alone.returncode, alone.stderr) == (
        2, "detlaunch: error: --nnodes > 1 needs the chief's address: --master-addr ADDR\n"), alone.output


def nested_job(runner: DetlaunchRunner, outer: str = "mpirun", env: dict[str, str] | None = None,
               ) -> tuple[Completed, int]:
    """Run the nested example under the `outer` layer; return its result and the inner job's master port."""
    runner.env.pop("DET_CHIEF_IP", None)
    port, control = free_ports()
    outer_args = ["--master-port", str(free_port())] if outer == "torchrun" else []
    run = runner.run("--layer", outer, *outer_args, "--hosts", f"{CHIEF}:2", str(NESTED / "node.py"),
                     "--nproc-per-node", "1", "--master-port", str(port), "--link-port", str(control),
                     "--", str(NESTED / "inner.py"), env=env, timeout=150)
    runner.assert_no_leftovers()
    return run, port


@pytest.mark.parametrize("outer", ["mpirun", "torchrun"])
def test_an_inner_torchrun_job_runs_on_the_outer_chief(detlaunch_runner: DetlaunchRunner, outer: str) -> None:
    run, port = nested_job(detlaunch_runner, outer)
    assert run.returncode == 0, run.output
    for rank in (0, 1):  # outer prefix, inner prefix: outer rank R is inner node R, running inner rank R
        expected = (f"[rank={rank}] [rank={rank}] inner rank={rank} of 2 node={rank} master={CHIEF}:{port} "
                    f"DET_CHIEF_IP={CHIEF}")
        assert run.stdout.splitlines().count(expected) == 1, run.output


def test_an_inner_ranks_exit_code_comes_out_of_both_layers(detlaunch_runner: DetlaunchRunner) -> None:
    run, _ = nested_job(detlaunch_runner, "mpirun", env={"INNER_FAIL_RANK": "1", "INNER_FAIL_CODE": "5"})
    assert run.returncode == 5, run.output
    assert "[rank=1] [rank=1] inner rank 1 fails on purpose" in run.stderr, run.output
    assert "[rank=0] detlaunch: job failed: rank 1 on node 1 " in run.stderr, run.output  # the inner chief's report
