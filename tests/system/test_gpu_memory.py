"""nvidia-smi's answer read, and which of the pids it lists are the last attempt's (pure: milliseconds)."""

from __future__ import annotations

from pathlib import Path

import pytest
from detlaunch.system.gpu_memory import QUERY, find_nvidia_smi, holding, parse_compute_apps

pytestmark = pytest.mark.timeout(10)


def test_the_query_is_the_csv_of_compute_apps() -> None:
    assert QUERY == ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")


def test_each_line_is_a_pid_and_its_memory() -> None:
    assert parse_compute_apps("1234, 80123\n1240, 512\n") == {1234: 80123, 1240: 512}


def test_no_process_on_any_gpu_is_an_empty_answer() -> None:
    assert parse_compute_apps("") == {}
    assert parse_compute_apps("\n  \n") == {}


def test_a_process_on_several_gpus_adds_up() -> None:
    assert parse_compute_apps("7, 100\n7, 250\n8, 1\n") == {7: 350, 8: 1}


def test_memory_not_reported_still_lists_the_pid() -> None:
    """MIG and some drivers say [N/A] (or [Not Supported]): the process still has a context on a GPU."""
    assert parse_compute_apps("7, [N/A]\n8, [Not Supported]\n9, 3\n7, 10\n") == {7: None, 8: None, 9: 3}


def test_a_failed_nvidia_smi_tells_nothing() -> None:
    assert parse_compute_apps("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                              "Make sure that the latest NVIDIA driver is installed and running.\n") is None
    assert parse_compute_apps("No devices were found\n") is None


def test_a_warning_among_the_lines_is_left_out() -> None:
    assert parse_compute_apps("WARNING: infoROM is corrupted at gpu 0000:3B:00.0\n42, 10\n") == {42: 10}


def test_only_our_pids_hold_and_in_order() -> None:
    apps = {99999: 4000, 1240: 512, 1234: None}
    assert holding(apps, {1234, 1240, 7, 12}) == [1234, 1240]
    assert holding(apps, {5}) == []
    assert holding({}, {1234}) == []


def test_nvidia_smi_is_found_on_the_jobs_path_only(tmp_path: Path) -> None:
    assert find_nvidia_smi({"PATH": str(tmp_path)}) is None
    stub = tmp_path / "nvidia-smi"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    assert find_nvidia_smi({"PATH": f"/nonexistent:{tmp_path}"}) == str(stub)
