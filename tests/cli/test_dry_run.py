"""`--dry-run`: this node's plan as an indented tree, or as JSON with the same content; nothing is started."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from support import paths
from support.helpers import free_port
from support.jobs import Launcher

pytestmark = pytest.mark.timeout(60)
WRAPPER = str(paths.CORE / "detlaunch" / "rank" / "run_wrapper.py")


def q(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """A script that leaves a mark if anything ever runs it."""
    path = tmp_path / "train.py"
    path.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    return path


def two_node_args(port: int, node_rank: int, script: Path) -> list[str]:
    args = ["--layer", "torchrun", "--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--node-rank", str(node_rank)]
    if node_rank:
        args += ["--node-addr", "127.0.0.2"]
    return [*args, "--dry-run", str(script), "--epochs", "3"]


def assert_nothing_started(launcher: Launcher, script: Path) -> None:
    assert not (script.parent / "ran").exists(), "the script ran"
    assert list((launcher.tmpdir).iterdir()) == [], "something was created in TMPDIR"
    assert not (launcher.cache / "detlaunch").exists(), "the shared job directory was created"
    assert not [p for p in launcher.root.iterdir() if p.name.startswith("rank-")]


def expected_torchrun(port: int, node_rank: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
            "--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--max-restarts", "0", "--local-addr", "127.0.0.2" if node_rank else "127.0.0.1", "--no-python"]


def check_json(plan: Any, port: int, node_rank: int, script: Path, tmpdir: Path) -> str:
    """Check the JSON plan of one node of the 2-node job; return its run directory."""
    role = "worker" if node_rank else "chief"
    job = plan["cluster"]["job_id"]
    run_dir = str(Path(plan["supervisor"]["socket"]).parent)
    assert Path(run_dir).parent in (tmpdir, Path("/tmp"))  # /tmp when TMPDIR is too deep for a socket path
    assert Path(run_dir).name.startswith("detlaunch-") and not Path(run_dir).exists()
    assert (plan["layer"], plan["role"]) == ("torchrun", role)
    assert {k: plan["cluster"][k] for k in ("node_addrs", "slots", "node_rank", "chief_addr", "provider")} == {
        "node_addrs": ["127.0.0.1", "127.0.0.2" if node_rank else None], "slots": [2, 2],
        "node_rank": node_rank, "chief_addr": "127.0.0.1", "provider": "static"}
    wrapper = [sys.executable, "-S", WRAPPER, "--job", job, "--grace", "30", "--rank-env", "RANK", "--"]
    command = [sys.executable, "-u", str(script), "--epochs", "3"]
    assert (plan["rank_wrapper"], plan["command"]) == (wrapper, command)
    [torchrun] = plan["commands"]
    assert torchrun["argv"] == expected_torchrun(port, node_rank) + wrapper + command
    assert (torchrun["name"], torchrun["daemon"], torchrun["stop_signal"]) == ("torchrun", False, 15)
    assert torchrun["env"] == {"TMPDIR": f"{run_dir}/tmp", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "35"}  # grace + 5 s
    assert plan["supervisor"]["expected_ranks"] == 2 and plan["supervisor"]["grace_period"] == 30.0
    env = plan["env"]
    assert {k: env[k] for k in ("DET_CHIEF_IP", "USE_TORCH_DISTRIBUTED", "DETLAUNCH_SUPERVISOR")} == {
        "DET_CHIEF_IP": "127.0.0.1", "USE_TORCH_DISTRIBUTED": "1", "DETLAUNCH_SUPERVISOR": f"{run_dir}/supervisor.sock"}
    assert not {"DETLAUNCH_NODE_RANK", "DETLAUNCH_JOB_ID"} & set(env)  # option mirrors: a nested detlaunch reads them
    return run_dir


def check_text(text: str, plan: Any, json_run_dir: str) -> None:
    """The tree shows what the JSON says: the header, the supervisor, the chain, the environment."""
    lines = text.splitlines()
    c = plan["cluster"]
    sup_prefix = "detlaunch supervisor  [socket "
    assert lines[1].startswith(sup_prefix), text
    run_dir = lines[1][len(sup_prefix):].split("/supervisor.sock;")[0]
    assert run_dir != json_run_dir  # a fresh random name each time
    lines = [line.replace(run_dir, "RUN") for line in lines]
    plan = json.loads(json.dumps(plan).replace(json_run_dir, "RUN"))

    assert lines[0] == (f"node {c['node_rank']} of 2 ({plan['role']}) · layer torchrun · job {c['job_id']} · "
                        "2 rank(s) here [--nproc-per-node], 4 in all · chief 127.0.0.1 (discovered by static)")
    assert lines[1] == "detlaunch supervisor  [socket RUN/supervisor.sock; grace 30 s; start timeout 300 s; " \
                       "expects 2 rank(s)]"
    [cmd] = plan["commands"]
    own = cmd["argv"][: cmd["argv"].index("--no-python") + 1]
    branch = next(i for i, line in enumerate(lines) if line.endswith(f"{q(own)}  [stop with SIGTERM]"))
    assert lines[branch] == f"└── {q(own)}  [stop with SIGTERM]"  # the last (only) command of the node
    assert lines[branch + 1: branch + 5] == [
        "        env TMPDIR=RUN/tmp",
        "        env TORCH_ELASTIC_SHUTDOWN_TIMEOUT=35",
        f"    └── {q(plan['rank_wrapper'])}  [one per rank]",
        f"        └── {q(plan['command'])}",
    ]
    start = lines.index("environment added for every process:")
    assert lines[start + 1: start + 1 + len(plan["env"])] == [f"  {k}={v}" for k, v in sorted(plan["env"].items())]
    rest = lines[start + 1 + len(plan["env"]):]
    assert rest[:2] == ["environment removed: " + ", ".join(plan["unset_env"]),
                        "every rank gets, unless its environment has it:"]
    assert rest[-1] == "  TORCH_NCCL_ASYNC_ERROR_HANDLING=1" and "TORCHINDUCTOR_CACHE_DIR=" in " ".join(rest[2:])


@pytest.mark.parametrize("node_rank", [0, 1], ids=["chief", "worker"])
def test_two_node_plan_as_tree_and_json(launcher: Launcher, script: Path, node_rank: int) -> None:
    port = free_port()
    args = two_node_args(port, node_rank, script)
    j = launcher.run(*args[:-3], "--format", "json", *args[-3:], timeout=30)
    assert (j.returncode, j.stderr) == (0, ""), j.output
    plan = json.loads(j.stdout)
    run_dir = check_json(plan, port, node_rank, script, launcher.tmpdir)
    t = launcher.run(*args, timeout=30)
    assert (t.returncode, t.stderr) == (0, ""), t.output
    check_text(t.stdout, plan, run_dir)
    assert_nothing_started(launcher, script)


def test_chief_and_worker_derive_the_same_job_id(launcher: Launcher, script: Path) -> None:
    port = free_port()
    ids = []
    for node_rank in (0, 1):
        args = two_node_args(port, node_rank, script)
        r = launcher.run(*args[:-3], "--format", "json", *args[-3:], timeout=30)
        assert r.returncode == 0, r.output
        ids.append(json.loads(r.stdout)["cluster"]["job_id"])
    assert ids[0] == ids[1] and ids[0].startswith("dl-")
    assert_nothing_started(launcher, script)


def test_the_plan_says_where_the_ranks_a_node_came_from(launcher: Launcher, script: Path) -> None:
    # the recommended step (--ntasks-per-node=1) on an 8-GPU node of a cluster that gives GPUs
    step = {"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "localhost",
            "SLURM_STEP_NODELIST": "localhost", "SLURM_NODEID": "0", "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7"}
    args = ("--layer", "torchrun", "--master-port", str(free_port()), "--dry-run")
    unset = ("env", "-u", "CUDA_VISIBLE_DEVICES")
    t = launcher.start(*args, str(script), env=step, prefix=unset).wait(30)
    assert t.returncode == 0, t.output
    assert " · 8 rank(s) here [SLURM_STEP_GPUS=0,1,2,3,4,5,6,7], 8 in all · " in t.stdout.splitlines()[0]
    j = launcher.start(*args, "--format", "json", str(script), env=step, prefix=unset).wait(30)
    assert j.returncode == 0, j.output
    cluster = json.loads(j.stdout)["cluster"]
    assert (cluster["slots"], cluster["sources"]["slots"]) == ([8], "SLURM_STEP_GPUS=0,1,2,3,4,5,6,7")
    # CUDA reads "0,-1,2" as one device
    r = launcher.run("--layer", "torchrun", "--dry-run", str(script), env={"CUDA_VISIBLE_DEVICES": "0,-1,2"},
                     timeout=30)
    assert r.returncode == 0, r.output
    assert " · 1 rank(s) here [CUDA_VISIBLE_DEVICES=0,-1,2: 1 device(s) as CUDA reads it], 1 in all · " in \
        r.stdout.splitlines()[0]
    assert_nothing_started(launcher, script)


def test_nested_worker_takes_the_chief_from_det_chief_ip(launcher: Launcher, script: Path) -> None:
    r = launcher.run("--layer", "torchrun", "--nnodes", "2", "--node-rank", "1", "--dry-run", "--format", "json",
                     str(script), env={"DET_CHIEF_IP": "127.0.0.3"}, timeout=30)
    assert r.returncode == 0, r.output
    plan = json.loads(r.stdout)
    argv = plan["commands"][0]["argv"]
    assert argv[argv.index("--master-addr") + 1] == "127.0.0.3"
    assert (plan["env"]["DET_CHIEF_IP"], plan["cluster"]["sources"]["chief"]) == ("127.0.0.3", "DET_CHIEF_IP")
    assert_nothing_started(launcher, script)


def test_single_node_plan_uses_localhost(launcher: Launcher, script: Path) -> None:
    port = free_port()
    r = launcher.run("--layer", "torchrun", "--nproc-per-node", "3", "--master-port", str(port), "--dry-run",
                     "--format", "json", str(script), timeout=30)
    assert r.returncode == 0, r.output
    plan = json.loads(r.stdout)
    argv = plan["commands"][0]["argv"]
    assert argv[: argv.index("--no-python") + 1] == [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "3", "--node-rank",
        "0", "--master-addr", "localhost", "--master-port", str(port), "--max-restarts", "0", "--no-python"]
    assert (plan["role"], plan["cluster"]["provider"], plan["env"]["DET_CHIEF_IP"]) == ("chief", "local", "127.0.0.1")
    assert_nothing_started(launcher, script)


def test_a_rank_can_plan_a_nested_job(launcher: Launcher, script: Path) -> None:
    port = free_port()
    args = two_node_args(port, 1, script)
    outer = launcher.run(*args[:-3], "--format", "json", *args[-3:], timeout=30)
    assert outer.returncode == 0, outer.output
    rank_env = json.loads(outer.stdout)["env"]  # what every process of the outer job's node 1 is given
    inner = launcher.run("--layer", "torchrun", "--master-port", str(free_port()), "--dry-run", "--format", "json",
                         str(script), env=rank_env, timeout=30)
    assert inner.returncode == 0, inner.output
    plan = json.loads(inner.stdout)
    assert plan["cluster"]["node_rank"] == 0
    assert plan["cluster"]["job_id"] != json.loads(outer.stdout)["cluster"]["job_id"]
    assert plan["cluster"]["chief_addr"] == "127.0.0.1"  # DET_CHIEF_IP, honoured


def test_the_plan_says_when_the_next_attempts_launcher_is_started_ahead(launcher: Launcher, script: Path) -> None:
    tag = "next attempt's started ahead: torch.distributed.run:main"
    with_restarts = launcher.run("--layer", "torchrun", "--nproc-per-node", "2", "--max-restarts", "1",
                                 "--dry-run", str(script), timeout=30)
    without = launcher.run("--layer", "torchrun", "--nproc-per-node", "2", "--dry-run", str(script), timeout=30)
    assert with_restarts.returncode == 0 and without.returncode == 0
    assert [line for line in with_restarts.stdout.splitlines() if tag in line][0].startswith("└── ")
    assert tag not in without.stdout
    plan = json.loads(launcher.run("--layer", "torchrun", "--nproc-per-node", "2", "--max-restarts", "1", "--dry-run",
                                   "--format", "json", str(script), timeout=30).stdout)
    assert [c["standby"] for c in plan["commands"]] == ["torch.distributed.run:main"], plan["commands"]
    # Only lost-node restarts: on one node none can follow (no standby is started, none is shown); on two, one can.
    node_only = ("--layer", "torchrun", "--max-restarts", "0", "--max-node-restarts", "2", "--dry-run")
    one_node = launcher.run(*node_only, "--nproc-per-node", "2", str(script), timeout=30)
    two_nodes = launcher.run(*node_only, "--hosts", "127.0.0.1:2,127.0.0.2:2", "--node-rank", "0", str(script),
                             timeout=30)
    assert one_node.returncode == 0 and two_nodes.returncode == 0, one_node.output + two_nodes.output
    assert tag not in one_node.stdout and tag in two_nodes.stdout


def test_restarts_after_counts_what_can_still_follow_an_attempt() -> None:
    from detlaunch.restarts.policy import RestartPolicy

    assert RestartPolicy(max_restarts=2).restarts_after(1, num_nodes=1) == 2
    assert RestartPolicy(max_restarts=2).restarts_after(3, num_nodes=1) == 0
    assert RestartPolicy(max_restarts=0, max_node_restarts=2).restarts_after(1, num_nodes=1) == 0  # no node to lose
    assert RestartPolicy(max_restarts=1, max_node_restarts=2).restarts_after(1, num_nodes=2) == 3
