"""How a rank is asked to stop, and whether it gets the grace period: its signal disposition in /proc.

The stop signal goes to the rank's own process (the leader of its process group), not to its group:
the processes it started (DataLoader workers) keep running while a handler of its own saves a
checkpoint. Its group gets SIGCONT at once (a stopped rank can take the signal), SIGTERM when the
leader has ended (what it left behind), and SIGKILL at the grace deadline. SIGINT alone goes to the
whole group, as a terminal's Ctrl-C does: a shell script waits for its child on SIGINT, and
DataLoader workers expect it with their rank. A rank is asked once: a second stop signal (its
launcher's SIGTERM after the supervisor's) would enter its handler again, or end its checkpoint.

The grace period (--grace-period, 30 s, as torchrun's and SLURM's KillWait) is for a rank that can
use it; right after the signal, the rank's /proc/PID/status decides:

- it catches the signal (SigCgt: a handler), blocks it for now (SigBlk), or leaves it the default
  action (it dies at once: the grace costs nothing): it gets the grace;
- it ignores the signal (SigIgn): it will never act on it: SIGKILL now;
- it is still stopped after the SIGCONT (a tracing stop, state ``t``: a debugger holds it, and only
  the debugger can let it go): SIGKILL now.

Stdlib only: the wrapper (``python -S``) imports it by file, only when it stops a rank.
"""

from __future__ import annotations

NAMES = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 10: "SIGUSR1", 12: "SIGUSR2", 15: "SIGTERM"}
STOP_SIGNALS = frozenset({1, 2, 15})  # SIGHUP, SIGINT, SIGTERM: what a supervisor or launcher stops a rank with
GROUP_SIGNALS = frozenset({2})  # SIGINT: to the rank's whole group, as a terminal's Ctrl-C
IGNORED, CAUGHT, BLOCKED, DEFAULT = "ignored", "caught", "blocked", "default"


def read_status(pid: int | str) -> dict[str, str] | None:
    """/proc/PID/status as fields ('self' for this process); None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return None


def disposition(status: dict[str, str], signum: int) -> str:
    """What the process does with `signum`: IGNORED, CAUGHT (a handler), BLOCKED (for now) or DEFAULT."""
    bit = 1 << (signum - 1)
    for field, meaning in (("SigIgn", IGNORED), ("SigCgt", CAUGHT), ("SigBlk", BLOCKED)):
        try:
            if int(status.get(field, "0"), 16) & bit:
                return meaning
        except ValueError:
            pass
    return DEFAULT


def why_kill_now(pid: int, signum: int) -> str:
    """Why the rank `pid`, just sent `signum` and SIGCONT, will never act on them ('' : it gets the grace).
    A process that has ended (or cannot be read) gets '': its end is on its way to the wrapper."""
    status = read_status(pid)
    state = (status or {}).get("State", "Z")[:1]
    if status is None or state in ("Z", "X"):
        return ""
    name = NAMES.get(signum, f"signal {signum}")
    if disposition(status, signum) == IGNORED:
        return f"it ignores {name}"
    if state == "t":
        return f"a tracer (debugger) holds it stopped, so it cannot take {name}"
    if state == "T":  # SIGCONT wakes a stopped process as it is sent: still stopped, it never will be
        return f"it is stopped and SIGCONT did not wake it, so it cannot take {name}"
    return ""
