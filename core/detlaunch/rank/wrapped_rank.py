"""The rank's process, watched by its wrapper: started, its output passed on, signals forwarded, its end reported.

Part of the per-rank wrapper (``python -S``, stdlib only: see wrapper.py). One poll loop waits for
the rank's output, its exit (a pidfd), its supervisor's word and the kill deadline; nothing polls.
"""

from __future__ import annotations

import _signal as signal  # the C module under signal: the same calls, without its enum wrappers (~1 MB)
import errno
import fcntl
import os
import select
import time

try:  # imported as detlaunch.rank.wrapped_rank
    from . import protocol as rank_protocol
    from . import stopping
    from .output import PIPE_BUF, LinePrefixer, Output
except ImportError:  # by file, from the wrapper's folder (python -S run_wrapper.py)
    import protocol as rank_protocol  # type: ignore[no-redef]
    import stopping  # type: ignore[no-redef]
    from output import PIPE_BUF, LinePrefixer, Output  # type: ignore[no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:  # never at run time: the typing module alone costs about 1 MB
    from types import FrameType

    from .connection import SupervisorConnection
    from .output import RankLog
    from .progress import OutputMark

READ_SIZE = 1 << 16
PIPE_SIZE = 1 << 18  # the rank's stdout pipe holds this much while the wrapper lets output gather
GATHER = 0.002  # after a read of less than PIPE_BUF bytes, let output gather this long (seconds)
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                     signal.SIGUSR1, signal.SIGUSR2)
NOT_PROGRESS_BURST = 0.1  # seconds: what a stream brings this soon after output that is not progress is its rest


class Stream:
    """One of the rank's output pipes: what it reads, prefixed, goes to `output`."""

    __slots__ = ("prefixer", "output", "is_stderr", "quiet_until")

    def __init__(self, prefix: bytes, output: Output, is_stderr: bool) -> None:
        self.prefixer, self.output, self.is_stderr = LinePrefixer(prefix), output, is_stderr
        self.quiet_until = 0.0  # until then (monotonic), a read continues a message that is not progress


class RankEnd:
    """The wrapper's report of its rank's end (WrappedRank's last part): what the supervisor is told."""

    rank: int
    command: list[str]
    supervisor: SupervisorConnection | None
    status: int | None
    ended_at: float
    tail: bytes
    log: RankLog | None
    reported: bool
    told_traceback: bool
    output_mark: OutputMark | None
    hold: float
    asked_to_stop: bool
    released: bool
    prefix: bytes
    outputs: dict[int, Output]
    strict_teardown: bool  # --strict-teardown (see teardown_signal)

    def finish(self) -> int:
        self.report()
        self.hold_exit()
        return self.exit_code()[0]

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
        """(exit code, signal) as detlaunch reports the rank's end: (0, None) for a crash in Python's teardown."""
        assert self.status is not None
        if self.teardown_signal() is not None:
            return 0, None
        code = os.waitstatus_to_exitcode(self.status)
        return rank_protocol.exit_code_of(code), (-code if code < 0 else None)

    def teardown_signal(self) -> int | None:
        """rank_protocol.teardown_signal of the rank's end (None while it runs): a read of its mapped progress file."""
        if self.status is None:
            return None
        ended = self.output_mark.script_end() if self.output_mark is not None else ""
        return rank_protocol.teardown_signal(self.status, ended, self.strict_teardown)

    def report(self) -> None:
        """Tell the supervisor how the rank ended (once; a log problem known by then goes with it); a crash in
        Python's teardown counted as finished is said on the rank's stderr too."""
        if self.reported:
            return
        self.reported = True
        teardown = self.teardown_signal()
        if teardown is not None:
            self.outputs[2].write(self.prefix + rank_protocol.teardown_line(self.rank, teardown).encode())
        if not self.supervisor:
            return
        code, signum = self.exit_code()
        message = rank_protocol.exit_message(code, signum, rank_protocol.last_lines(self.tail), self.ended_at)
        ended = self.output_mark.script_end() if self.output_mark is not None else ""
        if ended:  # its script had ended before it died: Python was shutting down
            message["ended"] = ended
        if teardown is not None:
            message["teardown_signal"] = teardown
        if self.log is not None and self.log.error:
            message["log_error"] = self.log.error
        try:
            self.supervisor.send(message)
        except OSError:
            pass

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


class StoppedBeforeStart(Exception):
    """A stop signal came while the rank template was still importing: the rank is not started at all."""


