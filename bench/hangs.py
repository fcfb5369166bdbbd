"""Hangs: how fast detlaunch finds one, what `detlaunch stacks` costs, and what bare torchrun does.

    python bench/hangs.py [--reps 3] [--ranks 2 16 64] [--cap 120] [--skip-bare]

- detection: a torchrun job (2 ranks, gloo) whose rank 1 sleeps before a collective rank 0 is in,
  under `--hang-timeout 10`: from the last output line (the bench timestamps every line it reads)
  to detlaunch's "no rank has shown progress" line, and to the hang report (goal: <= 10 s + 1 s);
- `detlaunch stacks JOB` wall time for N sleeping ranks on one node, and 2x2 on two loopback nodes
  (goal: <= 1 s at 16 ranks);
- teardown after a rank's failure with the default `--dump-budget` and with 0 (3 ranks, the other
  two asleep), for each layer of `--teardown-layers`: from the trigger to detlaunch's last line;
- the same hang under bare torchrun, horovodrun and deepspeed (`--bare`): the time until anything
  happens, capped (`> cap`).

Standalone (not part of `python -m bench`): every process it starts runs in a session of its own
and is killed by process group at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from detlaunch.testing import free_port

ROOT = Path(__file__).resolve().parent.parent
HANG = str(ROOT / "tests" / "support" / "scripts" / "hang.py")
HVD_HANG = str(ROOT / "bench" / "scripts" / "hvd_hang.py")
RANKS = str(ROOT / "tests" / "support" / "scripts" / "ranks.py")
PY = sys.executable


class Job:
    """One process (detlaunch or torchrun) in its own session; every line it writes, timestamped."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append((time.monotonic(), raw.decode(errors="replace").rstrip("\n")))

    def when(self, text: str) -> float | None:
        return next((t for t, line in self.lines if text in line), None)

    def wait_for(self, text: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while (t := self.when(text)) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"never saw {text!r}: {self.lines[-5:]}")
            time.sleep(0.02)
        return t

    def wait(self, timeout: float) -> int | None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        self.stop()
        return code

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.reader.join(5)


def detlaunch(*args: str, layer: str = "torchrun") -> list[str]:
    return [PY, "-m", "detlaunch", "--layer", layer, "--master-port", str(free_port()), *args]


def spread(samples: list[float]) -> str:
    return f"median {statistics.median(samples):.2f} s (min {min(samples):.2f}, max {max(samples):.2f})"


def bench_detection(env: dict[str, str], reps: int) -> None:
    detect, report = [], []
    for _ in range(reps):
        job = Job(detlaunch("--nproc-per-node", "2", "--hang-timeout", "10", HANG), {**env, "HANG": "sleep"})
        code = job.wait(120)
        ranks = [t for t, line in job.lines if line.startswith("[rank=")]
        found, failed = job.when("no rank has shown progress"), job.when("detlaunch: job failed: the job hung")
        if code != 124 or not ranks or found is None or failed is None:
            print(f"  detection: unexpected end (exit {code}): {job.lines[-5:]}")
            continue
        detect.append(found - ranks[-1])
        report.append(failed - ranks[-1])
    if detect:
        print(f"  last output -> hang found (--hang-timeout 10): {spread(detect)}")
        print(f"  last output -> hang report printed, job stopped:  {spread(report)}")


def stack_shapes(counts: list[int]) -> list[tuple[str, list[list[str]], int]]:
    """(name, the detlaunch of each node, ranks) for each shape, with fresh ports."""
    shapes: list[tuple[str, list[list[str]], int]] = [
        (f"{n} ranks, 1 node", [detlaunch("--nproc-per-node", str(n), RANKS)], n) for n in counts]
    port = str(free_port())
    two = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    shapes.append(("2x2 ranks, 2 nodes", [
        [PY, "-m", "detlaunch", "--layer", "torchrun", *two, "--master-port", port, "--node-rank", str(n),
         "--node-addr", f"127.0.0.{n + 1}", RANKS] for n in (0, 1)], 4))
    return shapes


