"""deepspeed's --include/--exclude and --num_nodes/--num_gpus, as deepspeed's runner reads them (resources.py):
which hosts are nodes, how many ranks each runs, and which devices they get. Pure functions, and one check
against deepspeed's own parse_resource_filter, in a Python of its own (importing deepspeed takes seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from detlaunch import ConfigError
from detlaunch_deepspeed.resources import (
    DEVICES,
    first_nodes_and_gpus,
    node_devices,
    options_for,
    parse_node_config_list,
    resource_filter,
    visible_devices_for,
)

pytestmark = pytest.mark.timeout(60)

POOL = [("w0", 4), ("w1", 2), ("w2", 4)]

# (include, exclude) -> what deepspeed keeps of POOL: host -> slots (None: all of them)
CASES = [
    (("w0@w1:0,1", ""), [("w0", None), ("w1", [0, 1])]),
    (("w2:3,1@w0:2", ""), [("w0", [2]), ("w2", [1, 3])]),  # the pool's order, slots sorted
    (("w1:1@w1:0,1", ""), [("w1", [0, 1])]),  # a host named twice: its slots joined
    (("", "w1"), [("w0", None), ("w2", None)]),
    (("", "w0:0@w2:1,2"), [("w0", [1, 2, 3]), ("w1", None), ("w2", [0, 3])]),
    (("", "w1:0,1"), [("w0", None), ("w2", None)]),  # a host left with no slot leaves
]


@pytest.mark.parametrize(("given", "kept"), CASES, ids=[f"{i}|{e}" for (i, e), _ in CASES])
def test_include_and_exclude_keep_what_deepspeed_keeps(given: tuple[str, str], kept: list[object]) -> None:
    assert resource_filter(POOL, *given) == kept


@pytest.mark.parametrize(("given", "error"), [
    (("w9", ""), "--include w9: w9 is not a host of --hostfile (w0, w1, w2)"),
    (("w1:2", ""), "--include w1:2: w1 has no device 2 (--hostfile gives it 2 slots: 0..1)"),
    (("", "w0:7"), "--exclude w0:7: w0 has no device 7"),
    (("w0:1:2", ""), "--include w0:1:2: 'w0:1:2' has more than one ':'"),
    (("w0:", ""), "--include w0:: '' in 'w0:' is not a device number"),
    (("w0:-1", ""), "--include w0:-1: '-1' in 'w0:-1' is not a device number"),
    (("w0", "w1"), "--include and --exclude exclude each other"),
    (("", "w0@w1@w2"), "--exclude w0@w1@w2 leaves no device of --hostfile to run on"),
])
def test_what_deepspeed_refuses_is_one_line(given: tuple[str, str], error: str) -> None:
    with pytest.raises(ConfigError) as e:
        resource_filter(POOL, *given)
    assert str(e.value).startswith(error) and "\n" not in str(e.value)


def test_num_nodes_and_num_gpus_take_the_first_hosts_and_devices() -> None:
    everything = resource_filter(POOL)
    assert first_nodes_and_gpus(everything, 2, None) == [("w0", None), ("w1", None)]
    assert first_nodes_and_gpus(everything, None, 1) == [("w0", [0]), ("w1", [0]), ("w2", [0])]
    assert first_nodes_and_gpus(everything, 1, 3) == [("w0", [0, 1, 2])]


def test_the_node_config_list_is_deepspeeds() -> None:
    assert parse_node_config_list("a:3,1@b@a:1", "--include") == {"a": [1, 3], "b": []}


def options(tmp_path: Path, hostfile: str | None = "w0 slots=4\nw1 slots=2\nw2 slots=4\n") -> dict[str, object]:
    if hostfile is None:
        return {}
    path = tmp_path / "hosts"
    path.write_text(hostfile)
    return {"hostfile": str(path)}


def test_the_options_name_the_nodes_left_and_their_devices(tmp_path: Path) -> None:
    o = options(tmp_path)
    assert options_for(o, {"-i": "w0:1,3@w2"}) == {"hosts": "w0:2,w2:4", "hostfile": None, DEVICES: "w0:1,3"}
    assert options_for(o, {"-e": "w1@w2:0"}) == {"hosts": "w0:4,w2:3", "hostfile": None, DEVICES: "w2:1,2,3"}
    assert options_for(o, {"--num_nodes": "2"}) == {"hosts": "w0:4,w1:2", "hostfile": None}
    both = {"--num_nodes": "2", "--num_gpus": "1"}
    first = options_for(o, both)
    assert first == {"hosts": "w0:1,w1:1", "hostfile": None, DEVICES: "w0:0@w1:0"}
    assert options_for(first, both) == first  # each flag converts all: the second one leaves the same options
    hosts = {"hosts": "w0:2,[::1]:2,w3"}  # --hosts too; a host without a count keeps its default
    assert options_for(hosts, {"-i": "w0@w3"}) == {"hosts": "w0:2,w3", "hostfile": None}
    assert options_for(hosts, {"-e": "w0:1"}) == {"hosts": "w0:1,[::1]:2,w3", "hostfile": None, DEVICES: "w0:0"}


def test_without_a_host_list_localhost_is_this_node(tmp_path: Path) -> None:
    assert options_for({}, {"-i": "localhost:1,3"}) == {"nproc_per_node": 2, DEVICES: "*:1,3"}
    assert options_for({}, {"-i": "localhost"}) == {}
    assert options_for({}, {"--num_gpus": "2", "--num_nodes": "3"}) == {"nnodes": "3", "nproc_per_node": "2"}
    for given, error in (({"-i": "w0:1"}, "--include w0:1: w0 is not a host of the job: without --hostfile"),
                         ({"-e": "localhost:0"}, "--exclude localhost:0: without --hostfile or --hosts, detlaunch "
                                                 "counts a node's devices when it plans"),
                         ({"-i": "localhost:0", "--num_gpus": "1"}, "--include picks the hosts and devices"),
                         ({"-e": "w1", "--num_nodes": "1"}, "--exclude picks the hosts and devices")):
        with pytest.raises(ConfigError, match="^" + error.replace("(", r"\(")):
            options_for({}, given)


def test_a_node_runs_on_the_devices_picked_for_it() -> None:
    assert node_devices("w0:1,3@w2:0", "w2") == [0]
    assert node_devices("w0:1,3", "w1") is None  # not picked: it keeps its own
    assert node_devices("*:1,3", "10.0.0.7") == [1, 3]
    assert node_devices(None, "w0") is None
    assert node_devices("::1:0,1@w0:2", "::1") == [0, 1]  # --num_gpus over a host list with an IPv6 address
    # The slots are indices into the node's own devices (CUDA_VISIBLE_DEVICES), else the GPUs' numbers.
    assert visible_devices_for([1, 3], None) == "1,3"
    assert visible_devices_for([1, 3], ["4", "5", "6", "7"]) == "5,7"
    assert visible_devices_for([0], ["GPU-a", "GPU-b"]) == "GPU-a"
    with pytest.raises(ConfigError, match=r"^deepspeed's device 2 on this node: it has 2 \(CUDA_VISIBLE_DEVICES=4,5\)"):
        visible_devices_for([2], ["4", "5"], "4,5")


DEEPSPEED = """
import json, sys
from deepspeed.launcher.runner import parse_inclusion_exclusion
pool = {h: n for h, n in json.loads(sys.argv[1])}
out = []
for include, exclude in json.loads(sys.argv[2]):
    try:
        out.append([[h, s] for h, s in parse_inclusion_exclusion(pool, include, exclude).items()])
    except ValueError as e:
        out.append(None)
print(json.dumps(out))
"""


@pytest.mark.timeout(120)
def test_deepspeeds_own_parser_keeps_the_same(real_processes: None) -> None:
    """The same cases through deepspeed's runner: the same hosts and slots kept, the same ones refused."""
    pytest.importorskip("deepspeed")
    refused = [("w9", ""), ("w1:2", ""), ("", "w0:7"), ("w0:1:2", ""), ("w0", "w1")]
    given = [g for g, _ in CASES] + refused
    r = subprocess.run([sys.executable, "-c", DEEPSPEED, json.dumps(POOL), json.dumps(given)], capture_output=True,
                       text=True, timeout=110, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert r.returncode == 0, r.stderr
    theirs = json.loads(r.stdout.strip().splitlines()[-1])
    slots = dict(POOL)
    for (include, exclude), kept in zip(given, theirs, strict=True):
        if kept is None:
            with pytest.raises(ConfigError):
                resource_filter(POOL, include, exclude)
            continue
        ours = [(h, list(range(slots[h])) if s is None else s) for h, s in resource_filter(POOL, include, exclude)]
        assert ours == [(h, s) for h, s in kept], (include, exclude)
