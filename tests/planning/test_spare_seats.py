"""Spares and excluded hosts as planned: who runs ranks, who waits, the place a spare takes, the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from detlaunch.errors import ConfigError
from detlaunch.planning import spares
from detlaunch.planning.cluster import ClusterInfo

pytestmark = pytest.mark.timeout(10)
ADDRS = ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")


def everyone(node_rank: int, slots: tuple[int, ...] = (8, 8, 8, 4)) -> ClusterInfo:
    return ClusterInfo(node_addrs=ADDRS, slots=slots, node_rank=node_rank, chief_addr=ADDRS[0], job_id="j")


def test_the_last_nodes_are_spares_and_the_others_see_only_the_places() -> None:
    assert spares.places(everyone(0), 1) == 3
    assert [spares.spare_number(everyone(n), 1) for n in range(4)] == [None, None, None, 3]
    assert [spares.spare_number(everyone(n), 0) for n in range(4)] == [None] * 4
    active = spares.active_cluster(everyone(2), 1)
    assert (active.num_nodes, active.node_addrs, active.first_rank, active.total_slots) == (3, ADDRS[:3], 16, 24)


def test_a_spare_takes_the_places_node_rank_and_ranks_at_its_own_address() -> None:
    taken = spares.take_place(everyone(3), 1, 1)
    assert (taken.node_rank, taken.node_addr, taken.first_rank, taken.local_slots) == (1, "10.0.0.4", 8, 8)
    assert taken.node_addrs == ("10.0.0.1", "10.0.0.4", "10.0.0.3")
    with pytest.raises(ConfigError, match="cannot take node 0's place: the job's workers are nodes 1..2"):
        spares.take_place(everyone(3), 1, 0)  # the chief's place is not a spare's (no succession here)


def test_too_few_nodes_besides_the_spares_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^--spares 3 leaves 1 node\(s\) of 4 to run ranks: a spare takes"):
        spares.places(everyone(0), 3)


def test_the_exclusion_file_is_read_with_comments_and_appended_to_whole(tmp_path: Path) -> None:
    path = tmp_path / "excluded"
    assert spares.read_excluded(str(path)) == set() and spares.read_excluded(None) == set()
    path.write_text("# kept out by the operator\n10.0.0.9\n  10.0.0.8   # bad NIC\n\n")
    assert spares.read_excluded(str(path)) == {"10.0.0.9", "10.0.0.8"}
    assert spares.append_excluded(str(path), "10.0.0.2", "no heartbeat\nfor 5 s", when=0) is None
    assert path.read_text().splitlines()[-1] == "10.0.0.2  # lost 1970-01-01T00:00:00Z: no heartbeat for 5 s"
    assert spares.read_excluded(str(path)) == {"10.0.0.9", "10.0.0.8"}  # lost once: it may serve again
    assert spares.append_excluded(str(path), "10.0.0.2", "closed", when=60) is None
    assert spares.read_excluded(str(path)) == {"10.0.0.9", "10.0.0.8", "10.0.0.2"}  # lost twice: out
    assert spares.append_excluded(str(path), "10.0.0.5", "a straggler", when=0, how=spares.EXCLUDED) is None
    assert path.read_text().splitlines()[-1] == "10.0.0.5  # excluded 1970-01-01T00:00:00Z: a straggler"
    assert "10.0.0.5" in spares.read_excluded(str(path))  # sent away: out at once
    warning = spares.append_excluded(str(tmp_path / "no" / "such"), "10.0.0.3", "x")
    assert warning == f"cannot add 10.0.0.3 to --exclude-hosts {tmp_path}/no/such: No such file or directory"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="^cannot read --exclude-hosts "):
        spares.read_excluded(str(path))


def test_whether_a_host_is_out_after_one_more_loss_needs_one_read_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "excluded"
    path.write_text("10.0.0.9\n10.0.0.2  # lost 1970-01-01T00:00:00Z: closed\n")
    before = spares.read_exclusions(str(path))
    assert before == ({"10.0.0.9"}, {"10.0.0.2": 1})
    assert spares.out_after_loss(before, "10.0.0.2")  # a second loss: out
    assert not spares.out_after_loss(before, "10.0.0.3")  # a first: it may serve again
    assert spares.out_after_loss(before, "10.0.0.3", spares.EXCLUDED)  # sent away: out at once
    assert spares.read_exclusions(None) == (set(), {})
