"""7. Restarts: from a rank's failure to every rank of the next attempt running; and the restart count.

A rank of bench/scripts/restart_rank.py SIGKILLs itself on the first attempt; the figure is the time
from its last stamp before the kill to the moment every rank of attempt 2 has passed
init_process_group and a barrier (the job is running again), all on CLOCK_MONOTONIC. Compared:
detlaunch --layer torchrun --max-restarts 1 --max-node-restarts 0 --restart-backoff 0 (the whole job on
every node stops, then starts again) against bare torchrun --max-restarts 1 on the same script, on 1 node x 2 ranks
and 2 nodes (127.0.0.1, 127.0.0.2) x 1 rank; and, as the baseline the issue sets for 2 nodes, a fresh
2-node detlaunch start (launch to every rank running), and a 1-node first start with restarts on and off
(on, the next attempt's torchrun starts ahead while the first starts: what that costs). The direct layer
(--layer direct: the supervisor starts the ranks itself, no torchrun agent) runs as a case of its own, and so
do --layer horovod (its ranks rendezvous through horovod) and --layer deepspeed on 1 node (each has a standby
launcher as torchrun's: horovodrun past its imports and its build probe, deepspeed's runner past its imports).
Neither horovodrun nor deepspeed restarts on its own; what their ranks cost to start is shown by a fresh start
of the bare launcher on the same script (launch to every rank running): its ranks pay what detlaunch's
restart cannot take off (horovod's: `import horovod.torch`; deepspeed's: deepspeed.launcher.launch importing
deepspeed and torch before it starts any rank).

Where the time goes, from the ranks' stamps (each a max over the ranks of attempt 2): "to start" is
the failure to the last rank process starting (detlaunch's teardown and restart, plus the launcher's
own start: torchrun's agent imports torch before it starts any worker); "import torch" from there to
the last rank done importing torch.distributed; "rendezvous" the rest: init_process_group and a barrier.

Count: on 2 nodes, --max-restarts 5 and N injected failures (each a different exit code, so the
crash-loop breaker does not apply): the job must restart exactly N times, counted from the attempts
the ranks stamped, over M runs.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from .common import DETLAUNCH, PY, SCRIPTS, VENV, Goal, Panel, Section, Stat, Table, free_port, interleaved, run, say

SCRIPT = str(SCRIPTS / "restart_rank.py")
NODES = str(SCRIPTS / "nodes.py")
FAILURES, COUNT_RUNS = 3, 3


def detlaunch_job(nodes: int, *extra: str, layer: str = "torchrun") -> list[str]:
    port = str(free_port())
    if nodes == 1:
        return [DETLAUNCH, "--layer", layer, "--nproc-per-node", "2", "--master-port", port, *extra, SCRIPT]
    common = ["--layer", layer, "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
              "--master-port", port, *extra]
    return [PY, NODES, DETLAUNCH, *common, "--node-rank", "0", "--node-addr", "127.0.0.1", SCRIPT, "---",
            DETLAUNCH, *common, "--node-rank", "1", "--node-addr", "127.0.0.2", SCRIPT]


def bare_torchrun(nodes: int, standalone: bool = False, unshared: bool = False) -> list[str]:
    """torchrun --max-restarts 1. On one node: --master-port (static rendezvous) or --standalone (c10d, as
    torchrun's docs say for one node). Under torch 2.13 either one's attempt 2 mostly fails (exit 1 in gloo's
    connectFullMesh): the ranks share the agent's store, which keeps attempt 1's keys (pytorch/pytorch#135712);
    `unshared` is that issue's workaround, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (rank 0 hosts the ranks' store)."""
    port = str(free_port())
    if nodes == 1:
        where = ["--standalone"] if standalone else ["--master-port", port]
        workaround = ["env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"] if unshared else []
        return [*workaround, PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", *where, "--max-restarts", "1",
                SCRIPT]

    def agent(rank: int) -> list[str]:
        return [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
                str(rank), "--master-addr", "127.0.0.1", "--master-port", port, "--local-addr",
                f"127.0.0.{rank + 1}", "--max-restarts", "1", SCRIPT]

    return [PY, NODES, *agent(0), "---", *agent(1)]


def bare_launcher(name: str) -> list[str]:
    """horovodrun or deepspeed alone, 1 node x 2 ranks, on the same script (restart_rank.py picks horovod's
    collective under horovodrun, as under --layer horovod)."""
    if name == "horovodrun":
        return [str(VENV / "bin" / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PY, "-u", SCRIPT]
    return [str(VENV / "bin" / "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()), SCRIPT]


def stamps(out: Path, attempt: int) -> list[tuple[float, float, float]]:
    """(process start, ready, torch imported) of each rank of `attempt` (0 for the first)."""
    return [tuple(map(float, p.read_text().split())) for p in sorted(out.glob(f"a{attempt}-r*"))]  # type: ignore


def restart_time(out: Path, ranks: int) -> tuple[float, float, float] | None:
    """Seconds from attempt 1's failure to every rank of attempt 2 running, and of that, to the last rank
    process starting and to the last rank done importing torch (None: attempt 2 never ran whole)."""
    second = stamps(out, 1)
    if not (out / "fail0").exists() or len(second) != ranks:
        return None
    failed = float((out / "fail0").read_text())
    return (max(ready for _, ready, _ in second) - failed, max(start for start, _, _ in second) - failed,
            max(imported for _, _, imported in second) - failed)


# One restart at most, as bare torchrun's --max-restarts 1 (which lost nodes spend too): with a lost-node restart
# left, the standby torchrun of a possible attempt 3 would import torch while attempt 2's ranks do.
ONE_RESTART = ("--max-restarts", "1", "--max-node-restarts", "0", "--restart-backoff", "0")


def main(env: dict[str, str], reps: int, quick: bool, tmp: Path, only: str = "") -> Section:
    """only: run just the cases whose name contains it, or one of its |-separated parts (and no count runs);
    "" runs everything."""
    cases = {
        "detlaunch torchrun, 1 node x 2": (lambda: detlaunch_job(1, *ONE_RESTART), 2, 1),
        "detlaunch direct, 1 node x 2": (lambda: detlaunch_job(1, *ONE_RESTART, layer="direct"), 2, 1),
        "detlaunch horovod, 1 node x 2": (lambda: detlaunch_job(1, *ONE_RESTART, layer="horovod"), 2, 1),
        "detlaunch deepspeed, 1 node x 2": (lambda: detlaunch_job(1, *ONE_RESTART, layer="deepspeed"), 2, 1),
        "bare torchrun --max-restarts 1, 1 node x 2": (lambda: bare_torchrun(1), 2, 1),
        "bare torchrun --standalone --max-restarts 1, 1 node x 2": (lambda: bare_torchrun(1, standalone=True), 2, 1),
        "bare torchrun --standalone --max-restarts 1, store not shared, 1 node x 2": (
            lambda: bare_torchrun(1, standalone=True, unshared=True), 2, 1),
        "detlaunch torchrun, 2 nodes x 1": (lambda: detlaunch_job(2, *ONE_RESTART), 2, 1),
        "detlaunch direct, 2 nodes x 1": (lambda: detlaunch_job(2, *ONE_RESTART, layer="direct"), 2, 1),
        "bare torchrun --max-restarts 1, 2 nodes x 1": (lambda: bare_torchrun(2), 2, 1),
        "fresh start, detlaunch 2 nodes x 1 (no failure)": (lambda: detlaunch_job(2), 2, 0),
        # What the ranks of bare horovodrun / deepspeed cost to start (neither restarts on its own).
        "fresh start, bare horovodrun -np 2, 1 node x 2": (lambda: bare_launcher("horovodrun"), 2, 0),
        "fresh start, bare deepspeed --num_gpus 2, 1 node x 2": (lambda: bare_launcher("deepspeed"), 2, 0),
        # What the standby torchrun (started while attempt 1 starts, with restarts on) costs a first start.
        "fresh start, detlaunch torchrun 1 node x 2, --max-restarts 1": (
            lambda: detlaunch_job(1, "--max-restarts", "1"), 2, 0),
        "fresh start, detlaunch torchrun 1 node x 2, no restarts": (lambda: detlaunch_job(1), 2, 0),
    }
    cases = {name: case for name, case in cases.items() if any(part in name for part in only.split("|"))}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    # failure -> the last rank process started, and -> the last rank done importing torch
    to_start: dict[str, list[float]] = {name: [] for name in cases}
    to_import: dict[str, list[float]] = {name: [] for name in cases}
    failed: dict[str, list[str]] = {name: [] for name in cases}
    for n, (rep, name) in enumerate(interleaved(reps, list(cases))):
        make, ranks, failures = cases[name]
        out = tmp / f"restarts-{n}"
        out.mkdir()
        job = run(make(), {**env, "BENCH_OUT": str(out), "BENCH_FAILURES": str(failures)}, timeout=240)
        start = imported = None
        if failures:
            times = restart_time(out, ranks)
            took, start, imported = times if times else (None, None, None)
        else:
            first = stamps(out, 0)
            took = max(ready for _, ready, _ in first) - job.start if len(first) == ranks else None
        if took is None or job.code != 0 or job.leaked:
            failed[name].append(f"exit {job.code}, {len(job.leaked)} leaked: {job.stderr.strip()[-300:]!r}")
        else:
            samples[name].append(took)
            if start is not None and imported is not None:
                to_start[name].append(start)
                to_import[name].append(imported)
        load = os.getloadavg()[0]
        say(f"restarts {rep + 1}/{reps} {name}: {'failed' if took is None or job.code else f'{took:.2f} s'} "
            f"(load {load:.1f})")
        shutil.rmtree(out)

    counts: list[int] = []
    count_failures: list[str] = []
    for m in range(0 if only else COUNT_RUNS):
        out = tmp / f"restart-count-{m}"
        out.mkdir()
        job = run(detlaunch_job(2, "--max-restarts", "5", "--restart-backoff", "0"),
                  {**env, "BENCH_OUT": str(out), "BENCH_FAILURES": str(FAILURES), "BENCH_HOW": "exit"}, timeout=400)
        attempts = {p.name.split("-")[0] for p in out.glob("a*-r*")}
        counts.append(len(attempts) - 1)
        if job.code != 0:
            count_failures.append(f"exit {job.code}: {job.stderr.strip()[-300:]!r}")
        say(f"restart count run {m + 1}/{COUNT_RUNS}: {counts[-1]} restart(s), exit {job.code}")
        shutil.rmtree(out)

    stats = {name: Stat(s) if s else None for name, s in samples.items()}
    def split(name: str) -> list[str]:
        if not to_start[name]:
            return ["-", "-", "-"]
        start, imported = to_start[name], to_import[name]
        return [Stat(start).fmt(), Stat([i - s for i, s in zip(imported, start, strict=True)]).fmt(),
                Stat([t - i for t, i in zip(samples[name], imported, strict=True)]).fmt()]

    rows = [[name, stats[name].fmt() if stats[name] else "n/a", *split(name),  # type: ignore[union-attr]
             f"{len(samples[name])}/{len(samples[name]) + len(failed[name])}"] for name in cases]
    notes = [f"{name}: {why}" for name, whys in failed.items() for why in whys]
    exact = sum(1 for c in counts if c == FAILURES)
    count_table = Table(f"Restart count after {FAILURES} injected failures, 2 nodes, --max-restarts 5",
                        ["runs", f"exactly {FAILURES} restarts", "counts seen"],
                        [[str(COUNT_RUNS), str(exact), ", ".join(map(str, counts))]], count_failures)

    def ratio(a: str, b: str) -> float | None:
        sa, sb = stats[a], stats[b]
        return sa.median / sb.median if sa and sb else None

    bare = "bare torchrun --standalone --max-restarts 1, store not shared, 1 node x 2"  # the others' mostly fail
    one = {layer: None if only else ratio(f"detlaunch {layer}, 1 node x 2", bare)
           for layer in ("torchrun", "direct", "horovod", "deepspeed")}
    two = None if only else ratio("detlaunch torchrun, 2 nodes x 1", "fresh start, detlaunch 2 nodes x 1 (no failure)")
    goals = [
        *(Goal(f"restart, 1 node, --layer {layer}: failure to every rank running again",
               "no slower than bare torchrun --max-restarts 1 (the variant whose restart works)",
               f"{r:.2f}x" if r else "n/a", r <= 1.0 if r else None)
          for layer, r in one.items()),
        Goal("restart, 2 nodes: failure to every rank running again", "within 1.2x of a fresh 2-node start",
             f"{two:.2f}x" if two else "n/a", two <= 1.2 if two else None),
        Goal(f"restart count after {FAILURES} failures on 2 nodes", f"exactly {FAILURES} in every run",
             f"{exact}/{COUNT_RUNS} runs", exact == COUNT_RUNS if counts else None),
    ]
    table = Table("Restart: from a rank's failure to every rank of the next attempt running",
                  ["case", "seconds", "of which: to start", "import torch", "rendezvous", "runs ok"], rows, notes)
    panel = Panel("restart: failure to running again", "s", list(cases), [stats[n] for n in cases])
    return Section("restarts", [table, count_table], [panel], goals)


if __name__ == "__main__":  # python -m bench.restarts [REPS [CASE]]: this measurement alone, printed
    import tempfile

    from .common import base_env, become_subreaper, print_section

    become_subreaper()
    with tempfile.TemporaryDirectory() as d:
        section = main(base_env(Path(d)), int(sys.argv[1]) if len(sys.argv) > 1 else 3, False, Path(d),
                       sys.argv[2] if len(sys.argv) > 2 else "")
    print_section(section)
