"""The preflight's pure parts: pairing, re-pairing (DLRover's slowest-with-fastest) and the judge."""

from __future__ import annotations

import os
from typing import Any

import detlaunch
import pytest
from detlaunch.planning import preflight as pf
from detlaunch.planning.preflight import Figure, PreflightCheck, Result

pytestmark = pytest.mark.timeout(10)


def node_results(values: dict[int, float | None], check: str = "compute") -> list[Result]:
    return [Result(n, check, Figure(v is not None, v), "GFLOP/s") for n, v in values.items()]


def pair_results(speed: dict[tuple[int, ...], float | None]) -> list[Result]:
    return [Result(n, "network", Figure(v is not None, v), "MB/s", group=g) for g, v in speed.items() for n in g]


def test_groups_pair_neighbours_and_the_odd_node_joins_the_last_pair():
    assert pf.first_round([3, 1, 0, 2]) == [(0, 1), (2, 3)]
    assert pf.first_round([0, 1, 2]) == [(0, 1, 2)]
    assert pf.first_round([0, 1, 2, 3, 4]) == [(0, 1), (2, 3, 4)]
    assert pf.first_round([0]) == []


def test_the_second_round_pairs_the_slowest_with_the_fastest():
    first = [(0, 1), (2, 3), (4, 5), (6, 7)]
    speed = {(0, 1): 900.0, (2, 3): 100.0, (4, 5): 1000.0, (6, 7): 950.0}
    second = pf.second_round(first, speed)
    assert second[0] == (2, 5)  # the slowest node with the fastest
    assert all(set(g) not in ({0, 1}, {2, 3}, {4, 5}, {6, 7}) for g in second)  # nobody keeps its partner
    assert sorted(n for g in second for n in g) == list(range(8))
    assert pf.second_round([(0, 1)], {(0, 1): 1.0}) == []  # one pair: nothing to re-pair


def test_a_second_round_only_when_the_first_found_a_slow_or_failed_group():
    groups = [(0, 1), (2, 3)]
    assert not pf.needs_second_round(groups, {(0, 1): 900.0, (2, 3): 1000.0}, 0.7)
    assert pf.needs_second_round(groups, {(0, 1): 300.0, (2, 3): 1000.0}, 0.7)
    assert pf.needs_second_round(groups, {(0, 1): None, (2, 3): 1000.0}, 0.7)


def test_the_bad_node_is_told_apart_from_its_partner_by_the_second_round():
    # node 2 is bad: (2, 3) slow in round 1; re-paired, (2, 0) slow and (3, 1) fine: node 3 is cleared
    results = pair_results({(0, 1): 1000.0, (2, 3): 200.0}) + pair_results({(2, 0): 210.0, (3, 1): 990.0})
    findings = pf.judge(results, 0.7, {2: "127.0.0.3"})
    assert [f.node for f in findings] == [2]
    assert "network 200 MB/s with node(s) 3" in findings[0].describe()
    assert findings[0].describe().startswith("node 2 (127.0.0.3) network")


def test_a_bad_link_names_both_its_nodes_only_when_no_round_tells_them_apart():
    results = pair_results({(0, 1): None})
    assert [f.node for f in pf.judge(results, 0.7)] == [0, 1]
    assert pf.judge(pair_results({(0, 1): 50.0}), 0.7) == []  # one group alone: no median to be under


def test_a_slow_node_check_is_named_with_its_figures_and_the_median():
    findings = pf.judge(node_results({0: 10.0, 1: 9.5, 2: 2.5}), 0.7, {2: "h2"})
    assert [f.node for f in findings] == [2]
    assert findings[0].figures == {"compute": 2.5}
    assert "compute 2.5 GFLOP/s (median of the nodes 9.5 GFLOP/s, under 0.7x)" in findings[0].describe()


def test_balanced_nodes_and_noise_above_the_threshold_name_nobody():
    assert pf.judge(node_results({0: 10.0, 1: 8.0, 2: 7.5, 3: 9.0}), 0.7) == []


