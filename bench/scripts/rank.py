"""One rank of a benchmark job; it never imports torch (fast to start, small).

    rank.py trivial            print one line, exit 0
    rank.py fail DIR N         wait until all N ranks started; the last rank then writes the
                               CLOCK_MONOTONIC time to DIR/exit-time and exits 3 at that moment;
                               the others sleep (outside any collective) until they are stopped
    rank.py barrier DIR N      write DIR/started-R (its start time); wait for DIR/go; write
                               DIR/exit-R (the time it exits) and exit 0
    rank.py probe DIR LINES    print LINES lines, wait until every byte was read from stdout, then
                               write the VmHWM (peak RSS) of every ancestor process to DIR/hwm-R (JSON)

The rank number comes from RANK, OMPI_COMM_WORLD_RANK, HOROVOD_RANK or PMI_RANK.
"""

import fcntl
import json
import os
import sys
import termios
import time

RANK = int(next((os.environ[v] for v in ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK")
                 if os.environ.get(v, "").isdigit()), "0"))


def now():
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def wait_for(predicate, timeout=120.0, every=0.005):
    deadline = now() + timeout
    while not predicate():
        if now() > deadline:
            sys.exit(f"rank {RANK}: gave up waiting")
        time.sleep(every)


def write_file(path, text):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def started_count(directory):
    return sum(name.startswith("started-") and not name.endswith(".tmp") for name in os.listdir(directory))


def fail(directory, count):
    write_file(os.path.join(directory, f"started-{RANK}"), repr(now()))
    print(f"rank {RANK} started", flush=True)
    if RANK != count - 1:
        time.sleep(600)
        return 0
    wait_for(lambda: started_count(directory) >= count)
    print(f"rank {RANK} failing", file=sys.stderr, flush=True)
    write_file(os.path.join(directory, "exit-time"), repr(now()))
    return 3


def barrier(directory):
    write_file(os.path.join(directory, f"started-{RANK}"), repr(now()))
    wait_for(lambda: os.path.exists(os.path.join(directory, "go")), every=0.01)
    write_file(os.path.join(directory, f"exit-{RANK}"), repr(now()))
    return 0


def ancestors():
    """(pid, command line, VmHWM kB) of every process above this one."""
    found = []
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            break
        hwm = int(status.get("VmHWM", "0 kB").split()[0])
        found.append({"pid": pid, "cmdline": cmdline, "vmhwm_kb": hwm})
        pid = int(status["PPid"])
    return found


def unread(fd):
    """Bytes written to the pipe `fd` but not read yet (0 when fd is not a pipe)."""
    buf = bytearray(4)
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf)
    except OSError:
        return 0
    return int.from_bytes(buf, sys.byteorder)


def probe(directory, lines):
    pad = "y" * 89
    for i in range(lines):
        sys.stdout.write(f"{i:09d} {pad}\n")
    sys.stdout.flush()
    # Every byte we wrote has been read by the process above us (FIONREAD works on a pipe's write end).
    wait_for(lambda: unread(1) == 0, every=0.002)
    time.sleep(0.05)  # and processed: prefixed and written on
    write_file(os.path.join(directory, f"hwm-{RANK}"), json.dumps(ancestors()))
    return 0


def main():
    sys.argv = [a for a in sys.argv if not a.startswith("--local_rank")]  # deepspeed adds it
    mode = sys.argv[1]
    if mode == "trivial":
        print(f"hello from rank {RANK}")
        return 0
    if mode == "fail":
        return fail(sys.argv[2], int(sys.argv[3]))
    if mode == "barrier":
        return barrier(sys.argv[2])
    if mode == "probe":
        return probe(sys.argv[2], int(sys.argv[3]))
    sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main())
