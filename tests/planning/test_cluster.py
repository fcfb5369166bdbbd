"""ClusterInfo, host lists and hostfiles, and the built-in discovery providers (static and local)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from detlaunch.errors import ClusterError, ConfigError
from detlaunch.planning.cluster import ClusterInfo, Host, parse_hostfile, parse_hosts
from detlaunch.planning.config import Config, apply_defaults, build_parser, parse
from detlaunch.planning.discovery import derived_job_id, local, static

pytestmark = pytest.mark.timeout(30)


def config(*argv: str, env: dict[str, str] | None = None) -> Config:
    """The Config the CLI would build from `argv` and `env` (no layer)."""
    env = env or {}
    parser = build_parser()
    apply_defaults(parser, env, {}, {}, None)
    ns, launcher_args, command = parse(parser, [*argv, "train.py"], env)
    return Config(layer="", command=tuple(command), launcher_args=tuple(launcher_args), options=vars(ns), env=env)


def discover(*argv: str, env: dict[str, str] | None = None) -> ClusterInfo:
    """What the CLI's firstresult hook call does: static first, local as the fallback."""
    c = config(*argv, env=env)
    return static.detlaunch_discover_cluster(c) or local.detlaunch_discover_cluster(c)


# -- ClusterInfo ----------------------------------------------------------------------------------


def info(**changes: Any) -> ClusterInfo:
    fields: dict[str, Any] = {"node_addrs": ("10.0.0.1", "10.0.0.2", "10.0.0.3"), "slots": (2, 4, 1),
                              "node_rank": 1, "chief_addr": "10.0.0.1", "job_id": "dl-x"}
    return ClusterInfo(**{**fields, **changes})


def test_cluster_info_properties() -> None:
    c = info()
    assert (c.num_nodes, c.total_slots, c.local_slots, c.first_rank, c.is_chief, c.node_addr) == (
        3, 7, 4, 2, False, "10.0.0.2")
    assert info(node_rank=0).is_chief and info(node_rank=2).first_rank == 6
    assert c.require_addresses("horovod") == ("10.0.0.1", "10.0.0.2", "10.0.0.3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.node_rank = 0  # type: ignore[misc]


@pytest.mark.parametrize(("changes", "message"), [
    ({"slots": (2, 4)}, "cluster info needs one slot count per node, and at least one node"),
    ({"node_addrs": (), "slots": ()}, "cluster info needs one slot count per node, and at least one node"),
    ({"node_rank": 3}, "node rank 3 is outside the job's 3 node(s) (valid: 0..2)"),
    ({"node_rank": -1}, "node rank -1 is outside the job's 3 node(s) (valid: 0..2)"),
    ({"slots": (2, 0, 1)}, "every node needs at least one slot, got [2, 0, 1]"),
    ({"chief_addr": ""}, "cluster info needs the chief's address: give --master-addr ADDR"),
    ({"job_id": ""}, "cluster info needs a job id: give --job-id ID"),
])
def test_cluster_info_validation(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ClusterError) as e:
        info(**changes)
    assert str(e.value) == message


def test_require_addresses_names_the_nodes_without_one() -> None:
    with pytest.raises(ClusterError) as e:
        info(node_addrs=("10.0.0.1", None, None)).require_addresses("horovod")
    assert str(e.value) == ("the horovod layer needs every node's address, but node(s) [1, 2] have none: "
                            "give --hosts host:slots,... or --hostfile")


# -- host lists -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "hosts"), [
    ("h1", [Host("h1", None)]),
    ("h1:2,h2:3", [Host("h1", 2), Host("h2", 3)]),
    (" h1:2 , h2 ", [Host("h1", 2), Host("h2", None)]),
    ("10.0.0.1:8,10.0.0.2:8", [Host("10.0.0.1", 8), Host("10.0.0.2", 8)]),
    ("[::1]:2,[fe80::1]", [Host("::1", 2), Host("fe80::1", None)]),
    ("::1,2001:db8::2", [Host("::1", None), Host("2001:db8::2", None)]),
])
def test_parse_hosts(text: str, hosts: list[Host]) -> None:
    assert parse_hosts(text) == hosts


