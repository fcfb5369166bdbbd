"""The per-rank wrapper: one small process in front of each rank.

It plays the seed's pid_client and wrap_rank roles in one process:

- registers with its node's supervisor over a Unix socket and reports the rank's
  exit status (with the last lines of its stderr) before it exits;
- runs the rank in its own process group and forwards signals to that group;
- prefixes every stdout/stderr line with ``[rank=N] `` or the node's --prefix (``\\r`` ends a line too,
  so progress bars work), keeps the two streams apart, passes bytes through
  unchanged, and splits lines longer than PIPE_BUF so no write is ever torn;
- when the supervisor's connection drops (the supervisor was killed), stops the rank.

It is started as ``python -S run_wrapper.py`` and imports only a few stdlib
modules: it runs once per rank, so its start-up time and memory are the job's.
The argv is::

    run_wrapper.py [--rank N | --rank-env VAR,VAR] [--job ID] [--console-ranks 0,1]
                    [--log-dir DIR] [--grace S] [--prefix TEMPLATE] -- COMMAND...

The supervisor socket comes from the environment: DETLAUNCH_SSHD_SUPERVISOR
(set by a node's own sshd, so ranks that arrive over ssh find their node's
supervisor) wins over DETLAUNCH_SUPERVISOR. Without either, the wrapper only
prefixes output.
"""

from __future__ import annotations

import _signal as signal  # the C modules under signal and socket: the same calls, without
import _socket as socket  # their enum wrappers, which would cost every rank about 1 MB
import errno
import fcntl
import os
import select
import sys
import time

try:
    from . import protocol as rank_protocol  # imported as detlaunch.rank.wrapper
except ImportError:  # run as a script (python -S run_wrapper.py): its folder is sys.path[0]
    import protocol as rank_protocol  # type: ignore[no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:  # never at run time: the typing module alone costs about 1 MB
    from collections.abc import Iterator, Mapping
    from types import FrameType
    from typing import Any

    from .progress import OutputMark


def sibling(name: str) -> Any:
    """A module next to this one (progress, faultdump), imported only where a rank has a supervisor
    (a wrapper that only prefixes output never loads them): as detlaunch.NAME, or by file as a script."""
    return __import__(f"{__package__}.{name}" if __package__ else name, fromlist=["_"])

PIPE_BUF = 4096
READ_SIZE = 1 << 16
PIPE_SIZE = 1 << 18  # the rank's stdout pipe holds this much while the wrapper lets output gather
GATHER = 0.002  # after a read of less than PIPE_BUF bytes, let output gather this long (seconds)
DEFAULT_RANK_ENV = ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "DETLAUNCH_RANK")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                     signal.SIGUSR1, signal.SIGUSR2)


class UsageError(Exception):
    pass


