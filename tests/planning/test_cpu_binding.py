"""--numa-binding's CPU sets, on machines drawn as sysfs trees (no process started).

The machine: 2 sockets, one NUMA node each, 4 physical cores a node with 2 hyperthreads each
(cpu N and N+16 share a core), two L3 groups of 2 cores a node; GPUs 0-1 on node 0, GPUs 2-3 on node 1.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from detlaunch.errors import ConfigError
from detlaunch.planning.cpu_binding import Topology, cpu_sets, format_cpu_list
from detlaunch.rank.affinity import parse_cpu_list

pytestmark = pytest.mark.timeout(10)
GPUS = ("0000:1a:00.0", "0000:1b:00.0", "0000:9a:00.0", "0000:9b:00.0")


def put(root: Path, path: str, text: str) -> None:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text + "\n")


def machine(root: Path, gpus: bool = True) -> Topology:
    cpus: set[int] = set()
    for node in (0, 1):
        first = node * 4
        put(root, f"sys/devices/system/node/node{node}/cpulist", f"{first}-{first + 3},{first + 16}-{first + 19}")
        for core in range(first, first + 4):
            for cpu in (core, core + 16):
                cpus.add(cpu)
                base = f"sys/devices/system/cpu/cpu{cpu}"
                put(root, f"{base}/topology/core_cpus_list", f"{core},{core + 16}")
                put(root, f"{base}/topology/physical_package_id", str(node))
                pair = first + (core - first) // 2 * 2
                put(root, f"{base}/cache/index3/level", "3")
                put(root, f"{base}/cache/index3/shared_cpu_list", f"{pair}-{pair + 1},{pair + 16}-{pair + 17}")
                put(root, f"{base}/cache/index2/level", "2")
                put(root, f"{base}/cache/index2/shared_cpu_list", f"{core},{core + 16}")
    if gpus:
        for i, address in enumerate(GPUS):
            put(root, f"proc/driver/nvidia/gpus/{address}/information", "Model: test")
            put(root, f"sys/bus/pci/devices/{address}/numa_node", "0" if i < 2 else "1")
    return Topology(str(root), allowed=cpus)


def test_cpu_lists_read_and_written_as_sysfs_does() -> None:
    assert parse_cpu_list("0-2,5,7-8\n") == {0, 1, 2, 5, 7, 8}
    assert format_cpu_list({8, 0, 1, 2, 5, 7}) == "0-2,5,7-8"
    assert format_cpu_list([3]) == "3"


def test_node_binds_each_rank_to_its_gpus_numa_node(tmp_path: Path) -> None:
    assert cpu_sets("node", 4, {}, machine(tmp_path)) == ["0-3,16-19", "0-3,16-19", "4-7,20-23", "4-7,20-23"]


def test_the_visible_gpus_decide_which_node(tmp_path: Path) -> None:
    assert cpu_sets("node", 2, {"CUDA_VISIBLE_DEVICES": "3,0"}, machine(tmp_path)) == ["4-7,20-23", "0-3,16-19"]


def test_exclusive_splits_a_nodes_cores_between_its_gpus_keeping_hyperthreads_together(tmp_path: Path) -> None:
    assert cpu_sets("exclusive", 4, {}, machine(tmp_path)) == ["0-1,16-17", "2-3,18-19", "4-5,20-21", "6-7,22-23"]


def test_exclusive_gives_the_first_ranks_the_odd_core(tmp_path: Path) -> None:
    topo = machine(tmp_path)
    topo.allowed -= {3, 19}  # three cores of node 0 left to this job (a cgroup took one)
    assert cpu_sets("exclusive", 2, {}, topo) == ["0-1,16-17", "2,18"]


def test_socket_and_core_complex(tmp_path: Path) -> None:
    topo = machine(tmp_path)
    assert cpu_sets("socket", 4, {}, topo)[2] == "4-7,20-23"
    assert cpu_sets("core-complex", 4, {}, topo) == ["0-1,16-17", "2-3,18-19", "4-5,20-21", "6-7,22-23"]


def test_without_gpus_ranks_are_spread_over_the_numa_nodes_in_blocks(tmp_path: Path) -> None:
    topo = machine(tmp_path, gpus=False)
    assert cpu_sets("node", 4, {}, topo) == ["0-3,16-19", "0-3,16-19", "4-7,20-23", "4-7,20-23"]
    assert cpu_sets("exclusive", 8, {}, topo)[:4] == ["0,16", "1,17", "2,18", "3,19"]


@pytest.mark.parametrize(("mode", "ranks", "env", "says"), [
    ("exclusive", 16, {}, "4 physical core(s) for 8 ranks on one NUMA node"),  # 8 ranks a node, no GPUs
    ("node", 3, {"CUDA_VISIBLE_DEVICES": "0,1"}, "3 ranks on this node but 2 GPU(s) visible"),
    ("node", 1, {"CUDA_VISIBLE_DEVICES": "GPU-1234"}, "cannot tell which GPU 'GPU-1234'"),
    ("numa", 1, {}, "one of node, socket, exclusive, core-complex"),
])
def test_what_cannot_be_bound_is_one_line(tmp_path: Path, mode: str, ranks: int, env: dict[str, str],
                                          says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)) as e:
        cpu_sets(mode, ranks, env, machine(tmp_path, gpus=mode != "exclusive"))
    assert "\n" not in str(e.value)


def test_a_machine_without_numa_files_is_one_node_of_the_allowed_cpus(tmp_path: Path) -> None:
    assert cpu_sets("exclusive", 2, {}, Topology(str(tmp_path), allowed={0, 1, 2, 3})) == ["0-1", "2-3"]
