"""What a rank wrapper and its node's supervisor say to each other, and how a rank's end is written.

One JSON object per line over the supervisor's Unix socket:

    wrapper -> supervisor   {"t": "hello", "job": ID, "rank": N, "pid": P}
    supervisor -> wrapper   {"t": "ok", "log_dir": DIR|null, "console_ranks": [..]|null,
                             "prefix": "[rank={rank}] ", "node": N, "host": H, "hold": S,
                             "not_progress": [TEXT, ...] (only when a layer declares some),
                             "strict_teardown": B (--strict-teardown: a crash in Python's teardown fails the rank),
                             "template": PATH (warm ranks only: the rank template's socket, rank/warm.py)}
                            + 2 fds (SCM_RIGHTS);
                            hold: after a failure of its own rank, the wrapper stays up to S seconds, until
                            the supervisor's {"t": "release"} (the others' stacks are taken);
                            not_progress: output lines the wrapper does not mark as progress (RankWrapper)
                            {"t": "reject", "why": "..."}
    wrapper -> supervisor   {"t": "started", "pid": RANK_PID, "warm": true|false}
                            (warm: forked from the node's rank template, so the supervisor reaps it and says
                            supervisor -> wrapper {"t": "reaped", "code": C, "signal": S|null})
    wrapper -> supervisor   {"t": "traceback", "tail": [...], "wall": T}   (the rank printed a whole Python
                             traceback and is still running: it may hang in atexit; see ends_traceback)
    wrapper -> supervisor   {"t": "exit", "code": C, "signal": S|null, "tail": [...], "wall": T,
                             "log_error": "rank-1.log is incomplete: ..." (only when the log failed),
                             "ended": "finished"|"finalizing"|"raised"|"exit N" (only when its script had
                             ended before it died: Python was shutting down; progress.OutputMark.script_end),
                             "teardown_signal": N (only when code 0 stands for a rank that signal N ended while
                             Python finalized, its work done: wrapped_rank.RankEnd.teardown_signal)}

    client -> supervisor    {"t": "request", "what": "status", "args": {...}}   (control.py: another shell)
    supervisor -> client    {"t": "reply", "data": {...}}

The exit is reported as soon as the rank has ended, before the wrapper waits for whatever the rank
left behind to close its output.

The same module writes and reads a rank's status as JSON for the job link between nodes.

Stdlib only and cheap to import: the rank wrapper (``python -S``, once per rank) imports it. Messages
go through json's own C encoder and scanner (``_json``), not the ``json`` package, which imports
``re``, ``enum`` and more: about 1.2 MB in every rank's wrapper.
"""

from __future__ import annotations

import _signal
import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # never at run time: typing alone costs the wrapper about 1 MB
    from typing import Any

TAIL_LINES = 40  # stderr lines a rank's report carries: room for a deep traceback with warnings after it
SHOWN_LINES = 20  # at most this many of them (or of a launcher's output) appear in the end report
TAIL_BYTES = 16384  # how much of a stream is kept to find those lines in

# Defaults the stdlib-only wrapper shares with the CLI (config.py takes them from here).
DEFAULT_PREFIX = "[rank={rank}] "  # each output line's prefix
DEFAULT_GRACE = 30.0  # seconds between SIGTERM and SIGKILL: torchrun's and SLURM's (KillWait); stopping.py
LEFTOVER_WAIT = 5.0  # at most this of the grace for what an ended rank left (its output's holders, the sweep)

HELLO, OK, REJECT, STARTED, EXIT = "hello", "ok", "reject", "started", "exit"
TRACEBACK, RELEASE = "traceback", "release"
REAPED = "reaped"  # supervisor -> wrapper: how a warm rank (not the wrapper's child: rank/template.py) ended
REQUEST, REPLY = "request", "reply"  # a control client's question on the supervisor socket, and its answer
TRACEBACK_HEADER = b"Traceback (most recent call last):"
# The signals a process raises on itself when it crashes: one of them while Python finalizes, after the
# script and its atexit handlers (torch's gloo threads: docs/RESTARTS.md, "A crash in Python's teardown"),
# does not fail the rank unless --strict-teardown says so.
CRASH_SIGNALS = {_signal.SIGABRT: "SIGABRT", _signal.SIGSEGV: "SIGSEGV", _signal.SIGBUS: "SIGBUS",
                 _signal.SIGILL: "SIGILL", _signal.SIGFPE: "SIGFPE"}


def encode(message: dict[str, Any]) -> bytes:
    """One message as one line, byte for byte what ``json.dumps(message)`` writes (ASCII)."""
    return "".join(_codec()[0](message, 0)).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """One message; ValueError when the line is not a JSON object (what ``json.loads`` accepts)."""
    text = line.decode().strip(" \t\n\r")
    try:
        message, end = _codec()[1](text, 0)
    except StopIteration:  # nothing that starts a JSON value
        raise ValueError("not JSON") from None
    if end != len(text):
        raise ValueError("not one JSON value: extra data after it")
    if not isinstance(message, dict):
        raise ValueError("not a JSON object")
    return message


