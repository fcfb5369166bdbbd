"""torch's Flight Recorder of a rank, asked for while the rank's main thread is blocked.

On GPUs a NCCL collective returns at once and the rank blocks later, at its next sync point
(``.item()``, ``backward``): its Python stack does not say which collective it never joined. torch's
Flight Recorder does: every rank records each collective it entered (a ring of
``TORCH_FR_BUFFER_SIZE`` entries, gloo's and NCCL's), and a dump compares them across ranks.

The rank's main thread cannot be asked (it is in a collective, or a CUDA sync; a Python signal
handler would run only on it), so a thread waits in the rank, started by faultsite/sitecustomize.py
when the rank's Python begins importing ``torch.distributed`` (ranks that never import it get no
thread). It holds a per-rank FIFO of the node's private run dir (``flight-RANK``, made here by the
wrapper) open read-write and blocks in read(2) on it. To ask, the supervisor makes a reply FIFO
``flight-RANK.NONCE`` (0600), opens it for reading, writes ``NONCE\\n`` into the rank's FIFO and waits
on the reply with a deadline; the rank's thread takes the GIL, and, if torch.distributed is imported
and initialised (sys.modules: it never imports torch itself), writes torch's dumps into the reply
FIFO as one JSON object, ``{"fr": <_dump_fr_trace_json>, "nccl": <_dump_nccl_trace_json>}``, or
``{"error": why}``, and closes it. A rank whose thread cannot get the GIL (the main thread holds it
in a C call that does not release it) does not answer before the deadline, and the answer says so.

Opening the rank's FIFO for writing without blocking fails at once (ENXIO) when no thread holds it:
the rank never imported torch.distributed, or it runs without detlaunch's sitecustomize.

Stdlib only and cheap to import: the wrapper (``python -S``) imports it by file for `prepare`.
"""

from __future__ import annotations

import _thread
import os

ENV = "DETLAUNCH_FLIGHT_FIFO"  # the rank's FIFO, read (and removed from the environment) by faultsite/sitecustomize.py
SWITCH = "DETLAUNCH_FLIGHT_RECORDER"  # "0": neither the Flight Recorder's default size nor the listener
BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # torch reads the first one set
ENTRIES = "2000"  # entries per rank: about 0.9 KB each (2 MB of RSS a rank for a full ring, measured)
MAX_ANSWER = 64 << 20  # bytes read of one rank's answer, at most
ABSENT = "no flight recorder listener in it (it has not imported torch.distributed, or runs without " \
         "detlaunch's sitecustomize)"
NO_FIFO = f"no flight recorder FIFO for it ({SWITCH}=0 or DETLAUNCH_FAULTHANDLER=0, or its wrapper is older)"
_ASKING = _thread.allocate_lock()  # one question at a time from this supervisor (the hang and a shell's)


def fifo_path(directory: str, rank: int) -> str:
    """The rank's FIFO in its node's run dir (the supervisor writes questions into it)."""
    return os.path.join(directory, f"flight-{rank}")


def prepare(directory: str, rank: int, env: dict[str, str], listener: bool = True) -> str | None:
    """For the wrapper, before it starts the rank: turn the Flight Recorder on (TORCH_FR_BUFFER_SIZE, unless
    the user set it or TORCH_NCCL_TRACE_BUFFER_SIZE) and, with `listener` (detlaunch's sitecustomize will
    run in the rank), make the rank's FIFO (0600, fresh) and name it in `env`. The FIFO's path, or None."""
    if env.get(SWITCH) == "0":
        return None
    if not any(name in env for name in BUFFER_VARS):
        env[BUFFER_VARS[0]] = ENTRIES
    if not listener:
        return None
    path = fifo_path(directory, rank)
    try:
        os.unlink(path)  # an earlier attempt's
    except FileNotFoundError:
        pass
    os.mkfifo(path, 0o600)
    env[ENV] = path
    return path


