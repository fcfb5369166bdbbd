"""The horovod layer, for real: horovodrun (gloo), per-job sshd workers on 127.0.0.2, horovod.torch ranks."""

from __future__ import annotations

import itertools
import json
import signal

import pytest
from detlaunch_horovod.layer import create_run_command
from support.helpers import free_port, rank_lines, report_line
from support.jobs import EXAMPLES, SCRIPTS, Launcher

pytestmark = pytest.mark.timeout(240)
HVD = str(EXAMPLES / "hvd_allreduce.py")
RANKS = str(SCRIPTS / "ranks.py")


@pytest.mark.parametrize(
    ("debug", "auto_tune", "tensor_fusion_threshold", "tensor_fusion_cycle_time"),
    list(itertools.product([True, False], [True, False], [64, 128, 512], [5, 20])),
)
def test_create_run_command(debug: bool, auto_tune: bool, tensor_fusion_threshold: int,
                            tensor_fusion_cycle_time: int) -> None:
    """The seed's test_create_run_command, on the layer's pure function with the seed's constants."""
    expected = ["horovodrun", "-np", "16", "-p", "12350", "-H", "localhost:8,128.140.2.4:8",
                "--start-timeout", "1200", "--gloo-timeout-seconds", "240"]
    if auto_tune:
        expected += ["--autotune", "--autotune-log-file", "/tmp/autotune_log.csv"]
    else:
        expected += ["--fusion-threshold-mb", str(tensor_fusion_threshold),
                     "--cycle-time-ms", str(tensor_fusion_cycle_time)]
    expected += ["--cache-capacity", "1024", "--no-hierarchical-allreduce", "--no-hierarchical-allgather"]
    if debug:
        expected.append("--verbose")
    expected.append("--")
    assert create_run_command(
        [8, 8], ["localhost", "128.140.2.4"], ssh_port=12350, autotune=auto_tune,
        autotune_log_file="/tmp/autotune_log.csv", fusion_threshold_mb=tensor_fusion_threshold,
        cycle_time_ms=tensor_fusion_cycle_time, debug=debug,
    ) == expected


def test_network_interface_and_overrides_follow_the_seed() -> None:
    cmd = create_run_command([2, 2], ["10.0.0.1", "10.0.0.2"], ssh_port=22, network_interface="eth1",
                             optional_args=["--mpi-args=-v"])
    assert cmd[cmd.index("--network-interface") + 1] == "eth1"
    assert cmd[-2:] == ["--mpi-args=-v", "--"]
    single = create_run_command([2], ["10.0.0.1"], ssh_port=22, network_interface="eth1")
    assert "--network-interface" not in single  # one machine: no inter-node interface


def hosts_args(ssh_port: int, *extra: str) -> list[str]:
    return ["--layer", "horovod", "--hosts", "127.0.0.1:2,127.0.0.2:2", "--ssh-port", str(ssh_port),
            "--master-port", str(free_port()), *extra]


def test_one_node_two_ranks_allreduce(launcher: Launcher) -> None:
    r = launcher.run("--layer", "horovod", "--nproc-per-node", "2", HVD)
    assert r.returncode == 0, r.output
    for rank in (0, 1):
        assert rank_lines(r.stdout, rank) == [f"rank {rank} of 2: hvd.allreduce sum = 1 (chief 127.0.0.1)"]
    assert "<stdout>" not in r.stdout  # horovodrun's own prefixing never happens: ranks write to the console


def test_two_nodes_four_ranks_over_the_workers_sshd(launcher: Launcher) -> None:
    args = hosts_args(free_port("127.0.0.2"))
    worker = launcher.start(*args, "--node-rank", "1", HVD)
    chief = launcher.start(*args, "--node-rank", "0", HVD)
    rc, rw = chief.wait(180), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    line = "of 4: hvd.allreduce sum = 6 (chief 127.0.0.1)"
    assert [rank_lines(rc.stdout, r) for r in (0, 1)] == [[f"rank {r} {line}"] for r in (0, 1)]
    assert [rank_lines(rw.stdout, r) for r in (2, 3)] == [[f"rank {r} {line}"] for r in (2, 3)]
    assert "job finished: 4 rank(s) exited 0" in rc.stderr
    assert launcher.leftovers() == []  # the worker's sshd and its sessions are gone


def test_a_failing_rank_on_the_worker_node_stops_both_nodes(launcher: Launcher) -> None:
    args = hosts_args(free_port("127.0.0.2"))
    env = {"FAIL_RANK": "2", "FAIL_CODE": "3", "SLEEP": "200"}
    worker = launcher.start(*args, "--node-rank", "1", RANKS, env=env)
    chief = launcher.start(*args, "--node-rank", "0", RANKS, env=env)
    rc, rw = chief.wait(120), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (3, 3), rc.output + rw.output
    assert report_line(rc.stderr) == "detlaunch: job failed: rank 2 on node 1 (127.0.0.2) exited with code 3"
    assert "detlaunch:   | something broke in rank 2" in rc.stderr
    assert report_line(rw.stderr) == "detlaunch: job failed: rank 2 on node 1 (127.0.0.2) exited with code 3"
    assert rank_lines(rc.stdout, 0)[-1] == "rank 0 sleeping"
    assert rc.duration < 100  # the survivors would sleep 200 s


