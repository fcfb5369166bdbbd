"""Recorded stderr of ranks that died in C++ (native_stderr/*.txt), as torch 2.8-2.13 print it on GPU nodes.

Written from torch's own formats (ProcessGroupNCCL.cpp's watchdog messages, NCCLUtils' "NCCL error in:"
and getNcclErrorDetailStr lines, c10's CUDA error text, libstdc++'s terminate message) and from logs of
real runs: torch 2.13's CPU wheel here has no NCCL to record them from.

- nccl_timeout.txt: rank 1's watchdog, an ALLREDUCE that ran past its 600 s timeout (SIGABRT).
- cuda_illegal_memory_access.txt: rank 0's watchdog finding a CUDA error on its stream (SIGABRT).
- nccl_remote_error.txt: a survivor's watchdog after a peer's process died (ncclRemoteError; SIGABRT).
- nccl_remote_error_python.txt: the same error raised in Python, in a collective (exit 1).
"""

from __future__ import annotations

import re
from pathlib import Path

FOLDER = Path(__file__).resolve().parent / "native_stderr"
TIMEOUT = FOLDER / "nccl_timeout.txt"
ILLEGAL_ACCESS = FOLDER / "cuda_illegal_memory_access.txt"
REMOTE_ERROR = FOLDER / "nccl_remote_error.txt"
REMOTE_ERROR_PYTHON = FOLDER / "nccl_remote_error_python.txt"
TAIL_LINES = 40  # what a rank's exit report carries (rank/protocol.py TAIL_LINES)


def tail(path: Path) -> list[str]:
    """The last lines of a recording, as a rank's exit report carries them (non-blank)."""
    return [line for line in path.read_text().splitlines() if line.strip()][-TAIL_LINES:]


_VARYING = re.compile(r"(SeqNum=|ran for |[Rr]ank ?|\[rank|<|0x|\d\d:\d\d:)([0-9a-f]+)")


def another_run(lines: list[str], seed: int = 7) -> list[str]:
    """The same failure another time: what differs between runs changed (sequence number, how long it ran,
    which rank's watchdog fired first, addresses, ports, timestamps), the rest as it was."""
    def change(m: re.Match[str]) -> str:
        digits = m.group(2)
        if m.group(1) == "0x":
            return "0x" + format((int(digits, 16) + seed * 0x1000) % 16 ** len(digits), f"0{len(digits)}x")
        if not digits.isdigit():
            return m.group(0)
        return m.group(1) + str(int(digits) + seed).zfill(len(digits))[: max(len(digits), 1) + 1]
    return [_VARYING.sub(change, line) for line in lines]
