"""Watching a job: `detlaunch status` wall time, the supervisor's idle CPU, and --dedupe's console cost.

    python -m bench.status [--ranks 2 16 64] [--reps 5] [--lines 200000]

1. `detlaunch status JOB` from start to exit (a new Python each time, as a user runs it), while a job
   of N sleeping ranks (tests/support/scripts/ranks.py: no torch import) runs. Goal: <= 0.3 s at 16 ranks.
2. The node supervisor's CPU (utime+stime of the PID namespace's init, from /proc) over 20 s while a
   16-rank job sleeps, with its CPU/RSS sampling on (every 2 s). Goal: < 1% of one core.
3. A 4-rank job printing --lines lines per rank (unbuffered, one write per line) to a console pipe
   drained by `cat`, with --dedupe and --no-dedupe, interleaved; lines the ranks print alike (folded)
   and lines each rank prints its own (nothing to fold). Whole-job time (start-up included: on a
   shared 2-core machine an empty job's time varies more than a difference would show).
   Goal: dedupe >= 0.8x of no dedupe. Ranks printing this fast are over dedupe.PASS_THROUGH_RATE,
   so after their first second this measures the pass-through; hence also:
4. The folding path itself, in this process: microseconds a line `dedupe.ConsoleFolder` takes with
   the pass-through off, for 4 ranks' reads as the wrappers write them (runs of ~4 KiB of one rank).

Part of `python -m bench` (`--only status`; `--quick`: 2 and 16 ranks, 50k lines, 10 s idle) and
standalone. It runs detlaunch as `python -m detlaunch` with this process's environment, so a
worktree's PYTHONPATH is what is measured.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from .common import Goal, Panel, Section, Stat, Table, free_port, say

ROOT = Path(__file__).resolve().parent.parent
RANKS = str(ROOT / "tests" / "support" / "scripts" / "ranks.py")
DETLAUNCH = [sys.executable, "-m", "detlaunch"]


def start_job(ranks: int, env: dict[str, str], out: Path) -> tuple[subprocess.Popen[bytes], str]:
    job = f"bench-{uuid.uuid4().hex[:8]}"
    with open(out, "wb") as f:
        proc = subprocess.Popen([*DETLAUNCH, "--layer", "torchrun", "--nproc-per-node", str(ranks), "--master-port",
                                 str(free_port()), "--job-id", job, RANKS], env={**env, "SLEEP": "600"},
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while out.read_bytes().count(b" sleeping\n") < ranks:  # the bench's own wait, not product code
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the {ranks}-rank job did not start:\n{out.read_text()[-2000:]}")
        time.sleep(0.2)
    return proc, job


def stop_job(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def status_wall(ranks: int, reps: int, env: dict[str, str], tmp: Path) -> list[float]:
    proc, job = start_job(ranks, env, tmp / f"status-{ranks}.out")
    try:
        times = []
        for _ in range(reps):
            t0 = time.monotonic()
            done = subprocess.run([*DETLAUNCH, "status", job], env=env, capture_output=True, text=True, timeout=60)
            times.append(time.monotonic() - t0)
            rows = [line for line in done.stdout.splitlines()[2:] if line.split()[4:5] == ["running"]]
            assert done.returncode == 0 and len(rows) == ranks, done.stdout + done.stderr
        return times
    finally:
        stop_job(proc)


def supervisor_cpu(ranks: int, seconds: float, env: dict[str, str], tmp: Path) -> float:
    proc, _ = start_job(ranks, env, tmp / "idle.out")
    try:
        supervisor = top = psutil.Process(proc.pid)  # the supervisor: pid 1 of the job's PID namespace, under
        while True:  # the child that made the namespace: the last of the chain of detlaunch processes
            same = [c for c in supervisor.children() if c.cmdline() == top.cmdline()]
            if not same:
                break
            supervisor = same[0]
        time.sleep(5)  # past start-up: the first samples are taken
        c0, t0 = supervisor.cpu_times(), time.monotonic()
        time.sleep(seconds)
        c1, t1 = supervisor.cpu_times(), time.monotonic()
        return 100.0 * ((c1.user + c1.system) - (c0.user + c0.system)) / (t1 - t0)
    finally:
        stop_job(proc)


def console_job(dedupe: bool, lines: int, same: bool, env: dict[str, str]) -> float:
    flag = "--dedupe" if dedupe else "--no-dedupe"
    knob = {"SAME": str(lines)} if same else {"LINES": str(lines)}
    argv = [*DETLAUNCH, "--layer", "torchrun", "--nproc-per-node", "4", "--master-port", str(free_port()), flag, RANKS]
    t0 = time.monotonic()
    job = subprocess.Popen(argv, env={**env, **knob}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    cat = subprocess.run(["cat"], stdin=job.stdout, stdout=subprocess.DEVNULL, check=True)
    assert job.wait(600) == 0 and cat.returncode == 0
    return time.monotonic() - t0


def folding_cost(same: bool, lines: int = 20_000, ranks: int = 4) -> float:
    """Microseconds a line to fold 64 KiB reads of `ranks` ranks' lines (each rank's in ~4 KiB runs)."""
    from detlaunch.observe.dedupe import ConsoleFolder

    runs: list[bytes] = []
    for i in range(0, lines, 100):  # ~100 lines (~4 KiB) of one rank, then the next rank's
        for r in range(ranks):
            runs.append(b"".join(f"[rank={r}] warning: the same on every rank, {j}\n".encode() if same else
                                 f"[rank={r}] line {j} of rank {r}\n".encode() for j in range(i, min(i + 100, lines))))
    stream = b"".join(runs)
    reads = [stream[i:i + (1 << 16)] for i in range(0, len(stream), 1 << 16)]
    best = float("inf")
    for _ in range(3):
        folder, now = ConsoleFolder(ranks, rate=float("inf")), 0.0
        t0 = time.perf_counter()
        for data in reads:
            now += 0.01
            folder.feed(data, now)
            folder.flush(now)
        folder.close(now)
        best = min(best, time.perf_counter() - t0)
    return 1e6 * best / (lines * ranks)


def console_pair(lines: int, same: bool, reps: int, env: dict[str, str]) -> dict[bool, list[float]]:
    """{dedupe: whole-job times}, the two interleaved (the order swapped every repetition)."""
    t: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(reps):  # interleaved: the load of a shared machine falls on both alike
        for d in ((False, True) if rep % 2 == 0 else (True, False)):
            t[d].append(console_job(d, lines, same, env))
    return t


def measure(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    """`python -m bench --only status`: the three numbers of issue 14 and the folding path's cost."""
    ranks, lines, idle = ([2, 16], 50_000, 10.0) if quick else ([2, 16, 64], 200_000, 20.0)
    rows, goals, panels = [], [], []
    wall: dict[int, Stat] = {}
    for n in ranks:
        say(f"status: detlaunch status at {n} ranks")
        wall[n] = Stat(status_wall(n, reps, env, tmp))
        rows.append([f"`detlaunch status`, {n} ranks", wall[n].fmt(digits=3)])
    goals.append(Goal("`detlaunch status` wall time, 16 ranks", "<= 0.3 s", f"{wall[16].median:.3f} s",
                      wall[16].median <= 0.3))
    panels.append(Panel("detlaunch status wall time (lower is better)", "seconds", [f"{n} ranks" for n in wall],
                        list(wall.values()), goal=0.3))
    say("status: supervisor CPU with 16 sleeping ranks")
    cpu = supervisor_cpu(16, idle, env, tmp)
    rows.append([f"supervisor CPU, 16 sleeping ranks, sampling on ({idle:g} s)", f"{cpu:.2f} % of one core"])
    goals.append(Goal("supervisor CPU, 16 idle ranks, sampling on", "< 1 % of one core", f"{cpu:.2f} %", cpu < 1.0))
    for same in (True, False):
        kind = "the same lines" if same else "own lines"
        say(f"status: console, 4 ranks x {lines} {kind}, --dedupe vs --no-dedupe")
        t = console_pair(lines, same, max(2, min(reps, 3)), env)
        off, on = Stat(t[False]), Stat(t[True])
        ratio = off.median / on.median
        rows.append([f"console, 4 ranks x {lines} {kind}: --no-dedupe / --dedupe", f"{off.fmt()} / {on.fmt()}: "
                     f"{ratio:.2f}x"])
        goals.append(Goal(f"--dedupe throughput, {kind}", ">= 0.8x of --no-dedupe", f"{ratio:.2f}x", ratio >= 0.8))
    for same in (True, False):
        kind = "the same lines" if same else "own lines"
        rows.append([f"folding path (pass-through off), 4 ranks, {kind}", f"{folding_cost(same):.2f} us a line"])
    notes = ["status: `python -m detlaunch status JOB`, a new Python each time; console: whole job, start-up "
             "included, the two cases interleaved; ranks this fast are over dedupe.PASS_THROUGH_RATE, so after "
             "their first second the console passes their output through; the folding path is measured alone "
             "(best of 3, in the bench's process)"]
    table = Table("Watching a job: status, idle CPU, --dedupe's cost", ["measurement", "result"], rows, notes)
    return Section("status", [table], panels, goals)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.status", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 16, 64])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--lines", type=int, default=200_000, help="lines per rank in the console measurement")
    p.add_argument("--idle", type=float, default=20.0, help="seconds of the idle CPU measurement")
    p.add_argument("--skip", nargs="*", default=[], choices=("status", "idle", "console", "folding"))
    args = p.parse_args(argv)
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env["TMPDIR"] = tmp_name
        if "status" not in args.skip:
            for n in args.ranks:
                times = status_wall(n, args.reps, env, tmp)
                print(f"status wall time, {n:>3} ranks: median {statistics.median(times):.3f} s "
                      f"(min {min(times):.3f}, max {max(times):.3f}, {len(times)} runs)", flush=True)
        if "idle" not in args.skip:
            cpu = supervisor_cpu(16, args.idle, env, tmp)
            print(f"supervisor CPU, 16 sleeping ranks, sampling on: {cpu:.2f}% of one core over {args.idle:g} s",
                  flush=True)
        if "console" not in args.skip:
            for same in (True, False):
                t = console_pair(args.lines, same, args.reps, env)
                med = {d: statistics.median(v) for d, v in t.items()}
                kind = "the same lines (folded)" if same else "own lines (nothing folds)"
                print(f"console, 4 ranks x {args.lines} {kind}, whole job: no dedupe {med[False]:.2f} s "
                      f"({4 * args.lines / med[False]:,.0f} lines/s), dedupe {med[True]:.2f} s "
                      f"({4 * args.lines / med[True]:,.0f} lines/s): {med[False] / med[True]:.2f}x "
                      f"[runs: {', '.join(f'{x:.1f}' for x in t[False])} / {', '.join(f'{x:.1f}' for x in t[True])}]",
                      flush=True)
        if "folding" not in args.skip:
            for same in (True, False):
                kind = "the same lines" if same else "own lines"
                print(f"folding path (pass-through off), 4 ranks, {kind}: {folding_cost(same):.2f} us a line "
                      "(best of 3)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