def test_sigint_to_the_chief_stops_everything_on_both_nodes(launcher: Launcher) -> None:
    args = hosts_args(free_port("127.0.0.2"))
    worker = launcher.start(*args, "--node-rank", "1", RANKS, env={"SLEEP": "200"})
    chief = launcher.start(*args, "--node-rank", "0", RANKS, env={"SLEEP": "200"})
    for job, rank in ((chief, 0), (chief, 1), (worker, 2), (worker, 3)):
        job.wait_for_output(f"[rank={rank}] rank {rank} sleeping", timeout=120)
    chief.send_signal(signal.SIGINT)
    rc, rw = chief.wait(60), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (130, 130), rc.output + rw.output
    assert "job interrupted by SIGINT" in rc.stderr
    assert "node 0 was interrupted by SIGINT" in rw.stderr
    assert launcher.leftovers() == []


def test_auto_runs_a_single_slot_job_without_horovodrun(launcher: Launcher) -> None:
    plan = json.loads(launcher.run("--layer", "horovod", "--auto", "--nproc-per-node", "1",
                                   "--dry-run", "--format", "json", HVD).stdout)
    assert [c["name"] for c in plan["commands"]] == ["rank"]
    r = launcher.run("--layer", "horovod", "--auto", "--nproc-per-node", "1", HVD)
    assert r.returncode == 0, r.output
    assert rank_lines(r.stdout, 0) == ["rank 0 of 1: hvd.allreduce sum = 0 (chief 127.0.0.1)"]


def test_dry_run_shows_the_chief_and_worker_chains(launcher: Launcher) -> None:
    args = ["--layer", "horovod", "--hosts", "127.0.0.1:2,127.0.0.2:2", "--ssh-port", "12350", "--dry-run"]
    chief = launcher.run(*args, "--node-rank", "0", HVD)
    worker = launcher.run(*args, "--node-rank", "1", HVD)
    assert chief.returncode == worker.returncode == 0
    assert "waits for the sshd greeting of 127.0.0.2:12350" in chief.stdout
    assert "horovodrun -np 4 -p 12350 -H localhost:2,127.0.0.2:2" in chief.stdout
    assert "[stop with SIGINT]" in chief.stdout
    assert "run_wrapper.py" in chief.stdout and "hvd_allreduce.py" in chief.stdout
    assert "sshd -D -e -f" in worker.stdout and "[daemon, stop with SIGTERM]" in worker.stdout
    assert "horovodrun" not in worker.stdout
    assert "USE_HOROVOD=1" in chief.stdout and "DET_CHIEF_IP=127.0.0.1" in worker.stdout


def test_options_come_from_flags_and_from_the_config_files_horovod_section(launcher: Launcher, tmp_path) -> None:
    config = tmp_path / "detlaunch.toml"
    config.write_text("[detlaunch]\nlayer = 'horovod'\n\n[horovod]\nfusion_threshold_mb = 32\ncycle_time_ms = 3.5\n")
    base = ["--config", str(config), "--nproc-per-node", "2", "--dry-run", "--format", "json"]

    def horovodrun(*args: str, env: dict[str, str] | None = None) -> list[str]:
        r = launcher.run(*base, *args, HVD, env=env)
        assert r.returncode == 0, r.output
        plan = json.loads(r.stdout)
        assert "SLURM_JOBID" in plan["unset_env"]  # would make horovod pack every rank on this node
        return plan["commands"][0]["argv"]

    argv = horovodrun()
    assert argv[argv.index("--fusion-threshold-mb") + 1] == "32" and argv[argv.index("--cycle-time-ms") + 1] == "3.5"
    argv = horovodrun(env={"DETLAUNCH_FUSION_THRESHOLD_MB": "16"})
    assert argv[argv.index("--fusion-threshold-mb") + 1] == "16"  # the variable beats the file
    argv = horovodrun("--fusion-threshold-mb", "8", env={"DETLAUNCH_FUSION_THRESHOLD_MB": "16"})
    assert argv[argv.index("--fusion-threshold-mb") + 1] == "8"  # the flag beats both
    argv = horovodrun("--autotune")
    assert "--fusion-threshold-mb" not in argv and argv[argv.index("--autotune-log-file") + 1].endswith(
        "horovod_autotune_log.csv")


def test_slurm_jobid_never_reaches_horovodrun(launcher: Launcher, tmp_path) -> None:
    script = tmp_path / "env.py"
    script.write_text("import os\nprint('SLURM_JOBID' in os.environ, os.environ.get('USE_HOROVOD'))\n")
    r = launcher.run("--layer", "horovod", "--cluster", "local", "--nproc-per-node", "2", str(script),
                     env={"SLURM_JOBID": "42"})
    assert r.returncode == 0, r.output
    assert rank_lines(r.stdout, 0) == rank_lines(r.stdout, 1) == ["False 1"]