@pytest.mark.parametrize(("text", "message"), [
    ("", "--hosts is empty: write host:slots,host:slots (e.g. 10.0.0.1:8,10.0.0.2:8)"),
    ("  ", "--hosts is empty: write host:slots,host:slots (e.g. 10.0.0.1:8,10.0.0.2:8)"),
    ("h1,,h2", "--hosts has an empty entry in 'h1,,h2': remove the extra comma"),
    ("h1,", "--hosts has an empty entry in 'h1,': remove the extra comma"),
    ("h1:x", "bad --hosts entry 'h1:x': slots must be a positive integer (e.g. 10.0.0.1:8)"),
    ("h1:0", "bad --hosts entry 'h1:0': slots must be a positive integer (e.g. 10.0.0.1:8)"),
    ("h1:-1", "bad --hosts entry 'h1:-1': slots must be a positive integer (e.g. 10.0.0.1:8)"),
    ("h1:\u00b2", "bad --hosts entry 'h1:\u00b2': slots must be a positive integer (e.g. 10.0.0.1:8)"),
    (":2", "bad host '' in --hosts: write a host name or an IP address"),
    ("-h1:2", "bad host '-h1' in --hosts: write a host name or an IP address"),
    ("h 1:2", "bad host 'h 1' in --hosts: write a host name or an IP address"),
    ("h1,h1", "host h1 appears twice in --hosts: list each node once"),
    ("h1:2,h1:4", "host h1 appears twice in --hosts: list each node once"),
    ("Node1,node1.", "host node1. (the same as Node1) appears twice in --hosts: list each node once"),
    ("[::1]:2,0:0::1", "host 0:0::1 (the same as ::1) appears twice in --hosts: list each node once"),
    ("[::1", "bad --hosts entry '[::1': write [ipv6]:slots"),
    ("[::1]2", "bad --hosts entry '[::1]2': write [ipv6]:slots"),
    ("[::1]:", "bad --hosts entry '[::1]:': slots must be a positive integer (e.g. 10.0.0.1:8)"),
    ("[h1]:2", "bad --hosts entry 'h1': write host:slots, or [ipv6]:slots"),
    ("a:b:c", "bad --hosts entry 'a:b:c': write host:slots, or [ipv6]:slots"),
])
def test_parse_hosts_errors(text: str, message: str) -> None:
    with pytest.raises(ClusterError) as e:
        parse_hosts(text)
    assert str(e.value) == message


def test_parse_hostfile() -> None:
    text = """
    # the chief first
    10.0.0.1 slots=8   # two sockets
    10.0.0.2 slots=4 max_slots=8
    node3:2
    node4
    [::1] slots=2
    fe80::2
    [2001:db8::3]:3
    """
    assert parse_hostfile(text, "hostfile") == [
        Host("10.0.0.1", 8), Host("10.0.0.2", 4), Host("node3", 2), Host("node4", None),
        Host("::1", 2), Host("fe80::2", None), Host("2001:db8::3", 3)]


@pytest.mark.parametrize(("text", "message"), [
    ("", "hf lists no hosts: write one 'host slots=N' per line"),
    ("# only a comment\n\n", "hf lists no hosts: write one 'host slots=N' per line"),
    ("h1 slots=x", "bad hf line 1 entry 'h1 slots=x': slots must be a positive integer (e.g. 10.0.0.1:8)"),
    ("h1\nh2 slots=0", "bad hf line 2 entry 'h2 slots=0': slots must be a positive integer (e.g. 10.0.0.1:8)"),
    ("h1 cpus=2", "hf line 1: cannot read 'cpus=2'; write 'host slots=N'"),
    ("h1:2 slots=2", "hf line 1: slots given twice in 'h1:2 slots=2'; write 'host slots=N'"),
    ("h1,h2 slots=2", "hf line 1: one host per line, got 'h1,h2'"),
    ("h1 slots=2\nh2\nh1 slots=1", "host h1 appears twice in hf: list each node once"),
    ("[h1] slots=2", "bad hf line 1 entry 'h1': write host:slots, or [ipv6]:slots"),
])
def test_parse_hostfile_errors(text: str, message: str) -> None:
    with pytest.raises(ClusterError) as e:
        parse_hostfile(text, "hf")
    assert str(e.value) == message