def start_sleepers(argvs: list[list[str]], ranks: int, env: dict[str, str], job_id: str) -> list[Job]:
    jobs = [Job([*argv[:3], "--job-id", job_id, *argv[3:]], {**env, "SLEEP": "600"}) for argv in argvs]
    try:
        for rank in range(ranks):
            jobs[rank * len(jobs) // ranks].wait_for(f"[rank={rank}] rank {rank} sleeping", 300)
    except RuntimeError:
        for job in jobs:
            job.stop()
        raise
    return jobs


def bench_stacks(env: dict[str, str], counts: list[int], reps: int) -> None:
    for i in range(len(counts) + 1):
        for attempt in range(3):  # a port another job took between our check and torchrun's bind: again
            name, argvs, ranks = stack_shapes(counts)[i]
            job_id = f"bench-{uuid.uuid4().hex[:8]}"
            try:
                jobs = start_sleepers(argvs, ranks, env, job_id)
                break
            except RuntimeError as e:
                print(f"  {name}: did not start ({str(e)[-200:]}); attempt {attempt + 2} of 3")
        else:
            continue
        try:
            samples = []
            for _ in range(reps):
                start = time.monotonic()
                r = subprocess.run([PY, "-m", "detlaunch", "stacks", job_id], env=env, capture_output=True,
                                   text=True, timeout=60)
                samples.append(time.monotonic() - start)
                if r.returncode != 0 or "time.sleep" not in r.stdout:
                    print(f"  {name}: unexpected answer: {r.stdout} {r.stderr}")
            print(f"  detlaunch stacks, {name}: {spread(samples)}")
        finally:
            for job in jobs:
                job.stop()


def bench_teardown(env: dict[str, str], reps: int, layers: list[str]) -> None:
    samples: dict[tuple[str, str], list[float]] = {(layer, budget): [] for layer in layers for budget in ("1.5", "0")}
    for _ in range(reps):  # interleaved: the machine's load changes alike for every case
        for layer, budget in samples:
            with tempfile.TemporaryDirectory(prefix="hangs-") as tmp:
                took = teardown_once(env, layer, budget, Path(tmp) / "trigger")
            if took is not None:
                samples[(layer, budget)].append(took)
    for (layer, budget), got in samples.items():
        if got:
            print(f"  teardown after a rank's failure, {layer}, --dump-budget {budget}: {spread(got)} "
                  f"({len(got)} runs; trigger -> detlaunch's last line)")


def teardown_once(env: dict[str, str], layer: str, budget: str, fifo: Path) -> float | None:
    """Seconds from the trigger (rank 1 exits 3) to detlaunch's last line; None when it went otherwise."""
    os.mkfifo(fifo)
    job = Job(detlaunch("--nproc-per-node", "3", "--dump-budget", budget, RANKS, layer=layer),
              {**env, "FAIL_RANK": "1", "SLEEP": "300", "TRIGGER": str(fifo), "DS_ACCELERATOR": "cpu"})
    try:
        for line in ("[rank=0] rank 0 sleeping", "[rank=2] rank 2 sleeping", "[rank=1] rank 1 waiting"):
            job.wait_for(line, 120)
    except RuntimeError as e:
        print(f"  teardown, {layer}: did not start: {e}")
        job.stop()
        return None
    fifo.write_bytes(b"x")
    start = time.monotonic()
    code = job.wait(120)
    if code != 3:
        print(f"  teardown, {layer}: unexpected end (exit {code}): {job.lines[-5:]}")
        return None
    return job.lines[-1][0] - start


def bare_argv(launcher: str) -> tuple[list[str], dict[str, str]]:
    """The bare launcher's command for the same hang (2 ranks, rank 1 asleep before a collective)."""
    bindir = Path(PY).parent
    if launcher == "torchrun":
        return [PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
                HANG], {"HANG": "sleep"}
    if launcher == "horovodrun":
        return [str(bindir / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PY, HVD_HANG], {}
    return [str(bindir / "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()), HANG], {
        "HANG": "sleep", "DS_ACCELERATOR": "cpu"}


def bench_bare(env: dict[str, str], cap: float, launchers: list[str]) -> None:
    for launcher in launchers:
        argv, extra = bare_argv(launcher)
        job = Job(argv, {**env, **extra})
        start = time.monotonic()
        code = job.wait(cap)
        steps = [t for t, line in job.lines if "step 9" in line]
        hung_at = max(steps) if steps else start
        tail = job.lines[-1][1][-100:] if job.lines else ""
        took = "> cap" if code is None else f"exit {code} {time.monotonic() - hung_at:.1f} s after the hang"
        print(f"  bare {launcher}, the same hang: {took} (cap {cap:g} s after start; the hang began "
              f"{hung_at - start:.1f} s after start; {len(job.lines)} lines, the last {tail!r})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 16, 64])
    p.add_argument("--cap", type=float, default=120.0)
    p.add_argument("--skip-bare", action="store_true")
    p.add_argument("--bare", nargs="+", default=["torchrun", "horovodrun", "deepspeed"])
    p.add_argument("--teardown-layers", nargs="+", default=["torchrun", "horovod", "deepspeed"])
    p.add_argument("--skip-stacks", action="store_true")
    p.add_argument("--skip-detection", action="store_true")
    p.add_argument("--skip-teardown", action="store_true")
    args = p.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    print("hangs:")
    if not args.skip_detection:
        bench_detection(env, args.reps)
    if not args.skip_stacks:
        bench_stacks(env, args.ranks, args.reps)
    if not args.skip_teardown:
        bench_teardown(env, args.reps, args.teardown_layers)
    if not args.skip_bare:
        bench_bare(env, args.cap, args.bare)


if __name__ == "__main__":
    main()
