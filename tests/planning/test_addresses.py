"""No node of a real cluster on a loopback address (planning/addresses.py): the rules, with a resolver
that answers as Debian's /etc/hosts does on each node (its own name is 127.0.1.1). Milliseconds."""

from __future__ import annotations

import dataclasses
import socket

import pytest
from detlaunch.errors import ClusterError
from detlaunch.planning import addresses
from detlaunch.planning.cluster import ClusterInfo

pytestmark = pytest.mark.timeout(10)

HOSTS = {"n1": "10.1.0.1", "n2": "10.1.0.2", "n3": "10.1.0.3", "localhost": "127.0.0.1"}


def resolver(here: str):  # type: ignore[no-untyped-def]
    """The names as node `here` resolves them: its own name is 127.0.1.1 (Debian's /etc/hosts)."""
    def resolve(name: str) -> str:
        if name == here:
            return "127.0.1.1"
        if name not in HOSTS:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return HOSTS[name]
    return resolve


def cluster(addrs: tuple[str | None, ...], node_rank: int, chief: str | None = None) -> ClusterInfo:
    return ClusterInfo(node_addrs=addrs, slots=(1,) * len(addrs), node_rank=node_rank,
                       chief_addr=chief or addrs[0] or "n1", job_id="j")


def settle(c: ClusterInfo, here: str, source: str | None = "10.1.0.9") -> ClusterInfo:
    said: list[str] = []
    settled = addresses.settle(c, wait=0, say=said.append, resolve=resolver(here), source=lambda peer: source)
    assert said == []
    return settled


def test_on_each_node_its_own_loopback_name_becomes_the_address_the_others_reach() -> None:
    chief = settle(cluster(("n1", "n2"), 0), here="n1", source="10.1.0.1")
    assert (chief.node_addrs, chief.chief_addr, chief.bind_any) == (("10.1.0.1", "n2"), "10.1.0.1", True)
    assert chief.sources["addresses"] == "n1 is loopback here (127.0.1.1): 10.1.0.1 reaches 10.1.0.2"
    worker = settle(cluster(("n1", "n2"), 1), here="n2", source="10.1.0.2")
    assert (worker.node_addrs, worker.chief_addr, worker.bind_any) == (("n1", "10.1.0.2"), "n1", True)


def test_slurm_style_resolved_addresses_are_settled_too() -> None:
    c = settle(cluster(("127.0.1.1", "10.1.0.2", "10.1.0.3"), 0), here="n1", source="10.1.0.1")
    assert (c.node_addrs, c.chief_addr) == (("10.1.0.1", "10.1.0.2", "10.1.0.3"), "10.1.0.1")


def test_another_nodes_loopback_address_is_refused_in_one_line() -> None:
    with pytest.raises(ClusterError, match=r"^node 1's address localhost resolves to loopback \(127.0.0.1\) on "
                                           r"this node, but the job spans other machines: fix this node's "):
        settle(cluster(("n1", "localhost", "n3"), 0), here="nobody")
    with pytest.raises(ClusterError, match=r"^the chief's address localhost resolves to loopback"):
        settle(cluster((None, None, "n3"), 2, chief="localhost"), here="nobody")


def test_a_loopback_node_with_no_route_to_the_others_is_told_to_give_its_address() -> None:
    with pytest.raises(ClusterError, match=r"give --node-addr ADDR"):
        settle(cluster(("n1", "n2"), 0), here="n1", source=None)


def test_jobs_on_loopback_only_stay_as_they_are() -> None:
    tests_nodes = cluster(("127.0.0.1", "127.0.0.2"), 1)
    assert settle(tests_nodes, here="n1") == tests_nodes and not settle(tests_nodes, here="n1").bind_any
    one = cluster(("n1",), 0)
    assert settle(one, here="n1") == one
    # torchrun-style flags know only the chief: a name on loopback there may still be a real cluster
    assert settle(cluster(("n1", None), 0), here="n1").bind_any
    assert settle(cluster(("127.0.0.1", None), 1), here="n2").bind_any


def test_real_addresses_bind_the_wildcard() -> None:
    c = settle(cluster(("n1", "n2"), 1), here="nobody")
    assert (c.node_addrs, c.bind_any) == (("n1", "n2"), True)
    assert addresses.bind_host("n2", True) == "0.0.0.0" and addresses.bind_host("fd00::2", True) == "::"
    assert addresses.bind_host("127.0.0.2", False) == "127.0.0.2"


def test_a_name_that_resolves_later_is_asked_again_with_one_line() -> None:
    answers = iter([socket.gaierror(socket.EAI_NONAME, "Name or service not known")] * 3 + ["10.1.0.7"])
    said: list[str] = []
    slept: list[float] = []

    def resolve(name: str) -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert addresses.resolve_patiently("pod-1.svc", resolve, 60, said.append, slept.append) == "10.1.0.7"
    assert said == ["waiting for node name 'pod-1.svc' to resolve (Name or service not known; at most 60 s, "
                    "--start-timeout)"]
    assert slept == [0.1, 0.2, 0.4]
    with pytest.raises(ClusterError, match=r"^cannot resolve node 'nowhere': Name or service not known \(asked "):
        addresses.resolve_patiently("nowhere", resolver("x"), 0, said.append)


def test_ranks_get_the_interface_of_the_nodes_address_unless_on_loopback() -> None:
    lo = cluster(("127.0.0.1", "127.0.0.2"), 0)
    assert addresses.socket_ifname_env(lo) == {}
    assert addresses.socket_ifname_env(dataclasses.replace(lo, bind_any=True)) == {}  # loopback: NCCL's choice
    assert addresses.interface_of("127.0.0.1") == "lo"
    assert addresses.interface_of("192.0.2.77") is None  # TEST-NET-1: on no interface here


def test_a_dry_run_waits_for_no_name_and_another_nodes_name_is_left_to_its_layer() -> None:
    c = cluster(("n1", "gone-1", "gone-2"), 0)
    said: list[str] = []
    assert addresses.settle(c, wait=None, say=said.append, resolve=resolver("x")).node_addrs == c.node_addrs
    assert addresses.settle(c, wait=0, say=said.append, resolve=resolver("x")).node_addrs == c.node_addrs
    with pytest.raises(ClusterError, match="^cannot resolve node 'gone-1'"):  # its own name: needed
        addresses.settle(cluster(("n1", "gone-1"), 1), wait=0, say=said.append, resolve=resolver("x"))
    assert said == []