# -- StaticProvider -------------------------------------------------------------------------------


def test_static_from_hosts() -> None:
    c = discover("--hosts", "10.0.0.1:2,10.0.0.2:4", "--node-rank", "1")
    assert (c.node_addrs, c.slots, c.node_rank, c.chief_addr, c.provider) == (
        ("10.0.0.1", "10.0.0.2"), (2, 4), 1, "10.0.0.1", "static")
    assert c.sources == {"nodes": "--hosts", "node_rank": "--node-rank", "chief": "first host of --hosts",
                         "slots": "--hosts"}


def test_static_hosts_without_slots_take_nproc_per_node() -> None:
    c = discover("--hosts", "a,b:3", "--node-rank", "0", "--nproc-per-node", "2")
    assert c.slots == (2, 3)
    assert discover("--hosts", "a,b:3", "--node-rank", "0", env={"CUDA_VISIBLE_DEVICES": ""}).slots == (1, 3)


def test_static_from_hostfile(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=2\nb slots=2  # worker\n")
    c = discover("--hostfile", str(hostfile), "--node-rank", "1")
    assert (c.node_addrs, c.slots, c.node_rank, c.sources["nodes"]) == (("a", "b"), (2, 2), 1, "--hostfile")


def test_a_single_host_needs_no_node_rank() -> None:
    c = discover("--hosts", "127.0.0.1:2")
    assert (c.node_rank, c.slots, c.chief_addr) == (0, (2,), "127.0.0.1")


@pytest.mark.parametrize(("argv", "message"), [
    (["--hosts", "a:1,b:1"], "--hosts lists 2 hosts: say which one this node is with --node-rank 0..1"),
    (["--hosts", "a:1,b:1", "--node-rank", "2"], "--node-rank 2 is outside --hosts (2 hosts: valid ranks 0..1)"),
    (["--hosts", "a:1,b:1", "--node-rank", "-1"],  # the option's own range comes first
     "argument --node-rank: '-1' is out of range; valid: 0..65535 (see detlaunch --help)"),
    (["--hosts", "a:1,b:1", "--node-rank", "0", "--nnodes", "3"],
     "--nnodes 3 disagrees with --hosts, which lists 2 hosts"),
    (["--hosts", "a:1", "--hostfile", "hf"], "give --hosts or --hostfile, not both"),
    (["--hosts", ""], "--hosts is empty: write host:slots,host:slots (e.g. 10.0.0.1:8,10.0.0.2:8)"),
    (["--hostfile", "/nonexistent/hf"], "cannot read --hostfile /nonexistent/hf: No such file or directory"),
    (["--nnodes", "2"], "--nnodes > 1 needs the chief's address: --master-addr ADDR"),
    (["--nnodes", "2", "--master-addr", "h", "--node-rank", "2"], "--node-rank 2 is outside --nnodes 2 (valid: 0..1)"),
    (["--node-rank", "1"], "--node-rank 1 is outside --nnodes 1 (valid: 0..0)"),
])
def test_static_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        discover(*argv)
    assert str(e.value) == message


def test_static_from_torchrun_style_flags() -> None:
    args = ("--nnodes", "2", "--nproc-per-node", "3", "--master-addr", "10.0.0.1", "--master-port", "29600")
    chief = discover(*args, "--node-rank", "0")
    worker = discover(*args, "--node-rank", "1", "--node-addr", "10.0.0.2")
    assert (chief.node_addrs, chief.slots, chief.node_rank, chief.chief_addr) == (
        ("10.0.0.1", None), (3, 3), 0, "10.0.0.1")
    assert (worker.node_addrs, worker.node_rank, worker.node_addr, worker.chief_addr) == (
        ("10.0.0.1", "10.0.0.2"), 1, "10.0.0.2", "10.0.0.1")
    assert worker.sources["chief"] == "--master-addr"


def test_derived_job_ids_are_equal_on_every_node() -> None:
    args = ("--nnodes", "2", "--master-addr", "10.0.0.1", "--master-port", "29600")
    ids = {discover(*args, "--node-rank", r, "--node-addr", f"10.0.0.{int(r) + 1}").job_id for r in ("0", "1")}
    assert len(ids) == 1 and ids == {derived_job_id("10.0.0.1", 29600, 2)}
    # another job (another port) gets another id
    assert discover("--nnodes", "2", "--master-addr", "10.0.0.1", "--master-port", "29601").job_id not in ids
    hosts = {discover("--hosts", "a:2,b:2", "--node-rank", r).job_id for r in ("0", "1")}
    assert len(hosts) == 1 and hosts != ids and hosts.pop().startswith("dl-")


def test_an_explicit_job_id_wins() -> None:
    assert discover("--hosts", "a,b", "--node-rank", "1", "--job-id", "run-7").job_id == "run-7"
    assert discover("--nnodes", "2", "--master-addr", "a", env={"DETLAUNCH_JOB_ID": "run-8"}).job_id == "run-8"


def test_single_node_job_ids_are_random() -> None:
    assert discover("--nnodes", "1").job_id != discover("--nnodes", "1").job_id


def test_det_chief_ip_is_the_chief_when_no_master_addr() -> None:
    env = {"DET_CHIEF_IP": "10.0.0.9"}
    c = discover("--nnodes", "2", "--node-rank", "1", env=env)
    assert (c.chief_addr, c.node_addrs[0], c.sources["chief"]) == ("10.0.0.9", "10.0.0.9", "DET_CHIEF_IP")
    c = discover("--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", env=env)
    assert (c.chief_addr, c.sources["chief"]) == ("10.0.0.1", "--master-addr")


def test_static_answers_only_when_asked() -> None:
    assert static.detlaunch_discover_cluster(config()) is None
    assert static.detlaunch_discover_cluster(config("--hosts", "a", "--cluster", "slurm")) is None
    assert local.detlaunch_discover_cluster(config("--cluster", "static")) is None


# -- LocalProvider --------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "env", "slots"), [
    (["--nproc-per-node", "3"], {"CUDA_VISIBLE_DEVICES": "0,1"}, 3),
    ([], {"CUDA_VISIBLE_DEVICES": "0,1"}, 2),
    ([], {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb,GPU-cccc"}, 3),
    ([], {"CUDA_VISIBLE_DEVICES": ""}, 1),
    ([], {"CUDA_VISIBLE_DEVICES": "-1"}, 1),
    ([], {"CUDA_VISIBLE_DEVICES": "1", "DETLAUNCH_NPROC_PER_NODE": "4"}, 4),
])
def test_local_slots(argv: list[str], env: dict[str, str], slots: int) -> None:
    c = discover(*argv, env=env)
    assert (c.provider, c.slots, c.node_rank, c.num_nodes) == ("local", (slots,), 0, 1)


def test_local_without_gpus_has_one_slot() -> None:
    if Path("/dev/nvidia0").exists():
        pytest.skip("this machine has GPUs")
    assert discover().slots == (1,)


def test_local_addresses_and_det_chief_ip() -> None:
    c = discover(env={"CUDA_VISIBLE_DEVICES": ""})
    assert (c.node_addrs, c.chief_addr, c.sources["chief"]) == (("127.0.0.1",), "127.0.0.1", "this machine")
    c = discover(env={"DET_CHIEF_IP": "10.0.0.9"})
    assert (c.node_addrs, c.chief_addr, c.sources["chief"]) == (("10.0.0.9",), "10.0.0.9", "DET_CHIEF_IP")
    c = discover("--node-addr", "10.0.0.5", env={"DET_CHIEF_IP": "10.0.0.9"})
    assert (c.node_addrs, c.chief_addr) == (("10.0.0.5",), "10.0.0.9")
