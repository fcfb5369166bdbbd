"""Who is in the job: nodes, their slots, this node's rank, and the chief.

ClusterInfo is what every discovery provider returns and every layer reads.
The parsers here (host lists, hostfiles) are pure functions so they can be
tested on their own, including by property-based tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import re
from collections.abc import Mapping, Sequence

from detlaunch.errors import ClusterError

# A job id names the job's directory (~/.cache/detlaunch/jobs/JOB_ID), its run dirs and its link: a plain
# name only, so that no value (a flag, DETLAUNCH_JOB_ID, a scheduler's variable) reaches another folder.
JOB_ID_MAX = 128
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
JOB_ID_RULE = (f"a job id names the job's directory: letters, digits, '.', '_' and '-' only, starting with a "
               f"letter or digit, at most {JOB_ID_MAX}")


def job_id_problem(value: str) -> str | None:
    """Why ``value`` cannot be a job id, or None when it can."""
    if len(value) > JOB_ID_MAX:
        return f"is {len(value)} characters long"
    if not _JOB_ID.fullmatch(value):
        return "is not a plain name"
    return None


def job_id_arg(text: str) -> str:
    """--job-id's type: the flag, DETLAUNCH_JOB_ID and the config file are checked alike."""
    problem = job_id_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}; {JOB_ID_RULE}")
    return text


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """The job's shape as seen from one node.

    node_addrs[i] is the address of node i, or None where the provider cannot
    know it (torchrun-style flags only know the chief). slots[i] is how many
    ranks node i runs.
    """

    node_addrs: tuple[str | None, ...]
    slots: tuple[int, ...]
    node_rank: int
    chief_addr: str
    job_id: str
    provider: str = "local"
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)
    # Listeners (the job link, a per-job sshd) bind the wildcard, not this node's address: the job spans
    # real machines (planning/addresses.py sets it; False keeps each node on its own address, as the
    # tests' 127.0.0.x nodes on one machine need).
    bind_any: bool = False

    def __post_init__(self) -> None:
        if len(self.node_addrs) != len(self.slots) or not self.slots:
            raise ClusterError("cluster info needs one slot count per node, and at least one node")
        if not 0 <= self.node_rank < len(self.slots):
            raise ClusterError(
                f"node rank {self.node_rank} is outside the job's {len(self.slots)} node(s) "
                f"(valid: 0..{len(self.slots) - 1})"
            )
        if any(s < 1 for s in self.slots):
            raise ClusterError(f"every node needs at least one slot, got {list(self.slots)}")
        if not self.chief_addr:
            raise ClusterError("cluster info needs the chief's address: give --master-addr ADDR")
        if not self.job_id:
            raise ClusterError("cluster info needs a job id: give --job-id ID")
        problem = job_id_problem(self.job_id)
        if problem:  # a scheduler's (SLURM_JOB_ID, Determined's allocation id) or a third-party provider's
            where = self.sources.get("job_id") or f"the {self.provider} provider"
            raise ClusterError(f"job id {self.job_id!r} from {where} {problem}; {JOB_ID_RULE} "
                               "(give --job-id NAME)")

    @property
    def num_nodes(self) -> int:
        return len(self.slots)

    @property
    def total_slots(self) -> int:
        return sum(self.slots)

    @property
    def local_slots(self) -> int:
        return self.slots[self.node_rank]

    @property
    def is_chief(self) -> bool:
        return self.node_rank == 0

    @property
    def node_addr(self) -> str | None:
        """This node's own address, when known."""
        return self.node_addrs[self.node_rank]

    @property
    def first_rank(self) -> int:
        """The global rank of this node's first local rank."""
        return sum(self.slots[: self.node_rank])

    def require_addresses(self, layer: str) -> tuple[str, ...]:
        """Every node's address, or a clear error for layers that must reach each node."""
        missing = [i for i, a in enumerate(self.node_addrs) if not a]
        if missing:
            raise ClusterError(
                f"the {layer} layer needs every node's address, but node(s) {missing} have none: "
                "give --hosts host:slots,... or --hostfile"
            )
        return tuple(a for a in self.node_addrs if a)


