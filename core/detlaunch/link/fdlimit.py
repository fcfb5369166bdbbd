"""Open files for the chief: one socket per worker node, so a job of a thousand nodes needs more than
the usual soft limit of 1024.

The chief raises its soft limit to what the job needs (a socket per worker node, a few files per local
rank, SPARE for its own), never lowering it, and not further: the ranks inherit the limit, and a limit
raised to the hard one (often 2^20 or more) makes programs that close or poll every descriptor up to it
slow, and hands descriptors past 1023 to code that select()s. When even the hard limit is too low the
job is refused before anything starts, in one line (`check_open_files`, from the CLI), rather than
failing to accept the 1000th node half-way through the start.
"""

from __future__ import annotations

import resource

from detlaunch.errors import LaunchError
from detlaunch.planning.cluster import ClusterInfo

SPARE = 64  # the supervisor's own files: its sockets, the ranks' connections and pipes, logs
PER_RANK = 4  # a local rank's pipes and its connection to the supervisor


def chief_needs(cluster: ClusterInfo) -> int:
    """Files the chief of `cluster` opens for it, less SPARE: a link per worker node, a few per local rank."""
    return cluster.num_nodes - 1 + PER_RANK * cluster.local_slots


def check_open_files(needed: int) -> None:
    """Raise LaunchError, one line, when the hard limit cannot give this process `needed` files (+ SPARE)."""
    hard, want = resource.getrlimit(resource.RLIMIT_NOFILE)[1], needed + SPARE
    if hard != resource.RLIM_INFINITY and hard < want:
        raise LaunchError(f"this job needs {want} open files on the chief (one per node, and its own), "
                          f"but the limit is {hard} (ulimit -Hn): raise it, or run fewer nodes per chief")


def ensure_open_files(needed: int) -> int:
    """Make sure this process may open `needed` files (+ SPARE); the soft limit now in force."""
    check_open_files(needed)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + SPARE
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    return soft
