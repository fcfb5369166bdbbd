"""Node names to addresses, the way every layer will reach them: ``socket.getaddrinfo``.

Schedulers name nodes (``n[1-2]``); launchers and the job link need addresses that
every node can reach. Each node resolves the names itself, so an address is what that
node's resolver says (DNS, /etc/hosts...). IPv4 is preferred when a name has both.
"""

from __future__ import annotations

import concurrent.futures
import socket
from collections.abc import Sequence

from detlaunch.errors import ClusterError

PARALLEL = 16  # big node lists resolve in parallel: one slow DNS answer must not add up


def resolve_one(name: str, where: str) -> str:
    """The address of `name`; a one-line ClusterError naming `where` it came from when it has none."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise ClusterError(f"cannot resolve node {name!r} (from {where}): {reason}; every node's name must "
                           "resolve on every node (DNS or /etc/hosts), or give --hosts ADDR:SLOTS,...") from None
    ipv4 = [info for info in infos if info[0] == socket.AF_INET]
    return str((ipv4 or infos)[0][4][0])


def resolve_all(names: Sequence[str], where: str) -> tuple[str, ...]:
    """Every name's address, in order (see :func:`resolve_one`)."""
    if len(names) <= 2:
        return tuple(resolve_one(n, where) for n in names)
    with concurrent.futures.ThreadPoolExecutor(min(PARALLEL, len(names))) as pool:
        return tuple(pool.map(lambda n: resolve_one(n, where), names))
