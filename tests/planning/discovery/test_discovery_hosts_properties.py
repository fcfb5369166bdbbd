"""Property-based round trips for the --hosts and --hostfile parsers (detlaunch.planning.cluster)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

import pytest
from detlaunch.errors import ClusterError
from detlaunch.planning.cluster import Host, parse_hostfile, parse_hosts
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(120)

NAME = st.from_regex(r"[a-z0-9][a-z0-9.-]{0,20}", fullmatch=True)
IPV4 = st.ip_addresses(v=4).map(str)
IPV6 = st.ip_addresses(v=6).map(str)
SLOTS = st.one_of(st.none(), st.integers(1, 512))


def key(addr: str) -> str:
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        return addr.lower().rstrip(".")


@st.composite
def host_lists(draw: st.DrawFn) -> list[Host]:
    """Distinct hosts (names, IPv4, IPv6), each with or without a slot count."""
    entries = draw(st.lists(st.tuples(st.one_of(NAME, IPV4, IPV6), SLOTS), min_size=1, max_size=12,
                            unique_by=lambda e: key(e[0])))
    return [Host(addr, slots) for addr, slots in entries]


def hosts_text(hosts: list[Host], draw: Callable[..., Any]) -> str:
    parts = []
    for h in hosts:
        ipv6 = ":" in h.addr
        if h.slots is None:
            parts.append(f"[{h.addr}]" if ipv6 and draw(st.booleans()) else h.addr)
        else:
            parts.append(f"[{h.addr}]:{h.slots}" if ipv6 else f"{h.addr}:{h.slots}")
    return ",".join(parts)


@given(st.data())
def test_formatted_host_lists_parse_back(data: st.DataObject) -> None:
    hosts = data.draw(host_lists())
    text = hosts_text(hosts, data.draw)
    assert parse_hosts(text) == hosts


def hostfile_line(h: Host, draw: Callable[..., Any]) -> str:
    addr = f"[{h.addr}]" if ":" in h.addr and draw(st.booleans()) else h.addr
    if h.slots is None:
        line = addr
    elif ":" not in h.addr and draw(st.booleans()):
        line = f"{addr}:{h.slots}"
    else:
        line = f"{addr} slots={h.slots}"
    if draw(st.booleans()):
        line += f" max_slots={draw(st.integers(1, 999))}"
    indent: str = draw(st.sampled_from(["", "  ", "\t"]))
    comment: str = draw(st.sampled_from(["", "  ", " # a comment"]))
    return indent + line + comment


@given(st.data())
def test_formatted_hostfiles_parse_back(data: st.DataObject) -> None:
    hosts = data.draw(host_lists())
    lines = []
    for h in hosts:
        lines += data.draw(st.lists(st.sampled_from(["", "# comment", "   "]), max_size=2))
        lines.append(hostfile_line(h, data.draw))
    assert parse_hostfile("\n".join(lines) + "\n", "hostfile") == hosts


@given(st.data())
def test_a_repeated_host_is_always_rejected(data: st.DataObject) -> None:
    hosts = data.draw(host_lists())
    again = data.draw(st.sampled_from(hosts))
    position = data.draw(st.integers(0, len(hosts)))
    text = hosts_text([*hosts[:position], again, *hosts[position:]], data.draw)
    with pytest.raises(ClusterError, match="appears twice in --hosts: list each node once"):
        parse_hosts(text)


def parse_a_hostfile(text: str) -> list[Host]:
    return parse_hostfile(text, "hostfile")


@given(st.text(max_size=30))
def test_any_text_parses_or_fails_with_one_cluster_error_line(text: str) -> None:
    for parse in (parse_hosts, parse_a_hostfile):
        try:
            hosts = parse(text)
        except ClusterError as e:
            assert "\n" not in str(e)
        else:
            assert hosts and all(h.addr and not h.addr.startswith("-") for h in hosts)
            assert all(h.slots is None or h.slots >= 1 for h in hosts)