_CODEC: tuple[Any, Any] | None = None


class _Strict:
    """What ``_json.make_scanner`` reads of a ``json.JSONDecoder()`` with its defaults."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int, parse_constant = float, int, float  # float("NaN"), float("-Infinity")


def _codec() -> tuple[Any, Any]:
    """(encoder, scanner): the C halves of ``json.dumps`` and ``json.loads`` with their defaults
    (``_json``; it imports ``json.decoder`` itself only to raise a decode error)."""
    global _CODEC
    if _CODEC is None:
        import _json

        def unserializable(o: object) -> Any:
            raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

        _CODEC = (_json.make_encoder(None, unserializable, _json.encode_basestring_ascii, None, ": ", ", ",
                                     False, False, True),
                  _json.make_scanner(_Strict()))  # type: ignore[arg-type]  # any object with those attributes
    return _CODEC


def exit_code_of(code: int) -> int:
    """os.waitstatus_to_exitcode gives -N for a signal; a shell (and detlaunch) reports 128+N.

    The one conversion: the wrapper reports {"code": 128+N, "signal": N} with it, and
    outcome.ProcessEnd (the form every other part keeps) is made with it."""
    return 128 - code if code < 0 else code


def last_lines(data: bytes, count: int = TAIL_LINES) -> list[str]:
    """The last `count` non-blank lines of `data` (``\\r`` ends a line too: progress bars)."""
    lines = data.replace(b"\r", b"\n").decode("utf-8", "replace").splitlines()
    return [line for line in lines if line.strip()][-count:]


def ends_traceback(data: bytes) -> bool:
    """Whether `data` (a rank's stderr tail) ends its last Python traceback with the exception line:
    a whole line after the header that is not indented (a frame) and not blank."""
    start = data.rfind(TRACEBACK_HEADER)
    if start < 0:
        return False
    lines = data[start:].split(b"\n")[1:-1]  # the whole lines after the header
    return any(line[:1] not in (b" ", b"\t", b"") for line in lines)


def teardown_signal(status: int, ended: str, strict: bool) -> int | None:
    """The crash signal that ended a rank (`status`: its wait status) while its Python finalized, after its script
    returned 0 and its atexit handlers ran (`ended` "finalizing": progress.script_end): such a rank counts as
    finished, exit 0 (torch's gloo threads abort one so about 1 run in 6). None otherwise, or when `strict`
    (--strict-teardown; docs/RESTARTS.md, "A crash in Python's teardown")."""
    if strict or ended != "finalizing" or not os.WIFSIGNALED(status):
        return None
    return os.WTERMSIG(status) if os.WTERMSIG(status) in CRASH_SIGNALS else None


def teardown_line(rank: int, signum: int) -> str:
    """What the wrapper says on the rank's stderr of a crash it counts as finished (see teardown_signal)."""
    return f"detlaunch: rank {rank} {teardown_words(signum)}, exit 0 (--strict-teardown counts it as failed)\n"


def teardown_words(signum: int) -> str:
    """A rank counted as finished although a crash signal ended it while Python finalized."""
    return (f"killed by {CRASH_SIGNALS.get(signum, f'signal {signum}')} while Python finalized, after its script "
            "and its atexit handlers had finished: counted as finished")


def exit_message(code: int, signal: int | None, tail: list[str], wall: float) -> dict[str, Any]:
    return {"t": EXIT, "code": code, "signal": signal, "tail": tail, "wall": wall}


def status_to_json(s: Any) -> dict[str, Any]:
    """A RankStatus (outcome.py) as the job link carries it."""
    return {"rank": s.rank, "node": s.node_rank, "code": s.exit_code, "signal": s.signal,
            "tail": list(s.tail), "lost": s.lost, "host": s.host, "wall": s.wall, "stopped": s.stopped,
            "killed": s.killed, "log_error": s.log_error, "ended": s.ended, "teardown_signal": s.teardown_signal}


def status_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of RankStatus, from its JSON form (values checked and converted)."""
    return {"rank": int(d["rank"]), "node_rank": int(d["node"]),
            "exit_code": None if d.get("code") is None else int(d["code"]),
            "signal": None if d.get("signal") is None else int(d["signal"]),
            "tail": tuple(str(t) for t in d.get("tail") or ()), "lost": bool(d.get("lost")),
            "host": str(d.get("host") or ""), "wall": float(d.get("wall") or 0.0),
            "stopped": bool(d.get("stopped")), "killed": bool(d.get("killed")),
            "log_error": str(d.get("log_error") or ""), "ended": str(d.get("ended") or ""),
            "teardown_signal": None if d.get("teardown_signal") is None else int(d["teardown_signal"])}
