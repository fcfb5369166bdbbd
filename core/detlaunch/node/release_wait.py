"""Between two attempts: every thread of the last attempt's processes gone, and their GPU memory freed.

A rank SIGKILLed while one of its threads is stuck in the GPU driver is a zombie leader whose other
tasks still run and hold device memory: the sweep (shutdown.py) counts it as exited, and the driver
may free a process's memory a while after its last task has ended. Started at once, the next attempt
would meet CUDA out-of-memory, or "device busy" under EXCLUSIVE_PROCESS compute mode, and spend a
restart on it. So the attempt driver starts this wait with the backoff, and the next attempt starts
once both are over:

- every process still below the supervisor (but a standby launcher) is SIGKILLed (nothing for one
  that is dying already) and waited for through a pidfd, readable once its whole thread group has
  ended: the kernel's own event, nothing polls. A zombie with no other task is only reaped;
- then, where nvidia-smi is on the job's PATH, its compute apps are asked for until none is a process
  of the last attempt: its ranks (each one's pids in every namespace, read when it started:
  procs.nspids) and the processes waited for above. Nothing tells when the driver frees memory, so
  this is polled: 0.25 s apart at first, 1.5 times longer each time, at most 2 s.

One line says what it waits for; past --release-timeout (the whole wait) one more, and the attempt
starts anyway, to succeed or fail on its own.
"""

from __future__ import annotations

import functools
import os
import select
import signal
from collections.abc import Callable, Collection, Iterable, Mapping

from detlaunch.errors import LaunchError
from detlaunch.system import gpu_memory, isolation, procs
from detlaunch.system.eventloop import EventLoop, Priority, Timer, cancel_timer

FIRST_POLL, POLL_FACTOR, POLL_MAX = 0.25, 1.5, 2.0  # seconds between nvidia-smi's answers
OUTPUT_MAX = 1 << 20  # what is kept of one answer


def pid_list(pids: Iterable[int]) -> str:
    return ", ".join(str(p) for p in sorted(pids))


def has_ended(pidfd: int) -> bool:
    """Whether the whole thread group of the process behind `pidfd` has ended (it may wait to be reaped)."""
    return bool(select.select([pidfd], [], [], 0)[0])