def parse_args(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Parse the wrapper's small argv by hand (argparse alone costs more than the rest)."""
    opts: dict[str, Any] = {"rank": None, "rank_env": DEFAULT_RANK_ENV, "job": "", "console": None,
                            "log_dir": None, "grace": rank_protocol.DEFAULT_GRACE,
                            "prefix": rank_protocol.DEFAULT_PREFIX}
    i = 0
    while i < len(argv) and argv[i] != "--":
        key = argv[i]
        if i + 1 >= len(argv):
            raise UsageError(f"{key} needs a value")
        value = argv[i + 1]
        if key == "--rank":
            opts["rank"] = value
        elif key == "--rank-env":
            opts["rank_env"] = tuple(v for v in value.split(",") if v)
        elif key == "--job":
            opts["job"] = value
        elif key == "--console-ranks":
            opts["console"] = {int(r) for r in value.split(",") if r}
        elif key == "--log-dir":
            opts["log_dir"] = value
        elif key == "--grace":
            opts["grace"] = float(value)
        elif key == "--prefix":
            opts["prefix"] = value
        else:
            raise UsageError(f"unknown option {key}")
        i += 2
    command = argv[i + 1:]
    if not command:
        raise UsageError("no command given after --")
    return opts, command


def find_rank(explicit: str | None, names: tuple[str, ...], env: Mapping[str, str]) -> int:
    if explicit is not None:
        return int(explicit)
    for name in names:
        value = env.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    raise UsageError(f"cannot tell this process's rank: none of {', '.join(names)} is set")


class LinePrefixer:
    """Turns a byte stream into prefixed lines; ``\\n``, ``\\r`` and ``\\r\\n`` end a line.

    Bytes are never decoded, so any encoding (or none) passes through unchanged.
    A line longer than the limit is emitted in pieces, each but the last ending
    with an added ``\\n``, so that every emitted line fits in one atomic pipe write.
    """

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.limit = max(PIPE_BUF - len(prefix) - 2, 16)
        self.pending = b""

    def feed(self, data: bytes) -> bytes:
        """Return the complete lines of pending + data, prefixed; keep the partial rest."""
        buf = self.pending + data if self.pending else data
        end = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
        head, rest = buf[:end], buf[end:]
        out = self._prefix(head) if head else b""
        if len(rest) > self.limit:
            cut = len(rest) - len(rest) % self.limit
            out += self._pieces(rest[:cut], b"\n")
            rest = rest[cut:]
        self.pending = rest
        return out

    def flush(self) -> bytes:
        """At end of stream: the last partial line, ended with an added newline."""
        rest, self.pending = self.pending, b""
        return self.prefix + rest + b"\n" if rest else b""

    def _prefix(self, head: bytes) -> bytes:
        prefix = self.prefix
        if b"\r" not in head:
            lines = head.split(b"\n")
            lines.pop()  # head ends with "\n": nothing after it
            if max(map(len, lines)) <= self.limit:
                return prefix + (b"\n" + prefix).join(lines) + b"\n"
            return b"".join(self._pieces(line, b"\n") for line in lines)
        return b"".join(self._pieces(body, end) for body, end in split_lines(head))

    def _pieces(self, body: bytes, end: bytes) -> bytes:
        """One line: prefixed, split into pieces of at most `limit` bytes."""
        n = self.limit
        if len(body) <= n:
            return self.prefix + body + end
        parts = [body[i:i + n] for i in range(0, len(body), n)]
        last = parts.pop()
        return b"".join(self.prefix + p + b"\n" for p in parts) + self.prefix + last + end


def split_lines(head: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Yield (body, terminator) for each line of `head`, which ends with a line end."""
    parts = head.split(b"\n")
    after_last_newline = parts.pop()
    for part in parts:
        yield from _split_cr(part, b"\n")
    yield from _split_cr(after_last_newline, b"")


def _split_cr(part: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
    subs = part.split(b"\r")
    last = subs.pop()
    if not last and subs and end:  # "...\r\n" is one line end
        last = subs.pop()
        end = b"\r" + end
    for sub in subs:
        yield sub, b"\r"
    if last or end:
        yield last, end


def write_all(fd: int, data: bytes) -> None:
    """Write whole lines in pieces of at most PIPE_BUF bytes, so no line is torn."""
    view = memoryview(data)  # pieces are views: no copy of what remains after each write
    start, size = 0, len(data)
    while start < size:
        end = start + PIPE_BUF
        if end < size:
            cut = max(data.rfind(b"\n", start, end), data.rfind(b"\r", start, end)) + 1
            end = cut or end
        else:
            end = size
        while start < end:
            start += os.write(fd, view[start:end])


class RankLog:
    """The rank's log file (--log-dir). A write that fails (a full disk) never stops the rank: the
    file is closed, the problem said at once on the console, and again in the end report."""

    def __init__(self, log_dir: str | None, rank: int, warn_fd: int) -> None:
        self.path = os.path.join(log_dir, f"rank-{rank}.log") if log_dir else ""
        self.warn_fd = warn_fd
        self.error = ""  # one line for the report, once something went wrong
        self.fd: int | None = None
        if not log_dir:
            return
        try:
            os.makedirs(log_dir, exist_ok=True)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as e:
            self.fail(f"{self.path} could not be created: {os.strerror(e.errno or 0).lower()}")

    def write(self, data: bytes) -> None:
        if self.fd is None:
            return
        try:
            write_all(self.fd, data)
        except OSError as e:
            try:
                size = os.fstat(self.fd).st_size
            except OSError:
                size = 0
            os.close(self.fd)
            self.fd = None
            self.fail(f"{self.path} is incomplete: {os.strerror(e.errno or 0).lower()} after {size} bytes")

    def fail(self, why: str) -> None:
        self.error = why
        try:
            os.write(self.warn_fd, f"detlaunch: warning: {why}; the console has every line\n".encode())
        except OSError:
            pass


class Output:
    """Where one of the rank's streams goes: the console (maybe) and the rank's log file (maybe)."""

    def __init__(self, console_fd: int | None, log: RankLog | None) -> None:
        self.console_fd = console_fd
        self.log = log

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self.console_fd is not None:
            try:
                write_all(self.console_fd, data)
            except OSError:  # the console is gone: keep the rank running, drop this copy
                self.console_fd = None
        if self.log is not None:
            self.log.write(data)


class SupervisorConnection:
    """The connection to this node's supervisor (the pid_server role), or None when running alone."""

    @staticmethod
    def connect(path: str | None, job: str, rank: int
                ) -> tuple[SupervisorConnection | None, tuple[int, int], dict[str, Any]]:
        """Register; return the link and the console fds the supervisor hands over.

        Rank output goes straight to the node's console (the supervisor's stdout and
        stderr, passed over the socket), not through the launcher's pipes: no launcher
        re-prefixes it, ships it to another node, or slows it down.
        """
        if not path:
            return None, (1, 2), {}
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        try:
            sock.connect(path)
        except OSError as e:
            raise UsageError(f"cannot reach this node's detlaunch supervisor at {path}: {e.strerror}") from None
        link = SupervisorConnection(sock)
        link.send({"t": rank_protocol.HELLO, "job": job, "rank": rank, "pid": os.getpid()})
        data, fds = recv_fds(sock, 4096, 2)
        link.buffer = data
        reply = link.receive()
        if reply.get("t") != rank_protocol.OK or len(fds) != 2:
            raise UsageError(f"the supervisor refused rank {rank}: {reply.get('why', 'no reason given')}")
        sock.settimeout(None)
        return link, (fds[0], fds[1]), reply

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(rank_protocol.encode(message))

    def receive(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            data = self.sock.recv(4096)
            if not data:
                return {}
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return rank_protocol.decode(line)


def recv_fds(sock: socket.socket, size: int, count: int) -> tuple[bytes, list[int]]:
    """socket.recv_fds: receive up to `size` bytes and up to `count` file descriptors."""
    data, ancillary, _, _ = sock.recvmsg(size, socket.CMSG_LEN(count * 4))
    fds = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i:i + 4], sys.byteorder) for i in range(0, len(payload) - 3, 4)]
    return data, fds


