"""The direct layer, for real: no launcher; each node's supervisor starts its ranks with torchrun's environment.

The first test is the layer's promise: a script written for torchrun, run under `--layer torchrun`
and `--layer direct` with the same flags, sees the same environment, argv and working directory,
on one node and on two (127.0.0.1 and 127.0.0.2), but for the values listed in NOT_THE_SAME.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
from detlaunch.errors import ConfigError
from detlaunch.planning.cpu_binding import cpu_sets
from detlaunch.rank.affinity import parse_cpu_list
from support.helpers import free_port, rank_lines, report_line
from support.jobs import EXAMPLES, SCRIPTS, Launcher

pytestmark = pytest.mark.timeout(240)
ALLREDUCE = str(EXAMPLES / "allreduce.py")
RANKS = str(SCRIPTS / "ranks.py")
SEEN = str(SCRIPTS / "torchrun_env.py")

# What differs between the two, and why (anything else that differs fails the test):
NOT_THE_SAME = {
    # The job's private run directory is random by nature (`detlaunch-<64 random bits>`), under both.
    "DETLAUNCH_SUPERVISOR", "DETLAUNCH_PROGRESS_FILE", "TMPDIR",
    # Under both, a file in that private temp folder; torchrun's path also holds mkdtemp's random names.
    "TORCHELASTIC_ERROR_FILE",
    # torchrun's agent hosts the rendezvous store (True); with no agent, rank 0 hosts it (False), which
    # is what torch's env:// rendezvous does outside torchrun. Checked exactly below.
    "TORCHELASTIC_USE_AGENT_STORE",
    # Each run gets its own free port.
    "MASTER_PORT",
    # torchrun's own shutdown timeout, set for torchrun past --grace-period (no launcher, no such timeout).
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
}


def shape_args(layer: str, nodes: int, node: int, port: int) -> list[str]:
    args = ["--layer", layer, "--nproc-per-node", "2", "--master-port", str(port)]
    if nodes > 1:
        args += ["--nnodes", str(nodes), "--node-rank", str(node), "--master-addr", "127.0.0.1",
                 "--node-addr", f"127.0.0.{node + 1}"]
    return args


def run_job(launcher: Launcher, layer: str, nodes: int, script: str, env: dict[str, str] | None = None,
            ) -> list[tuple[int, str, str]]:
    """Run a job of `nodes` x 2 ranks; each node's (exit code, stdout, stderr)."""
    port = free_port()  # the master port, and the next one (the link port) too
    jobs = [launcher.start(*shape_args(layer, nodes, n, port), script, env=env) for n in reversed(range(nodes))]
    done = [job.wait(180) for job in reversed(jobs)]
    return [(d.returncode, d.stdout, d.stderr) for d in done]


def seen_by_each_rank(launcher: Launcher, layer: str, nodes: int) -> dict[int, dict[str, object]]:
    seen: dict[int, dict[str, object]] = {}
    for code, stdout, stderr in run_job(launcher, layer, nodes, SEEN):
        assert code == 0, stdout + stderr
        for line in stdout.splitlines():
            m = re.fullmatch(r"\[rank=(\d+)\] SEEN (.*)", line)
            if m:
                seen[int(m.group(1))] = json.loads(m.group(2))
    assert sorted(seen) == list(range(2 * nodes)), seen
    return seen


