"""SLURM host lists and per-node counts: examples, errors, round trips, and SLURM itself as the oracle."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from detlaunch.errors import ClusterError
from detlaunch.planning.providers.hostlist import compress_counts, compress_hostlist, expand_counts, expand_hostlist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("text", "hosts"), [
    ("n1", ["n1"]),
    ("n[1-2]", ["n1", "n2"]),
    ("gpu[01-04,07],cpu3", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("n[9-11]", ["n9", "n10", "n11"]),
    ("n[001-3]", ["n001", "n002", "n003"]),
    ("n[010-11]", ["n010", "n011"]),
    ("n[5]", ["n5"]),
    ("n0[1-3]", ["n01", "n02", "n03"]),
    ("a[1-2],b[3-4]", ["a1", "a2", "b3", "b4"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("[12-13]", ["12", "13"]),
    ("node-a.example.org,n[1-2].cluster", ["node-a.example.org", "n1.cluster", "n2.cluster"]),
    (" n[1-2] ", ["n1", "n2"]),
])
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


def test_zero_padding_keeps_the_low_bounds_width_past_its_digits() -> None:
    hosts = expand_hostlist("n[01-100]")
    assert (len(hosts), hosts[:2], hosts[98:]) == (100, ["n01", "n02"], ["n99", "n100"])


@pytest.mark.parametrize(("text", "message"), [
    ("x[3-1]", "SLURM_JOB_NODELIST: range '3-1' in 'x[3-1]' goes backwards; write LO-HI with LO <= HI"),
    ("x[1-", "SLURM_JOB_NODELIST: '[' is never closed in 'x[1-'"),
    ("n[1-2]]", "SLURM_JOB_NODELIST: ']' without '[' at position 6 in 'n[1-2]]'"),
    ("n[[1]]", "SLURM_JOB_NODELIST: nested '[' at position 2 in 'n[[1]]'"),
    ("n[a-b]", "SLURM_JOB_NODELIST: bad range 'a-b' in 'n[a-b]'; write N or LO-HI, e.g. n[01-04,07]"),
    ("n[]", "SLURM_JOB_NODELIST: bad range '' in 'n[]'; write N or LO-HI, e.g. n[01-04,07]"),
    ("n[1-2:2]", "SLURM_JOB_NODELIST: bad range '1-2:2' in 'n[1-2:2]'; write N or LO-HI, e.g. n[01-04,07]"),
    ("n[1-2],,n3", "SLURM_JOB_NODELIST: empty entry in 'n[1-2],,n3'; remove the extra comma"),
    ("n1,", "SLURM_JOB_NODELIST: empty entry in 'n1,'; remove the extra comma"),
    ("a b", "SLURM_JOB_NODELIST: white space in host name 'a b'"),
    ("", "SLURM_JOB_NODELIST is empty"),
    ("n[1-99999999]", "SLURM_JOB_NODELIST: 'n[1-99999999]' names more than 1000000 hosts"),
])
def test_malformed_hostlists_are_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(ClusterError) as e:
        expand_hostlist(text, "SLURM_JOB_NODELIST")
    assert str(e.value) == message
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("hosts", "text"), [
    (["n01", "n02", "n03", "x", "n9", "n10", "cpu3"], "n[01-03],x,n9,n10,cpu3"),  # n[9-10] is longer
    ([f"gpu{n:02d}" for n in range(1, 17)], "gpu[01-16]"),
    (["n1"], "n1"),
    (["n3", "n1", "n2", "n4"], "n3,n1,n2,n4"),  # order is kept: SLURM lists are ordered by node rank
    (["x", "n1", "n2", "n3"], "x,n[1-3]"),
    (["n010", "n11"], "n010,n11"),  # n[010-011] would give n011
    (["login", "login2"], "login,login2"),
])
def test_compress_hostlist(hosts: list[str], text: str) -> None:
    assert compress_hostlist(hosts) == text
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(("text", "counts"), [
    ("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("1(x2)", [1, 1]), ("4,2(x2)", [4, 2, 2]),
])
def test_expand_counts(text: str, counts: list[int]) -> None:
    assert expand_counts(text) == counts
    assert compress_counts(counts) == text


@pytest.mark.parametrize("text", ["", "2(x)", "x", "2(x0)", "2(3)", "1,,1", "-1"])
def test_malformed_counts(text: str) -> None:
    with pytest.raises(ClusterError, match="SLURM_TASKS_PER_NODE"):
        expand_counts(text, "SLURM_TASKS_PER_NODE")


# -- properties ---------------------------------------------------------------------------------

PREFIX = st.builds(lambda first, rest: first + rest, st.sampled_from("abxyz"), st.text("abcxyz-.", max_size=3))
NUMBER = st.tuples(st.integers(0, 3), st.integers(0, 2000)).map(lambda wn: f"{wn[1]:0{wn[0]}d}")
HOST = st.one_of(PREFIX, st.builds(lambda p, n: p + n, PREFIX, NUMBER), NUMBER)


@st.composite
def host_runs(draw: st.DrawFn) -> list[str]:
    """Host lists as schedulers make them: runs of numbered nodes, some padded, mixed with odd names."""
    hosts: list[str] = []
    for _ in range(draw(st.integers(1, 5))):
        if draw(st.booleans()):
            prefix, width = draw(PREFIX), draw(st.integers(0, 3))
            start, length = draw(st.integers(0, 120)), draw(st.integers(1, 15))
            hosts += [f"{prefix}{n:0{width}d}" for n in range(start, start + length)]
        else:
            hosts.append(draw(HOST))
    return list(dict.fromkeys(hosts))  # a node appears once


@given(st.one_of(host_runs(), st.lists(HOST, min_size=1, max_size=30, unique=True)))
def test_expanding_the_compressed_form_gives_the_list_back(hosts: list[str]) -> None:
    text = compress_hostlist(hosts)
    assert expand_hostlist(text) == hosts
    assert len(text) <= len(",".join(hosts))


@given(st.lists(st.integers(1, 16), min_size=1, max_size=40))
def test_counts_round_trip(counts: list[int]) -> None:
    assert expand_counts(compress_counts(counts)) == counts


@given(st.text("n0123[]-,x", max_size=14))
def test_any_input_expands_or_fails_with_a_cluster_error(text: str) -> None:
    try:
        hosts = expand_hostlist(text, "SLURM_JOB_NODELIST")
    except ClusterError as e:
        assert "\n" not in str(e) and str(e).startswith("SLURM_JOB_NODELIST")
    else:
        assert hosts and all(h and "[" not in h and "]" not in h and "," not in h for h in hosts)


# -- SLURM's own parser as the oracle -----------------------------------------------------------

SCONTROL = shutil.which("scontrol")


@pytest.fixture(scope="module")
def scontrol_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if SCONTROL is None:
        pytest.skip("scontrol is not installed (apt: slurm-client; scripts/setup.sh installs it)")
    conf = tmp_path_factory.mktemp("scontrol") / "slurm.conf"  # parsing host lists needs a config, no daemon
    conf.write_text("ClusterName=oracle\nSlurmctldHost=localhost(127.0.0.1)\nAuthType=auth/none\nNodeName=z\n")
    return {**os.environ, "SLURM_CONF": str(conf)}


def scontrol_hostnames(text: str, env: dict[str, str]) -> list[str]:
    assert SCONTROL is not None
    r = subprocess.run([SCONTROL, "show", "hostnames", text], env=env, capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and "Invalid" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r.stdout.split()


@pytest.mark.parametrize("text", ["gpu[01-04,07],cpu3", "n[08-11]", "n[01-100]", "a[1-2]b[3-4]",
                                  "rack[1-2]-n[01-02],login", "n[010-11]", "n[1-2][3]"])
def test_expansion_agrees_with_scontrol(real_processes: None, text: str, scontrol_env: dict[str, str]) -> None:
    assert expand_hostlist(text) == scontrol_hostnames(text, scontrol_env)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hosts=host_runs())
def test_scontrol_expands_our_compressed_form_to_the_same_list(real_processes: None, hosts: list[str],
                                                                 scontrol_env: dict[str, str]) -> None:
    assert scontrol_hostnames(compress_hostlist(hosts), scontrol_env) == hosts