class ReleaseWait:
    """The wait before an attempt: `begin` it when the last one is over; `then` runs once it is done."""

    def __init__(self, loop: EventLoop, *, timeout: float, env: Mapping[str, str], say: Callable[[str], None],
                 trace: Callable[[str], None], reap: Callable[[], None]) -> None:
        self.loop, self.timeout, self.env = loop, timeout, env
        self.say, self.trace, self.reap = say, trace, reap
        self.nvidia_smi = gpu_memory.find_nvidia_smi(env) if timeout > 0 else None
        self.ours: set[int] = set()  # the last attempt's processes, by their pids in every namespace
        self.done = True
        self.then: Callable[[], None] | None = None
        self.attempt = 0
        self.deadline = 0.0
        self.waiting: dict[int, int] = {}  # a pidfd of each process waited for: the pid it is shown by
        self.held: list[int] = []  # what nvidia-smi's last answer showed holding memory, of ours
        self.bound: Timer | None = None
        self.next_query: Timer | None = None
        self.interval = FIRST_POLL
        self.query_pid: int | None = None  # nvidia-smi, while it answers
        self.query_fd: int | None = None
        self.output = b""

    def remember(self, pid: int) -> None:
        """A rank of this attempt started (`pid`, this namespace's): keep its pids in every namespace, while
        it can still be asked. Only where nvidia-smi may be asked about them."""
        if self.nvidia_smi is None or not pid:
            return
        self.ours.add(pid)
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            self.ours.update(procs.nspids(fd, isolation.outer_proc()))
        finally:
            os.close(fd)

    def begin(self, attempt: int, old: Collection[int]) -> None:
        """The last attempt is over (`old`: what is left of it, this namespace's pids): wait before `attempt`."""
        self._stop()
        if self.timeout <= 0:
            return
        self.attempt, self.done, self.held, self.interval = attempt, False, [], FIRST_POLL
        self.deadline = self.loop.clock() + self.timeout
        outer = isolation.outer_proc()
        for pid in old:
            procs.signal_pid(pid, signal.SIGKILL)
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # reaped already
            pids = procs.nspids(fd, outer)
            self.ours.update((pid, *pids))
            if has_ended(fd):  # a zombie: only to be reaped
                os.close(fd)
                continue
            self.waiting[fd] = pids[0] if pids else pid
            self.loop.add_reader(fd, Priority.PROBE, functools.partial(self._ended, fd))
        self.bound = self.loop.call_at(self.deadline, self._timed_out)
        if self.waiting:
            self.say(f"waiting for every thread of the last attempt's process(es) {pid_list(self.waiting.values())} "
                     f"to end (up to {self.timeout:g} s)")
        else:
            self._tasks_gone()

    def then_run(self, callback: Callable[[], None]) -> None:
        """Run `callback` once the wait is over (at once if it is)."""
        if self.done:
            callback()
        else:
            self.then = callback

    def cancel(self) -> None:
        """No attempt follows (a signal during the backoff, the job's end): stop waiting, start nothing."""
        self._stop()
        self.then = None
        self.done = True

    # -- the steps ----------------------------------------------------------------------------------
    def _ended(self, fd: int) -> None:
        self.loop.remove(fd)
        os.close(fd)
        del self.waiting[fd]
        if not self.waiting:
            self._tasks_gone()

    def _tasks_gone(self) -> None:
        self.reap()  # what became a zombie with its last thread (its parent may be this supervisor)
        if self.nvidia_smi is None or not self.ours:
            self._finish()
        else:
            self._query()

    def _query(self) -> None:
        self.next_query = None
        assert self.nvidia_smi is not None
        out_r, out_w = os.pipe()
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            self.query_pid = procs.spawn((self.nvidia_smi, *gpu_memory.QUERY), self.env, output_fd=out_w,
                                         error_fd=null)
        except LaunchError as e:
            os.close(out_r)
            self.trace(f"{e}: not waiting for GPU memory")
            self._finish()
            return
        finally:
            os.close(out_w)
            os.close(null)
        os.set_blocking(out_r, False)
        self.query_fd, self.output = out_r, b""
        self.loop.add_reader(out_r, Priority.PROBE, self._read)

    def _read(self) -> None:
        assert self.query_fd is not None
        try:
            data = os.read(self.query_fd, 65536)
        except BlockingIOError:
            return
        if data:
            self.output = (self.output + data)[:OUTPUT_MAX]
            return
        self._end_query(kill=False)  # its answer is whole (its exit is reaped with the other children)
        text = self.output.decode(errors="replace")
        apps = gpu_memory.parse_compute_apps(text)
        if apps is None:
            self.trace(f"nvidia-smi: {text.strip().splitlines()[0][:200]}: not waiting for GPU memory")
            self._finish()
            return
        first = not self.held
        self.held = gpu_memory.holding(apps, self.ours)
        if not self.held:
            self._finish()
            return
        if first:  # the bound is the whole wait's, from its start
            self.say(f"waiting for GPU memory of the last attempt's pids {pid_list(self.held)} to be freed "
                     f"(up to {self.timeout:g} s)")
        self.next_query = self.loop.call_later(self.interval, self._query)
        self.interval = min(self.interval * POLL_FACTOR, POLL_MAX)

    def _timed_out(self) -> None:
        self.bound = None
        after = f"after {self.timeout:g} s (--release-timeout): attempt {self.attempt} starts anyway"
        if self.waiting:
            self.say(f"the last attempt's process(es) {pid_list(self.waiting.values())} still run {after}")
        elif self.held:
            self.say(f"GPU memory of the last attempt's pids {pid_list(self.held)} is still not freed {after}")
        elif self.query_pid is not None:
            self.say(f"nvidia-smi did not answer {after}")
        self._finish()

    def _finish(self) -> None:
        self._stop()
        self.ours.clear()  # the next attempt's ranks are remembered anew
        self.done = True
        then, self.then = self.then, None
        if then is not None:
            then()

    def _end_query(self, kill: bool) -> None:
        if self.query_fd is not None:
            self.loop.remove(self.query_fd)
            os.close(self.query_fd)
            self.query_fd = None
        if kill and self.query_pid is not None:
            procs.signal_pid(self.query_pid, signal.SIGKILL)  # hung (a wedged GPU): reaped with the other children
        self.query_pid = None

    def _stop(self) -> None:
        """Let go of everything the wait holds: pidfds, timers, a running nvidia-smi."""
        for fd in self.waiting:
            self.loop.remove(fd)
            os.close(fd)
        self.waiting.clear()
        cancel_timer(self.bound)
        cancel_timer(self.next_query)
        self.bound = self.next_query = None
        self._end_query(kill=True)