@dataclasses.dataclass(frozen=True)
class Host:
    addr: str
    slots: int | None  # None: not given, use the default


def _check_addr(addr: str, where: str) -> str:
    if not addr or any(c.isspace() for c in addr) or addr.startswith("-"):
        raise ClusterError(f"bad host {addr!r} in {where}: write a host name or an IP address")
    return addr


def _check_slots(text: str, entry: str, where: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ClusterError(
            f"bad {where} entry {entry!r}: slots must be a positive integer (e.g. 10.0.0.1:8)"
        )
    return int(text)


def _same_host_key(addr: str) -> str:
    """Host names compare without case; IP addresses by value (::1 and 0:0::1 are one host)."""
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        return addr.lower().rstrip(".")


def _reject_duplicates(hosts: Sequence[Host], where: str) -> None:
    seen: dict[str, str] = {}
    for h in hosts:
        key = _same_host_key(h.addr)
        if key in seen:
            same = h.addr if seen[key] == h.addr else f"{h.addr} (the same as {seen[key]})"
            raise ClusterError(f"host {same} appears twice in {where}: list each node once")
        seen[key] = h.addr


def parse_hosts(text: str, where: str = "--hosts") -> list[Host]:
    """Parse ``host[:slots],host[:slots],...``; IPv6 addresses go in brackets (``[::1]:2``)."""
    if not text.strip():
        raise ClusterError(f"{where} is empty: write host:slots,host:slots (e.g. 10.0.0.1:8,10.0.0.2:8)")
    hosts = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            raise ClusterError(f"{where} has an empty entry in {text!r}: remove the extra comma")
        if entry.startswith("["):
            addr, sep, rest = entry[1:].partition("]")
            if not sep or (rest and not rest.startswith(":")):
                raise ClusterError(f"bad {where} entry {entry!r}: write [ipv6]:slots")
            _ipv6(addr, where)
            slots = _check_slots(rest[1:], entry, where) if rest else None
        elif entry.count(":") > 1:
            _ipv6(entry, where)
            addr, slots = entry, None
        else:
            addr, sep, rest = entry.partition(":")
            slots = _check_slots(rest, entry, where) if sep else None
        hosts.append(Host(_check_addr(addr, where), slots))
    _reject_duplicates(hosts, where)
    return hosts


def _ipv6(text: str, where: str) -> None:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        raise ClusterError(f"bad {where} entry {text!r}: write host:slots, or [ipv6]:slots") from None


def parse_hostfile(text: str, where: str) -> list[Host]:
    """Parse the MPI/deepspeed hostfile format: ``host slots=N`` per line, ``#`` comments.

    ``host:N`` and a bare ``host`` are accepted too.
    """
    hosts = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        here = f"{where} line {lineno}"
        fields = line.split()
        if "," in fields[0]:
            raise ClusterError(f"{here}: one host per line, got {fields[0]!r}")
        host = parse_hosts(fields[0], here)[0]  # host, host:N, [ipv6], [ipv6]:N, bare ipv6
        slots = host.slots
        for extra in fields[1:]:
            key, _, value = extra.partition("=")
            if key == "slots":
                if slots is not None:
                    raise ClusterError(f"{here}: slots given twice in {line!r}; write 'host slots=N'")
                slots = _check_slots(value, line, here)
            elif key not in ("max_slots", "max-slots"):
                raise ClusterError(f"{here}: cannot read {extra!r}; write 'host slots=N'")
        hosts.append(Host(host.addr, slots))
    if not hosts:
        raise ClusterError(f"{where} lists no hosts: write one 'host slots=N' per line")
    _reject_duplicates(hosts, where)
    return hosts
