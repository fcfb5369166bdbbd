"""Scripts of the kinds users bring from torchrun, horovodrun and deepspeed (written here, in the
way those projects' tutorials and benchmarks write them), run under each layer with nothing changed
but the device: two nodes on loopback (one node's path, the same less the second node, is each layer's own
tests'; the mnist-style script runs on one)."""

from __future__ import annotations

import pytest
from detlaunch.testing.runner import Completed
from support.helpers import free_port
from support.jobs import SCRIPTS, Launcher

pytestmark = pytest.mark.timeout(300)

DDP = str(SCRIPTS / "ddp_train.py")
HVD = str(SCRIPTS / "hvd_synthetic.py")
HVD_MNIST = str(SCRIPTS / "hvd_mnist.py")


def run_job(launcher: Launcher, layer: str, nodes: int, script: str, *extra: str) -> list[Completed]:
    """Start one detlaunch per node (2 ranks each); return every node's end, all exited 0 (torch's abort in a
    rank's teardown after its work, about 1 run in 6 with gloo, does not fail the job: docs/RESTARTS.md)."""
    port = str(free_port())
    if layer in ("torchrun", "direct"):
        common = ["--layer", layer, "--nnodes", str(nodes), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                  "--master-port", port]
        per_node = [["--node-rank", str(n), "--node-addr", f"127.0.0.{n + 1}"] for n in range(nodes)]
    else:
        common = ["--layer", layer, "--hosts", ",".join(f"127.0.0.{n + 1}:2" for n in range(nodes)),
                  "--master-port", port, "--ssh-port", str(free_port("127.0.0.2"))]
        per_node = [["--node-rank", str(n)] for n in range(nodes)]
    jobs = [launcher.start(*common, *per_node[n], *extra, script) for n in reversed(range(nodes))]
    done = [job.wait(240) for job in jobs]
    for d in done:
        assert d.returncode == 0, d.output
    return done


@pytest.mark.parametrize("layer", ["torchrun", "deepspeed", "direct"])
def test_a_ddp_tutorial_style_script(launcher: Launcher, layer: str, nodes: int = 2) -> None:
    """Every rank trains and ends with the same weights, and the job exits 0."""
    extra = ("--no-local-rank",) if layer == "deepspeed" else ()  # the script reads LOCAL_RANK, as tutorials do
    out = "".join(d.stdout for d in run_job(launcher, layer, nodes, DDP, *extra))
    world = 2 * nodes
    for rank in range(world):
        line = next(x for x in out.splitlines() if x.startswith(f"[rank={rank}] rank {rank}/{world} "))
        assert line.endswith("same weights: True"), out
        before, after = (float(v) for v in line.split("loss ")[1].split(",")[0].split(" -> "))
        assert after < before, line  # it learned


def test_a_horovod_synthetic_benchmark_style_script(launcher: Launcher, nodes: int = 2) -> None:
    out = "".join(d.stdout for d in run_job(launcher, "horovod", nodes, HVD))
    world = 2 * nodes
    for rank in range(world):
        assert f"[rank={rank}] rank {rank}/{world}: " in out and out.count("same weights: True") == world, out


def test_a_horovod_mnist_style_script(launcher: Launcher) -> None:
    """DataLoader + DistributedSampler, hvd.DistributedOptimizer, test metrics averaged with hvd.allreduce;
    OMP_NUM_THREADS unset, as in a new user's shell (the suite sets it): cold ranks, said in one line."""
    launcher.env.pop("OMP_NUM_THREADS", None)
    [done] = run_job(launcher, "horovod", 1, HVD_MNIST)
    out = done.stdout
    said = [line for line in done.stderr.splitlines() if "warm ranks:" in line]
    assert len(said) == 1 and "OMP_NUM_THREADS is unset" in said[0], done.stderr
    lines = {rank: next((x for x in out.splitlines() if x.startswith(f"[rank={rank}] rank {rank}/2: ")), "")
             for rank in range(2)}
    assert all(lines.values()), out
    # 512 samples, 2 replicas, batches of 32, 2 epochs: 16 steps on each rank.
    metrics = {line.split(": ", 1)[1] for line in lines.values()}
    assert len(metrics) == 1, lines  # averaged over the ranks: the same numbers on both
    [metric] = metrics
    assert metric.startswith("16 steps, test set: average loss ") and metric.endswith("same weights: True"), metric
    loss = float(metric.split("average loss ")[1].split(",")[0])
    assert loss < 2.30, metric  # below chance (ln 10 = 2.303): it learned
