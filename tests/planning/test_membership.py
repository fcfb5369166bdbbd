"""A job that may shrink (--nnodes MIN:MAX): which places run an attempt, and each node's cluster for it."""

from __future__ import annotations

from pathlib import Path

import pytest
from detlaunch.errors import ConfigError
from detlaunch.planning import membership
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.command_line import CommandLine
from detlaunch.planning.plugin_manager import PluginSet

pytestmark = pytest.mark.timeout(10)
ADDRS = ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")


def base(node_rank: int, slots: tuple[int, ...] = (2, 2, 2, 2)) -> ClusterInfo:
    return ClusterInfo(node_addrs=ADDRS, slots=slots, node_rank=node_rank, chief_addr=ADDRS[0], job_id="j")


def test_the_chief_comes_first_and_the_other_places_by_number() -> None:
    assert membership.members({3, 1}) == (0, 1, 3)
    assert membership.members(set()) == (0,)


def test_every_place_present_keeps_each_node_its_rank() -> None:
    for place in range(4):
        assert membership.cluster_of(base(place), (0, 1, 2, 3), place) == base(place)


def test_without_a_place_ranks_are_renumbered_contiguously_and_the_world_is_smaller() -> None:
    c = membership.cluster_of(base(3), (0, 1, 3), 3)
    assert (c.node_rank, c.num_nodes, c.first_rank, c.total_slots, c.node_addr) == (2, 3, 4, 6, "10.0.0.4")
    assert c.node_addrs == ("10.0.0.1", "10.0.0.2", "10.0.0.4")
    chief = membership.cluster_of(base(0), (0, 3), 0)
    assert (chief.node_rank, chief.num_nodes, chief.total_slots, chief.is_chief) == (0, 2, 4, True)


def test_each_place_keeps_its_slots_and_the_chief_sees_where_nodes_are_now() -> None:
    c = membership.cluster_of(base(0, slots=(8, 4, 2, 1)), (0, 2, 3), 0, {2: "10.0.0.9"})
    assert (c.slots, c.node_addrs) == ((8, 2, 1), ("10.0.0.1", "10.0.0.9", "10.0.0.4"))


@pytest.mark.parametrize(("missing", "coming", "present", "min_nodes", "dropped"), [
    ({2}, set(), {1, 3}, 2, {2}),  # no spare: it goes on with 3 of 4
    ({2}, {2}, {1, 3}, 2, set()),  # a spare is on its way: nothing dropped
    ({2, 3}, {3}, {1}, 3, {2}),  # the spare's place counts as left
    ({1, 2, 3}, set(), set(), 2, set()),  # the chief alone is below MIN: wait for them
    ({1, 2, 3}, set(), set(), 1, {1, 2, 3}),  # MIN 1: the chief alone goes on
    ({2}, set(), {1, 3}, None, set()),  # a fixed size never shrinks
    (set(), set(), {1, 2, 3}, 2, set()),  # nobody missing
])
def test_a_place_without_a_spare_is_dropped_only_while_at_least_min_nodes_are_left(
        missing: set[int], coming: set[int], present: set[int], min_nodes: int | None, dropped: set[int]) -> None:
    assert membership.shrink(missing, coming, present, min_nodes) == dropped


def test_a_shrunk_job_takes_back_one_place_a_waiting_spare_lowest_first() -> None:
    assert membership.grow({3, 1}, 1) == [1]
    assert membership.grow({3, 1}, 5) == [1, 3]
    assert membership.grow({2}, 0) == []
    assert membership.describe((0, 1, 3), (2, 2, 2, 4), 4) == "3 node(s) of 4, 8 rank(s)"


def options(*args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    plugins = PluginSet({})
    plugins.load_layer("direct")
    line = CommandLine.read([*args, "--layer", "direct", "--", "/bin/true"], env or {})
    return dict(line.config(plugins.hooks, job=False).options)


def test_nnodes_takes_torchruns_min_max_from_the_flag_the_variable_and_the_config_file(tmp_path: Path) -> None:
    o = options("--nnodes", "2:4")
    assert (o["nnodes"], o["min_nodes"]) == (4, 2)
    o = options(env={"DETLAUNCH_NNODES": "1:3"})
    assert (o["nnodes"], o["min_nodes"]) == (3, 1)
    o = options("--nnodes", "3")
    assert (o["nnodes"], o["min_nodes"]) == (3, None)
    (tmp_path / "c.toml").write_text('[detlaunch]\nnnodes = "2:5"\n')
    o = options("--config", str(tmp_path / "c.toml"))
    assert (o["nnodes"], o["min_nodes"]) == (5, 2)
    o = options("--nnodes", "2:2")  # no range at all
    assert (o["nnodes"], o["min_nodes"]) == (2, None)


@pytest.mark.parametrize(("value", "error"), [
    ("3:2", "MIN is more than MAX"), ("0:2", "out of range"), ("1:x", "is not an integer"), ("1:2:3", "not an"),
])
def test_a_bad_node_range_is_one_line(value: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        options("--nnodes", value)