class Question:
    """One question to several ranks of this node: `send` to all, then `receive` their answers.

    For the supervisor, on the stack collector's thread (never the event loop): send() before py-spy
    runs, receive() after, so the ranks dump while py-spy reads them. Each answer is the rank's bytes
    or (None, why); a rank that exits meanwhile ends its wait at once (a pidfd of it)."""

    def __init__(self, fifos: dict[int, str]) -> None:
        self.fifos = fifos  # {rank's pid: its FIFO}
        self.replies: dict[int, tuple[int, str]] = {}  # pid: (read end of its reply FIFO, its path)
        self.exits: dict[int, int] = {}  # pidfd: pid
        self.answers: dict[int, tuple[bytes | None, str]] = {}
        self.locked = False

    def send(self, deadline: float) -> None:
        import time

        self.locked = _ASKING.acquire(timeout=max(0.0, deadline - time.monotonic()))
        if not self.locked:
            self.answers = {pid: (None, "another question to its flight recorder was still being answered")
                            for pid in self.fifos}
            return
        for pid, fifo in self.fifos.items():
            why = self._send_one(pid, fifo)
            if why:
                self.answers[pid] = (None, why)

    def _send_one(self, pid: int, fifo: str) -> str:
        nonce = os.urandom(8).hex()
        reply = f"{fifo}.{nonce}"
        try:
            os.mkfifo(reply, 0o600)
        except OSError as e:
            return f"cannot make its reply FIFO: {e.strerror}"
        try:
            fd = os.open(reply, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # no writer yet: returns at once
        except OSError as e:
            os.unlink(reply)
            return f"cannot open its reply FIFO: {e.strerror}"
        self.replies[pid] = (fd, reply)
        try:
            self.exits[os.pidfd_open(pid)] = pid
        except OSError:
            return "it has exited"
        state = _state(pid)
        if state in ("T", "t"):
            return "it is stopped (SIGSTOP): it answers only once it continues"
        if state in ("Z", "X", ""):
            return "it has exited"
        try:
            ask = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return NO_FIFO
        except OSError as e:
            return ABSENT if e.errno == 6 else f"cannot open its flight recorder FIFO: {e.strerror}"  # 6: ENXIO
        try:
            os.write(ask, f"{nonce}\n".encode())  # 17 bytes: one atomic write (<= PIPE_BUF)
        except OSError as e:
            return f"cannot ask it: {e.strerror}"
        finally:
            os.close(ask)
        return ""

    def receive(self, deadline: float, wait_words: str = "") -> dict[int, tuple[bytes | None, str]]:
        """Every rank's answer: what it wrote once it closed its reply, or why not (the deadline came first:
        `did not answer within S s`, plus `wait_words`; it exited first)."""
        import select
        import time

        start = time.monotonic()
        pending = {pid for pid in self.replies if pid not in self.answers}
        chunks: dict[int, list[bytes]] = {pid: [] for pid in pending}
        by_fd = {self.replies[pid][0]: pid for pid in pending}
        pidfd = {pid: fd for fd, pid in self.exits.items()}
        empty: set[int] = set()  # closed its reply without a word: its exit is on the way (its files close first)
        try:
            while pending and time.monotonic() < deadline:
                watched = [fd for fd, pid in by_fd.items() if pid in pending and pid not in empty]
                watched += [pidfd[pid] for pid in pending if pid in pidfd]
                ready, _, _ = select.select(watched, [], [], max(0.0, deadline - time.monotonic()))
                for fd in ready:
                    if fd in self.exits:  # it exited: what it had written, if whole, else why not
                        pid = self.exits[fd]
                        if pid in pending:
                            pending.discard(pid)
                            whole = _drain(self.replies[pid][0], chunks[pid])
                            self.answers[pid] = (b"".join(chunks[pid]), "") if whole else (
                                None, "it exited before it answered")
                        continue
                    pid = by_fd[fd]
                    if pid not in pending:
                        continue
                    data = os.read(fd, 1 << 16)
                    if data:
                        chunks[pid].append(data)
                        if sum(map(len, chunks[pid])) > MAX_ANSWER:
                            pending.discard(pid)
                            self.answers[pid] = (None, f"its answer was over {MAX_ANSWER >> 20} MiB")
                    elif chunks[pid]:  # EOF: the rank closed its reply
                        pending.discard(pid)
                        self.answers[pid] = (b"".join(chunks[pid]), "")
                    else:
                        empty.add(pid)
            waited = max(0.0, deadline - start)
            for pid in pending:
                self.answers[pid] = (None, "it closed its reply without an answer" if pid in empty else
                                     f"did not answer within {waited:.1f} s{wait_words}")
        finally:
            self.close()
        return self.answers

    def close(self) -> None:
        for fd, path in self.replies.values():
            os.close(fd)
            try:
                os.unlink(path)
            except OSError:
                pass
        for fd in self.exits:
            os.close(fd)
        self.replies, self.exits = {}, {}
        if self.locked:
            self.locked = False
            _ASKING.release()


def _state(pid: int) -> str:
    """The process's state letter (/proc/PID/stat), '' when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat[stat.rfind(b")") + 2:][:1].decode()


def _drain(fd: int, into: list[bytes]) -> bool:
    """Whatever a rank that exited had written into its reply: True when that was a whole answer (EOF)."""
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        if not data:
            return bool(into)
        into.append(data)
