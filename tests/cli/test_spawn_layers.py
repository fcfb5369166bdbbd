"""--spawn ssh with each built-in layer that reaches other nodes (torchrun, horovod, deepspeed; direct: in
test_spawn_ssh.py): 3 nodes from one command, over a real sshd on 127.0.0.2-4 for a throwaway user with their
own key and ssh config (tests/support/ssh_nodes.py). One job a layer, each checking at once what the issue asks:
every rank's real all_reduce; a script whose path and arguments hold spaces, quotes, `$` and unicode, run exactly
as given; variables from --export and .deepspeed_env (horovod: and mpirun's -x NAME, -x NAME=VALUE); then rank 2,
on node 2, fails: the job's exit code is its code, the chief's report names it, and nothing is left on any node
(the per-job sshds and their sessions too).
deepspeed's job picks its nodes and devices from a hostfile with --exclude, as deepspeed's runner does.
"""

from __future__ import annotations

import pwd
from collections.abc import Iterator

import pytest
from support.helpers import free_port
from support.jobs import Launcher
from support.ssh_nodes import HOSTS, PYTHON, SshNodes, ssh_nodes

pytestmark = pytest.mark.timeout(420)

SCRIPT = """\
import os, sys, time
layer = os.environ["DL_LAYER"]
if layer == "horovod":
    import horovod.torch as hvd, torch
    hvd.init()
    rank, total = hvd.rank(), hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
else:
    import torch
    if layer == "deepspeed":
        import deepspeed, deepspeed.comm as dist
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
    rank, t = dist.get_rank(), torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    total = t.item()
args = [a for a in sys.argv[1:] if not a.startswith("--local_rank=")]  # deepspeed's, put first
print("args", args, os.getcwd(), os.environ.get("DL_SHARED"), os.environ.get("DL_FILE"),
      os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("DL_XV"), os.environ.get("DL_XNAME"),
      f"sum {total:g}", flush=True)
if rank == 2:
    time.sleep(3)  # the others have printed by then
    print("something broke in rank 2", file=sys.stderr, flush=True)
    os._exit(7)  # as a crash would: horovod's own shutdown would tell the others first
time.sleep(300)
"""
TRICKY = "my dir/$x 'é\"q\".py"
ARGS = ["a b", "$HOME", "`id`; ls", "ünï"]
SHARED = "it's $shared"
PASSED = "PYTHONPATH,DETLAUNCH_CONTRACT_ID,DL_LAYER,DL_SHARED"
# deepspeed's hosts: 127.0.0.5 and a device of 127.0.0.4 excluded, as deepspeed's runner would.
HOSTFILE = f"{HOSTS[0]} slots=1\n{HOSTS[1]} slots=1\n127.0.0.5 slots=1\n{HOSTS[2]} slots=2\n"
EXCLUDE = f"127.0.0.5@{HOSTS[2]}:0"
X_VALUE = "x $v 'w'"  # horovod's -x NAME=VALUE
X_NAME = "from the spawning shell"  # horovod's -x NAME: DL_XNAME is set only where the command runs


@pytest.fixture
def nodes(throwaway_user: pwd.struct_passwd) -> Iterator[SshNodes]:
    with ssh_nodes(throwaway_user) as found:
        (found.home / "my dir").mkdir()
        (found.home / TRICKY).write_text(SCRIPT)
        (found.home / "hosts").write_text(HOSTFILE)
        # Read for every layer (a plain value: deepspeed's runner gives a shell its lines as they are).
        (found.home / ".deepspeed_env").write_text("DL_FILE=from-file\n")
        yield found


LAYER_ARGS = {
    "torchrun": ("--nproc_per_node", "1", "--hosts", ",".join(HOSTS)),
    # --network-interfaces: horovodrun's own probe of the hosts' interfaces runs a Python without the user's path
    # -x (mpirun's): NAME=VALUE as an argument every node's detlaunch reads, a bare NAME exported to every node
    "horovod": ("-H", ",".join(f"{h}:1" for h in HOSTS), "-p", "{ssh_port}", "--network-interfaces", "lo",
                "-x", f"DL_XV={X_VALUE}", "-x", "DL_XNAME"),
    "deepspeed": ("--hostfile", "hosts", "--exclude", EXCLUDE, "--ssh_port", "{ssh_port}"),
}


@pytest.mark.parametrize("layer", sorted(LAYER_ARGS))
def test_three_nodes_from_one_command_a_failure_on_node_2(layer: str, nodes: SshNodes, launcher: Launcher) -> None:
    ssh_port = str(free_port())
    args = [a.format(ssh_port=ssh_port) for a in LAYER_ARGS[layer]]
    env = {**nodes.env, "DL_LAYER": layer, "DL_SHARED": SHARED, "DL_XNAME": X_NAME}
    done = launcher.start("--layer", layer, *args, "--spawn", "ssh", "--master-port", str(free_port()),
                          "--grace-period", "5", "--export", PASSED, TRICKY, *ARGS, env=env, cwd=nodes.home,
                          command=(PYTHON, "-m", "detlaunch"), prefix=nodes.as_user).wait(timeout=360)
    assert done.returncode == 7, done.output
    devices = {"deepspeed": "1"}.get(layer)  # 127.0.0.4's device 0 excluded: its rank runs on device 1
    x = f"{X_VALUE} {X_NAME}" if layer == "horovod" else "None None"
    for rank in range(3):
        seen = devices if rank == 2 else ("0" if layer == "deepspeed" else None)
        assert f"[rank={rank}] args {ARGS!r} {nodes.home} {SHARED} from-file {seen} {x} sum 3" in done.stdout, \
            done.output
    cause = f"detlaunch: [node 0 ({HOSTS[0]})] job failed: rank 2 on node 2 ({HOSTS[2]}) exited with code 7"
    assert cause in done.stderr.splitlines(), done.output
    launcher.assert_no_leftovers(settle=15)
    nodes.no_processes_left()
