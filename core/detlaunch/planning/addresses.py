"""Node addresses that other machines can reach: no node of a real cluster on a loopback address.

Debian and Ubuntu write ``127.0.1.1 <hostname>`` into /etc/hosts, so on each node its own name resolves
to loopback while the others' names resolve to their real addresses. Taken as they are, the chief's
link listener, a per-job sshd's ListenAddress and a worker's dial source would sit on loopback: the
other nodes never join, and the job fails only at --start-timeout. So, once discovery has answered:

- a job whose addresses are all loopback (the tests' 127.0.0.x nodes, one machine) stays as it is;
- in a job with any other address, this node's loopback entry becomes the address it reaches the
  others from (the kernel's route source: no packet is sent), and another node's loopback entry is
  refused in one line, since this node cannot know where that node really is;
- listeners bind the wildcard (as torchrun's store does) unless the job is on loopback only, where
  several "nodes" share one machine and each must keep its own address;
- a name that does not resolve yet (a Kubernetes headless service comes up after its pod) is asked
  again until --start-timeout, with one line while it waits.

The resolver and the route lookup are parameters, so the rules are tested without a network.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import time
from collections.abc import Callable

from detlaunch.errors import ClusterError
from detlaunch.planning.cluster import ClusterInfo

Resolve = Callable[[str], str]  # a name or address -> an IP address; socket.gaierror when it has none


def system_resolve(name: str) -> str:
    """The address this node's resolver gives `name` (IPv4 first, as providers/resolve.py)."""
    if is_literal(name):
        return name
    infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    ipv4 = [info for info in infos if info[0] == socket.AF_INET]
    return str((ipv4 or infos)[0][4][0])


def route_source(peer: str) -> str | None:
    """The local address this node reaches `peer` from (a UDP connect only asks the routing table)."""
    family = socket.AF_INET6 if ":" in peer else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((peer, 9))
            return str(s.getsockname()[0])
    except OSError:
        return None


def is_literal(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr.split("%")[0])
        return True
    except ValueError:
        return False


def is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip.split("%")[0]).is_loopback
    except ValueError:
        return False


def resolve_patiently(name: str, resolve: Resolve, wait: float, say: Callable[[str], None],
                      sleep: Callable[[float], None] = time.sleep) -> str:
    """`name`'s address, asking again (0.1 s, doubling to 2 s) for up to `wait` seconds while it has none."""
    if is_literal(name):
        return name
    deadline, pause, said = time.monotonic() + wait, 0.1, False
    while True:
        try:
            return resolve(name)
        except (socket.gaierror, UnicodeError) as e:
            reason = getattr(e, "strerror", None) or str(e)
            if time.monotonic() + pause > deadline:
                raise ClusterError(f"cannot resolve node {name!r}: {reason} (asked for {wait:g} s, --start-timeout); "
                                   "every node's name must resolve on every node (DNS or /etc/hosts), or give "
                                   "addresses") from None
            if not said:
                say(f"waiting for node name {name!r} to resolve ({reason}; at most {wait:g} s, --start-timeout)")
                said = True
            sleep(pause)
            pause = min(pause * 2, 2.0)


def settle(cluster: ClusterInfo, *, wait: float | None, say: Callable[[str], None],
           resolve: Resolve = system_resolve, source: Callable[[str], str | None] = route_source) -> ClusterInfo:
    """`cluster` with no node on a loopback address unless the whole job is (see the module's docstring).

    This node needs its own name and the chief's: those are waited for (`wait` seconds; None: a dry run,
    which waits for nothing and leaves a name that does not resolve as it is). Another node's name that
    does not resolve here is left to the layer that dials it.
    """
    given = dict(enumerate(cluster.node_addrs))
    names = {a for a in (*given.values(), cluster.chief_addr) if a}
    needed = {cluster.node_addr, cluster.chief_addr} if wait is not None else set()
    resolved = {}
    for name in sorted(names):
        try:
            resolved[name] = resolve_patiently(name, resolve, wait or 0.0, say) if name in needed \
                else resolve(name)
        except (ClusterError, OSError, UnicodeError):
            if name in needed:
                raise
            resolved[name] = name  # not known here: not loopback, as far as this node can tell
    loop_names = {name for name, ip in resolved.items() if is_loopback(ip)}
    if len(cluster.node_addrs) == 1:
        return cluster
    if not names - loop_names:  # loopback only, as far as this node knows: on one machine if it knows all
        return dataclasses.replace(cluster, bind_any=not all(given.values()))
    peer = next(resolved[n] for n in sorted(names - loop_names))
    own = cluster.node_addr or ""
    here = source(peer) if own in loop_names else None
    if own in loop_names and (here is None or is_loopback(here)):
        raise ClusterError(f"this node's address {own} is loopback ({resolved[own]}), and no other address of "
                           f"this node reaches node {peer}: give --node-addr ADDR (an address the other nodes reach)")
    addrs = list(cluster.node_addrs)
    for i, addr in given.items():
        if addr in loop_names and i != cluster.node_rank:
            raise ClusterError(
                f"node {i}'s address {addr} resolves to loopback ({resolved[addr]}) on this node, but the job "
                f"spans other machines: fix this node's /etc/hosts (Debian's '127.0.1.1 <hostname>' line) or "
                f"give the nodes' real addresses")
        if addr in loop_names:
            addrs[i] = here
    chief = cluster.chief_addr
    if chief in loop_names:
        if not cluster.is_chief:
            raise ClusterError(f"the chief's address {chief} resolves to loopback ({resolved[chief]}) on this "
                               f"node, but the job spans other machines: give --master-addr the chief's real address")
        chief = here or chief
    sources = {**cluster.sources, "addresses": f"{own} is loopback here ({resolved[own]}): {here} reaches {peer}"} \
        if here else cluster.sources
    return dataclasses.replace(cluster, node_addrs=tuple(addrs), chief_addr=chief, sources=sources, bind_any=True)


def bind_host(addr: str, bind_any: bool) -> str:
    """Where a listener of this node binds: the wildcard of `addr`'s family, or `addr` itself (loopback only)."""
    if not bind_any:
        return addr
    return "::" if ":" in addr else "0.0.0.0"


def interface_of(ip: str) -> str | None:
    """The name of this node's network interface that holds `ip`, if one does."""
    import psutil  # only for a job across machines: a loopback job never pays for it

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == ip for a in addrs):
            return name
    return None


def socket_ifname_env(cluster: ClusterInfo, resolve: Resolve = system_resolve) -> dict[str, str]:
    """NCCL's and gloo's socket interface: the one holding this node's address, in a job across machines.

    Left to NCCL, it picks the first interface that is up (often a docker bridge or a management NIC
    the other nodes cannot reach); gloo uses the address its hostname resolves to (127.0.1.1 on Debian).
    """
    own = cluster.node_addr
    if not cluster.bind_any or not own:
        return {}
    try:
        ip = resolve(own)
    except (OSError, UnicodeError):
        return {}
    name = None if is_loopback(ip) else interface_of(ip)
    return {"NCCL_SOCKET_IFNAME": name, "GLOO_SOCKET_IFNAME": name} if name else {}