class WrappedRank:
    """The rank's process, its output streams, and its report: the wrapper's whole job."""

    def __init__(self, rank: int, command: list[str], supervisor: SupervisorConnection | None,
                 console: tuple[int, int] | None, log: RankLog | None, grace: float,
                 prefix: bytes | None = None) -> None:
        """console: the (stdout, stderr) fds to write to, or None to keep this rank off the console."""
        self.rank = rank
        self.command = command
        self.supervisor = supervisor
        self.grace = grace
        self.prefix = f"[rank={rank}] ".encode() if prefix is None else prefix
        self.pid: int | None = None
        self.status: int | None = None
        self.ended_at = 0.0
        self.pending_signal: int | None = None
        self.kill_deadline: float | None = None
        self.killed = False  # SIGKILL sent: nothing is left to escalate to
        self.tail = b""
        self.log = log
        self.reported = False
        self.output_mark: OutputMark | None = None  # the time of the last output: for status and the hang watch
        self.traceback_started = self.told_traceback = False
        self.hold = 0.0  # seconds to stay after a failure of the rank's own, while the others' stacks are taken
        self.asked_to_stop = False  # a signal came: the rank's end is not a failure of its own
        self.released = False  # the supervisor let it go already
        out, err = console if console else (None, None)
        self.outputs = {1: Output(out, log), 2: Output(err, log)}

    # -- signals --------------------------------------------------------------
    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.asked_to_stop = True
        if self.pid is None:
            self.pending_signal = signum
        elif self.status is None:
            self.signal_rank(signum)

    def signal_rank(self, signum: int) -> None:
        if self.pid is None:
            return
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass

    def stop_rank(self) -> None:
        """Ask the rank's group to stop now and make sure it is gone after the grace period."""
        self.signal_rank(signal.SIGTERM)
        self.signal_rank(signal.SIGCONT)  # a SIGSTOPped rank (a hung one, stopped to look at) can take it now
        if self.kill_deadline is None and not self.killed:
            self.kill_deadline = time.monotonic() + self.grace

    # -- the loop ---------------------------------------------------------------
    def run(self) -> int:
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, self.on_signal)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:  # room for output to gather in while the wrapper waits (see GATHER below)
            fcntl.fcntl(out_w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
            gather = GATHER
        except OSError:  # over the user's pipe quota: read as soon as anything arrives
            gather = 0
        actions = [(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2),
                   (os.POSIX_SPAWN_CLOSE, out_w), (os.POSIX_SPAWN_CLOSE, err_w)]
        try:
            pid = self.pid = os.posix_spawnp(self.command[0], self.command, os.environ, file_actions=actions,
                                             setpgroup=0, setsigdef=FORWARDED_SIGNALS + (signal.SIGPIPE,))
        except OSError as e:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            return self.cannot_start(e)
        os.close(out_w)
        os.close(err_w)
        if self.supervisor:
            try:
                self.supervisor.send({"t": rank_protocol.STARTED, "pid": self.pid})
            except OSError:  # the supervisor is gone already: the rank must not outlive it
                self.supervisor = None
                self.stop_rank()
        if self.pending_signal is not None:
            self.signal_rank(self.pending_signal)
        pidfd = os.pidfd_open(pid)
        streams = {out_r: (LinePrefixer(self.prefix), self.outputs[1], False),
                   err_r: (LinePrefixer(self.prefix), self.outputs[2], True)}
        poller = select.poll()
        for fd in (out_r, err_r, pidfd):
            poller.register(fd, select.POLLIN)
        supervisor = self.supervisor
        sup_fd = supervisor.sock.fileno() if supervisor else None
        if sup_fd is not None:
            poller.register(sup_fd, select.POLLIN)
        # While output gathers (see GATHER), the rank's exit and the supervisor still wake us at once.
        events_only = select.poll()
        for event_fd in (pidfd, sup_fd):
            if event_fd is not None:
                events_only.register(event_fd, select.POLLIN)

        def take(fd: int, data: bytes) -> None:
            prefixer, output, is_stderr = streams[fd]
            if data:
                output.write(prefixer.feed(data))
                if self.output_mark is not None:
                    self.output_mark.touch()
                if is_stderr:
                    self.tail = (self.tail + data)[-rank_protocol.TAIL_BYTES:]
                    if b"Traceback" in data:  # a new one (a handled one may come first): told once whole
                        self.traceback_started, self.told_traceback = True, False
                    if self.traceback_started and not self.told_traceback and rank_protocol.ends_traceback(self.tail):
                        self.tell_traceback()  # its exception line may have come in a later read
            else:
                output.write(prefixer.flush())
                poller.unregister(fd)
                os.close(fd)
                del streams[fd]

        def drain(fd: int) -> None:
            """Take everything in the pipe now, without waiting for more."""
            os.set_blocking(fd, False)
            try:
                while fd in streams:
                    take(fd, os.read(fd, READ_SIZE))
            except BlockingIOError:
                pass

        while streams or self.status is None:
            if self.killed and self.status is not None:
                # The rank's group is dead, yet its output is still open: a process that left the
                # group (setsid) holds it. Take what is in the pipes and stop waiting for that
                # process; the supervisor stops it with the rest of the job.
                for fd in list(streams):
                    drain(fd)
                    if fd in streams:
                        take(fd, b"")
                break
            timeout: float | None = None
            if self.kill_deadline is not None:
                timeout = max(0, (self.kill_deadline - time.monotonic()) * 1000)
            events = poller.poll(timeout)
            if self.kill_deadline is not None and time.monotonic() >= self.kill_deadline:
                self.signal_rank(signal.SIGKILL)
                self.killed, self.kill_deadline = True, None
            short_read = False
            for fd, _ in events:
                if fd in streams:
                    try:
                        data = os.read(fd, READ_SIZE)
                    except BlockingIOError:  # drained already (see drain)
                        continue
                    short_read = short_read or 0 < len(data) < PIPE_BUF
                    take(fd, data)
                elif fd == pidfd:
                    _, self.status = os.waitpid(pid, 0)
                    self.ended_at = time.time()  # wall clock: failures on different nodes are ordered by it
                    poller.unregister(pidfd)
                    events_only.unregister(pidfd)
                    os.close(pidfd)
                    for stream_fd in list(streams):  # what the rank wrote before it ended, for its report
                        drain(stream_fd)
                    # Report now: a process the rank left behind may hold its output open for long,
                    # and the job must not wait for that to learn how the rank ended.
                    self.report()
                    if streams:  # something the rank started still holds its output open
                        self.stop_rank()
                elif supervisor and fd == sup_fd:
                    try:
                        data = supervisor.sock.recv(4096)
                    except OSError:  # reset: the supervisor died with our messages unread
                        data = b""
                    self.released = self.released or bool(data)  # its only message: rank_protocol.RELEASE
                    if not data:
                        poller.unregister(sup_fd)
                        events_only.unregister(sup_fd)
                        supervisor.sock.close()
                        self.supervisor = None
                        self.stop_rank()
            # A rank that writes a line at a time (python -u, progress bars) would wake the
            # wrapper for every line, costing both a syscall and a context switch per line:
            # after a short read, let its output gather for a moment. The first line after
            # a quiet spell still goes out at once; a burst waits at most GATHER; the rank's
            # exit is reported without delay.
            if short_read and gather and self.status is None:
                events_only.poll(gather * 1000)
        return self.finish()

    def tell_traceback(self) -> None:
        """The rank printed a whole Python traceback: if it does not exit soon, the supervisor counts it as failed."""
        self.told_traceback = True
        if self.supervisor and self.status is None:
            try:
                self.supervisor.send({"t": rank_protocol.TRACEBACK, "tail": rank_protocol.last_lines(self.tail),
                                      "wall": time.time()})
            except OSError:
                pass

    def cannot_start(self, e: OSError) -> int:
        """The command could not be started: the rank ends as a shell would say it (127 not found,
        126 not executable), with the reason as its last stderr line, reported like any exit."""
        program = self.command[0]
        why = e.strerror or str(e)
        if e.errno == errno.ENOENT and os.path.exists(program):
            why += " (the interpreter on its #! line is missing)"
        line = f"cannot start {program}: {why}"
        self.outputs[2].write(self.prefix + line.encode() + b"\n")
        self.tail = line.encode() + b"\n"
        self.status = (127 if e.errno == errno.ENOENT else 126) << 8  # a wait status, as if it had exited
        self.ended_at = time.time()
        return self.finish()

    def exit_code(self) -> tuple[int, int | None]:
        assert self.status is not None
        code = os.waitstatus_to_exitcode(self.status)
        return rank_protocol.exit_code_of(code), (-code if code < 0 else None)

    def report(self) -> None:
        """Tell the supervisor how the rank ended (once; a log problem known by then goes with it)."""
        if self.reported or not self.supervisor:
            return
        self.reported = True
        code, signum = self.exit_code()
        message = rank_protocol.exit_message(code, signum, rank_protocol.last_lines(self.tail), self.ended_at)
        ended = self.output_mark.script_end() if self.output_mark is not None else ""
        if ended:  # its script had ended before it died: Python was shutting down
            message["ended"] = ended
        if self.log is not None and self.log.error:
            message["log_error"] = self.log.error
        try:
            self.supervisor.send(message)
        except OSError:
            pass

    def finish(self) -> int:
        self.report()
        self.hold_exit()
        return self.exit_code()[0]

    def hold_exit(self) -> None:
        """The rank failed on its own: stay until the supervisor says so (any message, or its socket closing),
        at most `hold` seconds. A launcher (torchrun) kills the other ranks as soon as one of its workers
        exits: the supervisor takes their stacks first (dump before kill)."""
        supervisor = self.supervisor
        if supervisor is None or self.hold <= 0 or self.asked_to_stop or self.released or self.exit_code()[0] == 0:
            return
        poller = select.poll()
        poller.register(supervisor.sock.fileno(), select.POLLIN)
        try:
            poller.poll(self.hold * 1000)
        except OSError:
            pass


def watch_progress(run_dir: str, rank: int) -> OutputMark | None:
    """The rank's progress file in its node's run dir, named in DETLAUNCH_PROGRESS_FILE for
    detlaunch.rank.progress(); None (no hang watch for this rank) when it cannot be made."""
    progress = sibling("progress")
    try:
        path = progress.create_progress_file(run_dir, rank)
        mark = progress.OutputMark(path)
    except (OSError, ValueError) as e:
        os.write(2, f"detlaunch rank wrapper: warning: no progress file for rank {rank}: {e}\n".encode())
        return None
    os.environ[progress.ENV] = path
    return mark  # type: ignore[no-any-return]


def offer_faulthandler(run_dir: str, rank: int) -> None:
    """Let the rank's Python register faulthandler for detlaunch's stack fallback (faultdump.py), so its
    stack can be had when py-spy cannot read it; without the file there is no fallback for this rank."""
    try:
        sibling("faultdump").prepare(run_dir, rank, os.environ)
    except OSError as e:
        os.write(2, f"detlaunch rank wrapper: warning: no faulthandler file for rank {rank}: {e}\n".encode())


def main(argv: list[str] | None = None) -> int:
    try:
        opts, command = parse_args(sys.argv[1:] if argv is None else argv)
        rank = find_rank(opts["rank"], opts["rank_env"], os.environ)
        path = os.environ.get("DETLAUNCH_SSHD_SUPERVISOR") or os.environ.get("DETLAUNCH_SUPERVISOR")
        supervisor, console_fds, node = SupervisorConnection.connect(path, opts["job"], rank)
        # Where logs go and which ranks reach the console are this node's settings: a rank that
        # arrived over ssh carries the chief's argv, its node's supervisor knows better.
        console_ranks = node.get("console_ranks", opts["console"])
        console = None if console_ranks is not None and rank not in console_ranks else console_fds
        log_dir = node.get("log_dir", opts["log_dir"])
        # This attempt's variables (DETLAUNCH_RESTART_COUNT...), over any a launcher set (torchrun's own count).
        os.environ.update({str(k): str(v) for k, v in (node.get("env") or {}).items()})
        log = RankLog(log_dir, rank, warn_fd=console_fds[1])
        prefix = str(node.get("prefix") or opts["prefix"]).format(
            rank=rank, node=node.get("node", ""), host=node.get("host") or socket.gethostname())
        wrapper = WrappedRank(rank, command, supervisor, console, log, opts["grace"], prefix.encode())
        wrapper.hold = float(node.get("hold") or 0)
        if supervisor and path:
            wrapper.output_mark = watch_progress(os.path.dirname(path), rank)
            offer_faulthandler(os.path.dirname(path), rank)
        return wrapper.run()
    except (UsageError, ValueError) as e:
        os.write(2, f"detlaunch rank wrapper: error: {e}\n".encode())
        return 2
    except FileNotFoundError as e:
        os.write(2, f"detlaunch rank wrapper: error: command not found: {e.filename}\n".encode())
        return 127


if __name__ == "__main__":
    sys.exit(main())