def test_a_node_keeps_its_best_figure_over_the_rounds_and_a_failure_names_it():
    results = node_results({0: 10.0, 1: 2.0, 2: 9.0}) + node_results({1: 9.8})  # slow once, not twice
    assert pf.judge(results, 0.7) == []
    failed = [Result(1, "doctor", Figure(False, None, "torch importable: ModuleNotFoundError"), compare=False)]
    findings = pf.judge(node_results({0: 1.0, 1: 1.0}) + failed, 0.7)
    assert [f.node for f in findings] == [1] and "doctor failed: torch importable" in findings[0].describe()


def test_results_travel_as_json_and_the_table_has_a_line_per_node():
    r = Result(1, "network", Figure(True, 950.0, "x"), "MB/s", group=(0, 1))
    assert Result.from_json(r.to_json()) == r
    results = node_results({0: 10.0, 1: 2.0, 2: 9.0})
    lines = pf.table(results, pf.judge(results, 0.7), {0: "a", 1: "b", 2: "c"})
    assert lines[0] == "node 0 (a): compute 10 GFLOP/s -- ok"
    assert lines[1].startswith("node 1 (b): compute 2 GFLOP/s -- NAMED: compute 2 GFLOP/s")


def test_round_args_give_each_group_its_own_store_port():
    args = pf.round_args([(0, 1), (2, 3)], {0: "10.0.0.1", 2: "10.0.0.3"}, 29502)
    assert args == {"groups": [{"nodes": [0, 1], "addr": "10.0.0.1", "port": 29502},
                               {"nodes": [2, 3], "addr": "10.0.0.3", "port": 29503}]}


class StoragePlugin:
    """A third party's check, through the public hook: a storage path writable (a node check, not compared)."""

    @detlaunch.hookimpl
    def detlaunch_preflight_checks(self, config):
        path = config.options["storage"]
        return [detlaunch.PreflightCheck("storage", lambda peer: detlaunch.PreflightFigure(
            os.access(path, os.W_OK), None, path), compare=False),
                detlaunch.PreflightCheck("boom", lambda peer: 1 / 0)]


class BrokenPlugin:
    @detlaunch.hookimpl
    def detlaunch_preflight_checks(self, config):
        raise RuntimeError("no NIC tool")


def test_a_plugins_check_comes_through_the_detlaunch_preflight_checks_hook(tmp_path):
    from detlaunch.node.preflight_child import run_checks
    from detlaunch.planning.config import Config
    from detlaunch.planning.plugin_manager import PluginSet

    plugins = PluginSet({})
    plugins.pm.register(StoragePlugin(), name="storage")
    plugins.pm.register(BrokenPlugin(), name="broken")
    config = Config("direct", (), (), {"storage": str(tmp_path / "missing")}, {})
    checks, errors = plugins.hooks.preflight_checks(config)
    assert [c.name for c in checks] == ["storage", "boom"]
    assert errors == ["broken: its preflight checks raised RuntimeError: no NIC tool"]
    results = run_checks({"node": 2, "node_checks": True}, checks)
    assert [(r.check, r.figure.ok) for r in results] == [("storage", False), ("boom", False)]
    assert results[1].figure.detail == "ZeroDivisionError: division by zero"
    findings = pf.judge(results, 0.7, {2: "h"})
    assert [f.node for f in findings] == [2] and "storage failed" in findings[0].describe()


def test_preflight_option_values_and_the_doctor_job_config():
    from detlaunch.errors import ConfigError
    from detlaunch.planning.config import Config, preflight_mode

    assert [preflight_mode(w) for w in ("once", "1", "ALWAYS", "off")] == ["once", "once", "always", None]
    with pytest.raises(Exception, match="write --preflight once or --preflight always"):
        preflight_mode("train.py")
    config = pf.doctor_job_config(Config("direct", (), (), {"preflight_action": "warn", "spares": 1}, {}))
    assert (config.options["preflight"], config.options["preflight_action"], config.options["spares"]) == \
        ("once", "stop", 0)
    assert config.command[1:] == ("-c", "")
    with pytest.raises(ConfigError, match="add --layer NAME"):
        pf.doctor_job_config(Config("", (), (), {}, {}))


