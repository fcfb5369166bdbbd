"""Spare nodes and excluded hosts: which detlaunch runs ranks, which waits, and which host is kept out.

`--spares N`: discovery lists every node, spares last (the last N hosts of --hosts, --hostfile or
the scheduler's list; with --nnodes M, node ranks M..M+N-1). The first M are the job's places: a
place's node rank decides its ranks, so a spare that takes a lost node's place takes its node rank
and every global rank keeps its number; only the address changes (the spare's own).

`--exclude-hosts FILE`: one host a line (`#` starts a comment), read at the start and before every
attempt, so a scheduler or an operator may add one while the job runs. The chief appends each host it
loses, with the reason and the time (`HOST  # lost TIME: WHY`), for a wrapper (a requeue script, an
operator) to act on: a host lost once may serve again (a spare started there); lost twice, it is out.
A host the chief sends away (a straggler) is appended as `# excluded TIME: WHY`: out at once. Any other
line (an operator's, a scheduler's) keeps its host out.
Pure but for that file.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter

from detlaunch.errors import ConfigError
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.system.safefs import read_regular_file


def places(everyone: ClusterInfo, spares: int) -> int:
    """How many nodes run ranks; one line if `spares` leaves too few."""
    active = everyone.num_nodes - spares
    if spares and active < 2:
        raise ConfigError(f"--spares {spares} leaves {max(active, 0)} node(s) of {everyone.num_nodes} to run ranks: "
                          "a spare takes a lost worker's place, so a job needs the chief and at least one worker "
                          "besides its spares")
    return active


def spare_number(everyone: ClusterInfo, spares: int) -> int | None:
    """This detlaunch's number as a spare (its node rank among everyone, past the places), or None."""
    return everyone.node_rank if spares and everyone.node_rank >= places(everyone, spares) else None


def active_cluster(everyone: ClusterInfo, spares: int) -> ClusterInfo:
    """The job's places as a node that runs ranks sees them (no spare is in them)."""
    n = places(everyone, spares)
    return dataclasses.replace(everyone, node_addrs=everyone.node_addrs[:n], slots=everyone.slots[:n])


def take_place(everyone: ClusterInfo, spares: int, place: int) -> ClusterInfo:
    """A spare's cluster once it takes `place`: that place's node rank and slots, at the spare's own address."""
    n = places(everyone, spares)
    if not 0 < place < n:
        raise ConfigError(f"a spare cannot take node {place}'s place: the job's workers are nodes 1..{n - 1}")
    addrs = list(everyone.node_addrs[:n])
    addrs[place] = everyone.node_addr
    return dataclasses.replace(everyone, node_addrs=tuple(addrs), slots=everyone.slots[:n], node_rank=place)


LOST, EXCLUDED = "lost", "excluded"  # what the chief writes after a host's `#`
LOST_TIMES_OUT = 2  # a host lost this many times is kept out


def read_excluded(path: str | None) -> set[str]:
    """The hosts kept out by the exclusion file (a missing file: none); one line if it cannot be read."""
    return read_exclusions(path)[0]


def out_after_loss(exclusions: tuple[set[str], Counter[str]], host: str, how: str = LOST) -> bool:
    """Whether `host` is out once one more line of `how` is appended to a file that read as `exclusions`."""
    out, losses = exclusions
    return host in out or how != LOST or losses[host] + 1 >= LOST_TIMES_OUT


def read_exclusions(path: str | None) -> tuple[set[str], Counter[str]]:
    """The exclusion file as (the hosts kept out, each host's losses so far); one line if it cannot be read."""
    if not path:
        return set(), Counter()
    try:  # as --hostfile is read: a FIFO or a device is refused before a byte is read
        text = read_regular_file(path).decode("utf-8")
    except FileNotFoundError:
        return set(), Counter()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read --exclude-hosts {path}: {getattr(e, 'strerror', None) or e}") from None
    out, losses = set(), Counter[str]()
    for line in text.splitlines():
        host, _, comment = (part.strip() for part in line.partition("#"))
        if not host:
            continue
        if comment.startswith(LOST + " "):
            losses[host] += 1
        else:
            out.add(host)
    return out | {host for host, times in losses.items() if times >= LOST_TIMES_OUT}, losses


def append_excluded(path: str, host: str, why: str, when: float | None = None, how: str = LOST) -> str | None:
    """Add a host to the exclusion file, `how` (lost, or excluded at once), with why and when (UTC); a
    warning, or None."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when if when is not None else time.time()))
    line = f"{host}  # {how} {stamp}: {' '.join(why.split())}\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, line.encode())  # one write with O_APPEND: whole, beside other writers' lines
        finally:
            os.close(fd)
    except OSError as e:
        return f"cannot add {host} to --exclude-hosts {path}: {e.strerror}"
    return None