class WrappedRank(RankEnd):
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
        self.stop_pending = 0  # the first stop signal that came before the rank existed (pending_signal: the last)
        self.kill_deadline: float | None = None
        self.killed = False  # SIGKILL sent: nothing is left to escalate to
        self.tail = b""
        self.log = log
        self.reported = False
        self.output_mark: OutputMark | None = None  # the time of the last output: for status and the hang watch
        self.not_progress: tuple[bytes, ...] = ()  # output that does not count as progress (RankWrapper.not_progress)
        self.traceback_started = self.told_traceback = False
        self.hold = 0.0  # seconds to stay after a failure of the rank's own, while the others' stacks are taken
        self.strict_teardown = False  # see teardown_signal()
        self.asked_to_stop = False  # a signal came: the rank's end is not a failure of its own
        self.asked_once = False  # a stop signal was passed on: the next one is not (stopping.py)
        self.released = False  # the supervisor let it go already
        self.template = ""  # the node's rank template's socket: the rank is forked from it (warm.py)
        self.warm = False  # it was: the supervisor reaps it and says how it ended (rank_protocol.REAPED)
        out, err = console if console else (None, None)
        self.outputs = {1: Output(out, log), 2: Output(err, log)}
        # The watch (see watch()): the rank's open output pipes by fd, and what wakes the loop.
        self.streams: dict[int, Stream] = {}
        self.gather = GATHER
        self.pidfd = -1
        self.sup_fd: int | None = None
        self.poller = select.poll()  # every fd the loop waits on
        self.events_only = select.poll()  # the rank's exit and the supervisor: while output gathers

    # -- signals --------------------------------------------------------------
    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.asked_to_stop = True
        if self.pid is None:
            self.pending_signal = signum
            if signum in stopping.STOP_SIGNALS and not self.stop_pending:
                self.stop_pending = signum
        elif self.status is None:
            self.pass_on(signum)

    def pass_on(self, signum: int) -> None:
        """A signal for the rank, to its own process; a stop signal once, with the rule of stopping.py."""
        if signum not in stopping.STOP_SIGNALS:
            self.signal_leader(signum)
        elif not self.asked_once:  # a second stop signal would enter its handler again, or end its checkpoint
            self.asked_once = True
            if signum in stopping.GROUP_SIGNALS:
                self.signal_group(signum)
            else:
                self.signal_leader(signum)
            self.signal_group(signal.SIGCONT)  # a SIGSTOPped rank (a hung one, stopped to look at) can take it now
            assert self.pid is not None
            why = stopping.why_kill_now(self.pid, signum)
            if why:
                self.kill_now(why)

    def signal_leader(self, signum: int) -> None:
        """The rank's own process, while it has not been reaped (its pid is then free for another)."""
        if self.pid is not None and self.status is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def signal_group(self, signum: int) -> None:
        if self.pid is None:
            return
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass

    def kill_now(self, why: str) -> None:
        """SIGKILL the rank's group now, saying why on its stderr (console and log): it would only waste the grace."""
        self.outputs[2].write(self.prefix + f"detlaunch: {why}: SIGKILLed now, not after the grace period\n".encode())
        self.signal_group(signal.SIGKILL)
        self.killed, self.kill_deadline = True, None

    def stop_rank(self) -> None:
        """Ask the rank to stop now (its supervisor is gone) and make sure it is gone after the grace period."""
        self.asked_to_stop = True
        if self.status is None:
            self.pass_on(signal.SIGTERM)
        else:  # it has ended (and its pid may be another's): what it left behind in its group
            self.signal_group(signal.SIGTERM)
            self.signal_group(signal.SIGCONT)
        if self.kill_deadline is None and not self.killed:
            self.kill_deadline = time.monotonic() + self.grace

    # -- the run, step by step --------------------------------------------------
    def run(self) -> int:
        """Start the rank, watch it and its output to their end, report; the rank's exit code."""
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, self.on_signal)
        try:
            self.start()
        except StoppedBeforeStart:  # it ends as stopped by the signal, at once: nothing of its own ran
            self.status, self.ended_at = self.stop_pending or signal.SIGTERM, time.time()
            return self.finish()
        except OSError as e:
            return self.cannot_start(e)
        self.tell_started()
        self.watch()
        return self.finish()

    def start(self) -> None:
        """Spawn the rank in a process group of its own, its stdout and stderr into our pipes."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:  # room for output to gather in while the wrapper waits (see GATHER)
            fcntl.fcntl(out_w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:  # over the user's pipe quota: read as soon as anything arrives
            self.gather = 0
        actions = [(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2),
                   (os.POSIX_SPAWN_CLOSE, out_w), (os.POSIX_SPAWN_CLOSE, err_w)]
        try:
            if self.template:
                self.pid = self.start_warm(out_w, err_w)
            if not self.pid:
                self.pid = os.posix_spawnp(self.command[0], self.command, os.environ, file_actions=actions,
                                           setpgroup=0, setsigdef=FORWARDED_SIGNALS + (signal.SIGPIPE,))
        except (OSError, StoppedBeforeStart):
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        self.streams = {out_r: Stream(self.prefix, self.outputs[1], False),
                        err_r: Stream(self.prefix, self.outputs[2], True)}

    def start_warm(self, out_w: int, err_w: int) -> int | None:
        """The rank forked from its node's rank template (warm.py), or None: it starts cold (the template or
        the supervisor says why, once for the job). Not this process's child: its supervisor reaps it."""
        try:
            from . import warm
        except ImportError:  # by file
            import warm  # type: ignore[no-redef]
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # a stop signal ends the wait (warm.ask)
        old = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            if self.stop_pending:  # before the wake fd was there to take it
                raise StoppedBeforeStart
            pid, why = warm.ask(self.template, self.command, (0, out_w, err_w), FORWARDED_SIGNALS + (signal.SIGPIPE,),
                                wake_r, stopping.STOP_SIGNALS)
        finally:
            signal.set_wakeup_fd(old)
            os.close(wake_r)
            os.close(wake_w)
        if why == warm.STOPPED or (not pid and self.stop_pending):  # no rank, and none to start cold now
            raise StoppedBeforeStart
        self.warm = pid > 0
        return pid or None

    def tell_started(self) -> None:
        """Tell the supervisor the rank's pid; pass on a signal that came before the rank existed."""
        if self.supervisor:
            try:
                self.supervisor.send({"t": rank_protocol.STARTED, "pid": self.pid, "warm": self.warm})
            except OSError:  # the supervisor is gone already: the rank must not outlive it
                self.supervisor = None
                self.stop_rank()
        if self.stop_pending:
            self.pass_on(self.stop_pending)
        if self.pending_signal is not None and self.pending_signal != self.stop_pending:
            self.pass_on(self.pending_signal)

    def watch(self) -> None:
        """Until the rank has ended and its output is closed: pass output on, take its exit, heed the
        supervisor, and SIGKILL the rank's group at the kill deadline."""
        assert self.pid is not None
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:  # a warm rank that has ended and been reaped: its supervisor says how
            self.pidfd = -1
        self.sup_fd = self.supervisor.sock.fileno() if self.supervisor else None
        for fd in self.streams:
            self.poller.register(fd, select.POLLIN)
        for event_fd in (self.pidfd, self.sup_fd):
            if event_fd is not None and event_fd >= 0:
                self.poller.register(event_fd, select.POLLIN)
                self.events_only.register(event_fd, select.POLLIN)
        streams, take = self.streams, self.take  # this loop runs once per read of the rank's output: kept lean
        while streams or self.status is None:
            if self.killed and self.status is not None:
                self.give_up_output()
                return
            events = self.poller.poll(None if self.kill_deadline is None else self.poll_timeout())
            if self.kill_deadline is not None:
                self.kill_when_due()
            short_read = False
            for fd, _ in events:
                if fd in streams:
                    try:
                        data = os.read(fd, READ_SIZE)
                    except BlockingIOError:  # drained already (see drain)
                        continue
                    short_read = short_read or 0 < len(data) < PIPE_BUF
                    take(fd, data)
                elif fd == self.pidfd:
                    self.rank_ended()
                elif fd == self.sup_fd:
                    self.supervisor_spoke()
            # A rank that writes a line at a time (python -u, progress bars) would wake the
            # wrapper for every line, costing both a syscall and a context switch per line:
            # after a short read, let its output gather for a moment. The first line after
            # a quiet spell still goes out at once; a burst waits at most GATHER; the rank's
            # exit is reported without delay.
            if short_read and self.gather and self.status is None:
                self.events_only.poll(self.gather * 1000)

    # -- the watch's events -----------------------------------------------------
    def poll_timeout(self) -> float:
        """Milliseconds until the kill deadline (there is one)."""
        assert self.kill_deadline is not None
        return max(0, (self.kill_deadline - time.monotonic()) * 1000)

    def kill_when_due(self) -> None:
        if self.kill_deadline is not None and time.monotonic() >= self.kill_deadline:
            self.signal_group(signal.SIGKILL)
            self.killed, self.kill_deadline = True, None

    def take(self, fd: int, data: bytes) -> None:
        """Pass `data` read from `fd` on, prefixed; b"": the stream ended (its last partial line goes too)."""
        stream = self.streams[fd]
        if not data:
            stream.output.write(stream.prefixer.flush())
            self.poller.unregister(fd)
            os.close(fd)
            del self.streams[fd]
            return
        mark = self.output_mark
        if mark is not None and (not self.not_progress or self.is_progress(stream, data)):  # before feed: its pending
            mark.touch()
        stream.output.write(stream.prefixer.feed(data))
        if stream.is_stderr:
            self.took_stderr(data)

    def is_progress(self, stream: Stream, data: bytes) -> bool:
        """Under a layer that declares output not progress: whether this read shows progress. It does when
        it ends a line of the rank's own; not when its first line holds a declared text, nor when the same
        stream brings it right after such a read (the rest of that message). A read that ends no line waits
        for the one that does: horovod writes a log line's header a piece at a time (std::cerr)."""
        head = stream.prefixer.pending + data
        ends = [i for i in (head.find(b"\n"), head.find(b"\r")) if i >= 0]
        if not ends:
            return False
        now = time.monotonic()
        if any(text in head[:min(ends)] for text in self.not_progress):
            stream.quiet_until = now + NOT_PROGRESS_BURST
            return False
        return now >= stream.quiet_until

    def took_stderr(self, data: bytes) -> None:
        """Keep the tail for the report; tell the supervisor of a whole traceback while the rank runs on."""
        self.tail = (self.tail + data)[-rank_protocol.TAIL_BYTES:]
        if b"Traceback" in data:  # a new one (a handled one may come first): told once whole
            self.traceback_started, self.told_traceback = True, False
        if self.traceback_started and not self.told_traceback and rank_protocol.ends_traceback(self.tail):
            self.tell_traceback()  # its exception line may have come in a later read

    def drain(self, fd: int) -> None:
        """Take everything in the pipe now, without waiting for more."""
        os.set_blocking(fd, False)
        try:
            while fd in self.streams:
                self.take(fd, os.read(fd, READ_SIZE))
        except BlockingIOError:
            pass

    def rank_ended(self, status: int | None = None) -> None:
        """The rank's process ended: take what it wrote, and report at once. A warm rank is not this
        process's child: `status` comes from its supervisor, which reaped it (its pidfd only wakes us)."""
        assert self.pid is not None
        if self.pidfd >= 0:
            self.poller.unregister(self.pidfd)
            self.events_only.unregister(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1
        if self.warm and status is None:
            if self.supervisor is not None:
                return  # its status is on its way
            status = signal.SIGKILL  # no supervisor left to say: it is not reported anyway
        if self.status is not None:
            return
        self.status = os.waitpid(self.pid, 0)[1] if status is None else status
        self.ended_at = time.time()  # wall clock: failures on different nodes are ordered by it
        for fd in list(self.streams):  # what the rank wrote before it ended, for its report
            self.drain(fd)
        # Report now: a process the rank left behind may hold its output open for long,
        # and the job must not wait for that to learn how the rank ended.
        self.report()
        if self.asked_to_stop or self.streams:  # what it left behind in its group: asked now
            self.signal_group(signal.SIGTERM)
            self.signal_group(signal.SIGCONT)
        if self.streams and self.kill_deadline is None and not self.killed:  # something still holds its output
            self.kill_deadline = time.monotonic() + min(self.grace, rank_protocol.LEFTOVER_WAIT)

    def give_up_output(self) -> None:
        """The rank's group is dead, yet its output is still open: a process that left the group
        (setsid) holds it. Take what is in the pipes and stop waiting for that process; the
        supervisor stops it with the rest of the job."""
        for fd in list(self.streams):
            self.drain(fd)
            if fd in self.streams:
                self.take(fd, b"")

    def supervisor_spoke(self) -> None:
        """The supervisor's one message (release), or its socket closing: then the rank must stop."""
        assert self.supervisor is not None and self.sup_fd is not None
        try:
            data = self.supervisor.sock.recv(4096)
        except OSError:  # reset: the supervisor died with our messages unread
            data = b""
        self.supervisor.buffer += data
        while b"\n" in self.supervisor.buffer:
            line, self.supervisor.buffer = self.supervisor.buffer.split(b"\n", 1)
            message = rank_protocol.decode(line) if line.strip() else {}
            if message.get("t") == rank_protocol.REAPED:  # a warm rank's end (see rank_ended)
                code = int(message.get("code") or 0)
                self.rank_ended(int(message["signal"]) if message.get("signal") else (code & 0xFF) << 8)
            else:
                self.released = True  # rank_protocol.RELEASE
        if not data:
            self.poller.unregister(self.sup_fd)
            self.events_only.unregister(self.sup_fd)
            self.supervisor.sock.close()
            self.supervisor, self.sup_fd = None, None
            self.stop_rank()