@pytest.mark.parametrize("nodes", [1, 2], ids=["1x2", "2x2"])
def test_a_torchrun_script_cannot_tell_the_difference(launcher: Launcher, nodes: int) -> None:
    under_torchrun = seen_by_each_rank(launcher, "torchrun", nodes)
    under_direct = seen_by_each_rank(launcher, "direct", nodes)
    for rank in range(2 * nodes):
        t, d = under_torchrun[rank], under_direct[rank]
        assert (t["argv"], t["cwd"]) == (d["argv"], d["cwd"])
        t_env, d_env = dict(t["env"]), dict(d["env"])  # type: ignore[call-overload]
        differ = {k for k in t_env.keys() | d_env.keys() if t_env.get(k) != d_env.get(k)}
        assert differ <= NOT_THE_SAME, {k: (t_env.get(k), d_env.get(k)) for k in differ - NOT_THE_SAME}
        assert (t_env["TORCHELASTIC_USE_AGENT_STORE"], d_env["TORCHELASTIC_USE_AGENT_STORE"]) == ("True", "False")
        for env in (t_env, d_env):
            assert env["TORCHELASTIC_ERROR_FILE"].startswith(env["TMPDIR"] + os.sep), env
            assert env["TMPDIR"] == os.path.join(os.path.dirname(env["DETLAUNCH_SUPERVISOR"]), "tmp")
        # what torchrun's agent sets, as it sets it (spelled out, so that both cannot be wrong together)
        expected = {"RANK": str(rank), "LOCAL_RANK": str(rank % 2), "WORLD_SIZE": str(2 * nodes),
                    "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": str(rank // 2), "GROUP_WORLD_SIZE": str(nodes),
                    "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(2 * nodes), "ROLE_NAME": "default",
                    "MASTER_ADDR": "localhost" if nodes == 1 else "127.0.0.1", "OMP_NUM_THREADS": "1",
                    "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0",
                    "TORCHELASTIC_MAX_RESTARTS": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
        assert {k: d_env.get(k) for k in expected} == expected


def test_gloo_all_reduce_on_one_node(launcher: Launcher) -> None:
    [(code, stdout, stderr)] = run_job(launcher, "direct", 1, ALLREDUCE)
    assert code == 0, stdout + stderr
    for rank in (0, 1):
        assert rank_lines(stdout, rank) == [f"rank {rank} of 2: all_reduce sum = 1 (chief 127.0.0.1)"]
    assert "job finished: 2 rank(s)" in stderr


def test_gloo_all_reduce_on_two_nodes(launcher: Launcher) -> None:
    nodes = run_job(launcher, "direct", 2, ALLREDUCE)
    assert [code for code, _, _ in nodes] == [0, 0], nodes
    expected = "of 4: all_reduce sum = 6 (chief 127.0.0.1)"
    for rank in range(4):
        assert rank_lines(nodes[rank // 2][1], rank) == [f"rank {rank} {expected}"], nodes


ONE_SIGTERM = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
def on_term(signum, frame):
    print(f"rank {rank} got SIGTERM", flush=True)
signal.signal(signal.SIGTERM, on_term)
print(f"rank {rank} ready", flush=True)
if rank == 1:
    with open(os.environ["TRIGGER"], "rb") as fifo:
        fifo.read(1)
    sys.exit(3)
deadline = time.monotonic() + 300
while time.monotonic() < deadline:  # until SIGKILLed at the end of the grace period
    time.sleep(0.05)
"""


def test_a_failing_rank_stops_the_others_with_one_signal_each(launcher: Launcher, tmp_path: Path) -> None:
    script, trigger = tmp_path / "one_sigterm.py", tmp_path / "trigger"
    script.write_text(ONE_SIGTERM)
    os.mkfifo(trigger)
    job = launcher.start(*shape_args("direct", 1, 0, free_port()), "--grace-period", "2", str(script),
                         env={"TRIGGER": str(trigger)})
    job.wait_for_output("[rank=0] rank 0 ready")
    job.wait_for_output("[rank=1] rank 1 ready")
    trigger.write_bytes(b"x")
    r = job.wait(60)
    assert r.returncode == 3, r.output
    assert report_line(r.stderr) == "detlaunch: job failed: rank 1 on node 0 (127.0.0.1) exited with code 3"
    # The supervisor signals a rank it started once, through its wrapper; SIGKILL after the grace period.
    assert rank_lines(r.stdout, 0) == ["rank 0 ready", "rank 0 got SIGTERM"], r.output
    assert "rank 0 (node 0): SIGKILLed by detlaunch (it had not stopped when asked)" in r.stderr, r.stderr
    assert r.duration < 30


def test_a_node_is_two_detlaunch_processes_and_none_of_them_or_the_wrappers_maps_openssl(launcher: Launcher) -> None:
    """What a node costs (issue 17: <= 30 MB): as root the detlaunch command makes the PID namespace itself, so
    the supervisor (the namespace's pid 1) is its child, no process between (an ordinary user has one, see
    isolation.py); and no process of detlaunch's loads OpenSSL's libcrypto (~3 MB each: cli.without_openssl_hashes)."""
    job = launcher.start(*shape_args("direct", 1, 0, free_port()), RANKS, env={"SLEEP": "120"})
    for rank in (0, 1):
        job.wait_for_output(f"[rank={rank}] rank {rank} sleeping")
    top = psutil.Process(job.proc.pid)
    tree = {p.pid: (p.ppid(), p.cmdline()) for p in [top, *top.children(recursive=True)]}
    detlaunch = [pid for pid, (_, argv) in tree.items() if argv[1:3] == ["-m", "detlaunch"]]
    wrappers = [pid for pid, (_, argv) in tree.items() if any(a.endswith("rank/run_wrapper.py") for a in argv[:3])]
    maps = {pid: Path(f"/proc/{pid}/maps").read_text() for pid in [*detlaunch, *wrappers]}
    job.send_signal(signal.SIGTERM)
    assert job.wait(60).returncode == 143
    if os.getuid() == 0:
        assert detlaunch == [top.pid, detlaunch[1]] and tree[detlaunch[1]][0] == top.pid, tree
    assert len(detlaunch) == (2 if os.getuid() == 0 else 3) and len(wrappers) == 2, tree
    for pid, text in maps.items():
        assert "libcrypto" not in text, (tree[pid], [line for line in text.splitlines() if "crypto" in line])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_detlaunch_reaches_every_rank(launcher: Launcher, sig: signal.Signals) -> None:
    job = launcher.start(*shape_args("direct", 1, 0, free_port()), RANKS, env={"SLEEP": "120"})
    job.wait_for_output("[rank=0] rank 0 sleeping")
    job.wait_for_output("[rank=1] rank 1 sleeping")
    job.send_signal(sig)
    r = job.wait(60)
    assert r.returncode == 128 + sig, r.output
    assert f"job interrupted by {sig.name}" in r.stderr
    for rank in (0, 1):
        last = "interrupted" if sig == signal.SIGINT else "sleeping"
        assert rank_lines(r.stdout, rank)[-1] == f"rank {rank} {last}", r.output
        assert re.search(rf"^detlaunch:   rank {rank} \(node 0\): .*\(stopped by detlaunch\)$", r.stderr, re.M)
    assert r.duration < 60


def test_the_plan_shows_each_rank_and_no_launcher(launcher: Launcher) -> None:
    r = launcher.run(*shape_args("direct", 2, 1, free_port()), "--dry-run", RANKS, timeout=60)
    assert r.returncode == 0, r.output
    lines = r.stdout.splitlines()
    assert "└── 2 rank(s) started by the supervisor itself, no launcher  [stop with SIGTERM]" in lines, r.stdout
    assert "    │   env GROUP_RANK=1" in lines and "    │   env WORLD_SIZE=4" in lines, r.stdout
    assert any(line.startswith("    ├── rank 2: LOCAL_RANK=0 RANK=2 ROLE_RANK=2 ") for line in lines), r.stdout
    assert any(line.startswith("    ├── rank 3: LOCAL_RANK=1 RANK=3 ROLE_RANK=3 ") for line in lines), r.stdout
    as_json = launcher.run(*shape_args("direct", 2, 1, free_port()), "--dry-run", "--format", "json", RANKS)
    commands = json.loads(as_json.stdout)["commands"]
    assert [(c["rank"], c["env"]["RANK"], c["daemon"]) for c in commands] == [(2, "2", False), (3, "3", False)]


def test_the_master_addr_given_on_one_node_reaches_every_rank(launcher: Launcher) -> None:
    """As the torchrun layer: on one node --master-addr wins over localhost (multi-node: the chief)."""
    r = launcher.run("--layer", "direct", "--nproc-per-node", "2", "--master-addr", "127.0.0.5", "--master-port",
                     str(free_port("127.0.0.5")), "--dry-run", "--format", "json", RANKS, timeout=60)
    assert r.returncode == 0, r.output
    assert [c["env"]["MASTER_ADDR"] for c in json.loads(r.stdout)["commands"]] == ["127.0.0.5", "127.0.0.5"]


@pytest.mark.parametrize("layer", ["direct", "torchrun"])
def test_a_command_that_cannot_start_ends_127_with_the_reason(launcher: Launcher, layer: str, tmp_path: Path) -> None:
    """Not "its wrapper was killed before it could report": the shell's code and the kernel's reason."""
    program = tmp_path / "train"
    program.write_text("#!/nonexistent/python\n")
    program.chmod(0o755)
    r = launcher.run("--layer", layer, "--nproc-per-node", "2", "--master-port", str(free_port()), "--",
                     str(program), timeout=120)
    assert r.returncode == 127, r.output
    why = f"cannot start {program}: No such file or directory (the interpreter on its #! line is missing)"
    assert f"detlaunch:   | {why}" in r.stderr.splitlines(), r.stderr
    assert "exited with code 127" in report_line(r.stderr) and "killed before" not in r.stderr, r.stderr


def test_launcher_options_are_refused_in_one_line(launcher: Launcher) -> None:
    r = launcher.run(*shape_args("direct", 1, 0, free_port()), "--rdzv-backend", "c10d", "--", RANKS, timeout=60)
    assert r.returncode == 2, r.output
    assert r.stderr.strip().splitlines() == [
        "detlaunch: error: the direct layer runs no launcher, so nothing takes '--rdzv-backend c10d': "
        "put the script's own arguments after it"], r.stderr


def test_ranks_start_once_every_node_is_there(launcher: Launcher, tmp_path: Path) -> None:
    """No rendezvous but the job link: a worker started long before the chief starts no rank until it
    joined, so it can neither finish alone nor leave the chief waiting for a node that came and went."""
    port = free_port()
    worker = launcher.start(*shape_args("direct", 2, 1, port), "--start-timeout", "60", RANKS)
    time.sleep(3)  # the worker dials and retries meanwhile; its ranks must not run yet
    assert "[rank=" not in worker.read() and worker.proc.poll() is None, worker.read()
    chief = launcher.start(*shape_args("direct", 2, 0, port), "--start-timeout", "60", RANKS)
    rc, rw = chief.wait(60), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    assert [rank_lines(rw.stdout, r)[-1] for r in (2, 3)] == ["rank 2 done", "rank 3 done"], rw.output
    assert rc.duration < 30


def test_numa_binding_binds_each_rank_and_what_it_starts(launcher: Launcher, tmp_path: Path) -> None:
    """torchrun's --numa-binding under the direct layer: here one NUMA node of the machine's CPUs, so
    `exclusive` gives each of the node's ranks its own share; a process the rank starts is bound too."""
    try:
        expected = [sorted(parse_cpu_list(cpus)) for cpus in cpu_sets("exclusive", 2, {})]
    except ConfigError as e:  # one physical core (its hyperthreads cannot be divided)
        pytest.skip(str(e))
    script = tmp_path / "cpus.py"
    script.write_text("import os, subprocess, sys\n"
                      "show = 'import os; print(sorted(os.sched_getaffinity(0)))'\n"
                      "child = subprocess.run([sys.executable, '-c', show], capture_output=True, text=True)\n"
                      "print(os.environ['RANK'], sorted(os.sched_getaffinity(0)), child.stdout.strip(),\n"
                      "      'DETLAUNCH_CPUS' in os.environ)\n")
    r = launcher.run(*shape_args("direct", 1, 0, free_port()), "--numa-binding", "exclusive", str(script), timeout=60)
    assert r.returncode == 0, r.output
    assert expected[0] != expected[1] and set(expected[0]) | set(expected[1]) <= os.sched_getaffinity(0)
    for rank in (0, 1):
        assert rank_lines(r.stdout, rank) == [f"{rank} {expected[rank]} {expected[rank]} False"], r.output
