"""The one way detlaunch writes a set of ranks: the console's folded lines and the stack groups agree."""

from __future__ import annotations

from detlaunch.observe.dedupe import folded_prefix
from detlaunch.observe.rank_sets import format_ranks
from detlaunch.stacks.groups import format_who


def test_runs_of_two_or_more_read_as_ranges() -> None:
    assert format_ranks([7, 0, 1, 2, 5, 9, 10]) == "0-2,5,7,9-10"
    assert format_ranks([0, 2, 3, 4, 5, 6, 7]) == "0,2-7"
    assert format_ranks([7, 1, 0, 3]) == "0-1,3,7"
    assert format_ranks(range(100)) == "0-99"


def test_one_none_and_repeats() -> None:
    assert format_ranks([5]) == "5" and format_ranks([]) == ""
    assert format_ranks([3, 3, 4, 4]) == "3-4"


def test_the_console_and_the_stack_report_write_the_same_set_the_same_way() -> None:
    assert folded_prefix((0, 1, 3)) == b"[ranks=0-1,3] "
    assert format_who([(0, 0), (1, 0), (3, 1)]) == "ranks 0-1,3 (node 0, 1)"
