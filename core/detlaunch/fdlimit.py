"""Open files for the chief: one socket per worker node, so a job of a thousand nodes needs more than
the usual soft limit of 1024. The chief raises its soft limit as far as the hard limit allows, and
refuses to start, in one line, when even the hard limit is too low (rather than failing to accept
the 1000th node half-way through the start).
"""

from __future__ import annotations

import resource

from .errors import LaunchError

SPARE = 64  # the supervisor's own files: its sockets, the ranks' connections and pipes, logs


def ensure_open_files(needed: int) -> int:
    """Make sure this process may open `needed` files (+ SPARE); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + SPARE
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            raise LaunchError(f"this job needs {want} open files on the chief (one per node, and its own), "
                              f"but the limit is {hard} (ulimit -Hn): raise it, or run fewer nodes per chief")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    return soft