def test_the_pair_checks_run_first_so_that_a_groups_node_checks_start_together() -> None:
    """Forming a pair's group waits for its other nodes: after it, every node of the group times its compute at
    the same moment (nodes sharing a machine would otherwise time theirs while the others still import torch)."""
    from detlaunch.node.preflight_child import run_checks

    calls: list[str] = []

    def check(name: str) -> Any:
        def run(peer: Any) -> Figure:
            calls.append(name)
            return Figure(True, 1.0, "")
        return run

    checks = [PreflightCheck("compute", check("compute"), "GFLOP/s"),
              PreflightCheck("network", check("network"), "MB/s", pairwise=True)]
    spec = {"node": 1, "node_checks": True, "group": {"nodes": [0, 1], "addr": "127.0.0.1", "port": 1}}
    results = run_checks(spec, checks)
    assert calls == ["network", "compute"]
    assert [r.check for r in results] == ["compute", "network"]  # the figures keep the checks' order


def test_a_node_that_cannot_start_a_group_is_named_alone_and_its_partner_is_not() -> None:
    """A node whose torch cannot start a group (node/preflight_checks.start_alone) fails its pair check at once
    and tells its partners, which measure nothing: its failure is its own, the group is not judged, and no
    second round is needed for it."""
    broken = Figure(False, None, "cannot start a gloo group on this node: RuntimeError: no interface nosuch0")
    results = [Result(1, "network", broken, "MB/s", group=(0, 1)),
               Result(0, "network", Figure(True, None, "not measured: node(s) [1] cannot start a gloo group"),
                      "MB/s", group=(0, 1)), *pair_results({(2, 3): 900.0})]
    assert pf.group_speeds(results) == {(2, 3): 900.0}
    assert not pf.needs_second_round([(0, 1), (2, 3)], pf.group_speeds(results), 0.7)
    findings = pf.judge(results, 0.7, {1: "127.0.0.2"})
    assert [f.node for f in findings] == [1]
    assert findings[0].describe() == ("node 1 (127.0.0.2) network failed: cannot start a gloo group on this node: "
                                      "RuntimeError: no interface nosuch0")
    assert [f.node for f in pf.judge(results[:2], 0.7)] == [1]  # a job of two nodes: the same


def test_the_cpu_share_is_the_smallest_quota_on_the_way_up_from_the_processs_cgroup(tmp_path) -> None:
    """A node under a CPU quota (a container's limit, the job test's throttled cgroup) can sustain only that share
    of a core: the compute check's short chunks would not see it (node/preflight_checks.cpu_share)."""
    from detlaunch.node.preflight_checks import cpu_share

    v1 = tmp_path / "v1"
    for folder, quota in ((v1 / "cpu", -1), (v1 / "cpu" / "job", 50000), (v1 / "cpu" / "job" / "node1", 20000)):
        folder.mkdir(parents=True)
        (folder / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (folder / "cpu.cfs_period_us").write_text("100000\n")
    procs = tmp_path / "cgroup"
    procs.write_text("4:memory:/elsewhere\n1:cpu:/job/node1\n0::/\n")
    assert cpu_share(str(procs), str(v1)) == 0.2
    procs.write_text("1:cpu:/job\n")
    assert cpu_share(str(procs), str(v1)) == 0.5
    v2 = tmp_path / "v2"
    (v2 / "slice" / "node").mkdir(parents=True)
    (v2 / "cpu.max").write_text("max 100000\n")
    (v2 / "slice" / "cpu.max").write_text("150000 100000\n")
    procs.write_text("0::/slice/node\n")
    assert cpu_share(str(procs), str(v2)) == 1.5
    (v2 / "slice" / "cpu.max").write_text("max 100000\n")
    assert cpu_share(str(procs), str(v2)) is None and cpu_share(str(tmp_path / "none"), str(v2)) is None
