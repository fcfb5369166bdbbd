"""Warm ranks: each rank forked from its node's rank template, against every rank a new interpreter.

--layer direct (the supervisor starts the wrappers), and --layer torchrun (torchrun's agent starts them; each
asks the node's template) for the restart and the first starts of 2 and 8 ranks.

The same jobs with and without --no-warm-ranks, interleaved:

- restart, 1 node x 2 and 2 nodes x 1: from a rank's failure to every rank of attempt 2 past
  init_process_group and a barrier (bench/scripts/restart_rank.py, as bench/restarts.py measures it), split
  into "to start" (the failure to the last rank process started) and "import torch" (to the last rank done
  importing torch.distributed: near 0 for a warm rank, whose template imported it);
- first start, 1 node x 2 and x 8: from the launch to every rank past init and a barrier
  (bench/scripts/warm_rank.py);
- memory of 8 ranks after their imports: their PSS summed, read by each rank while all are alive (the
  template's own PSS added to the warm job's);
- 64 ranks of a trivial script (no torch): launch to the job's end, against bare torchrun's, as
  bench/scale.py's case (the template then imports nothing: what a fork saves against an interpreter start).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from .common import DETLAUNCH, PY, SCRIPTS, Goal, Panel, Section, Stat, Table, free_port, interleaved, run, say
from .restarts import ONE_RESTART, detlaunch_job, restart_time, stamps

RANK = str(SCRIPTS / "warm_rank.py")
TRIVIAL = str(SCRIPTS / "warm_trivial.py")


def first_start(ranks: int, *extra: str, layer: str = "direct") -> list[str]:
    return [DETLAUNCH, "--layer", layer, "--nproc-per-node", str(ranks), "--master-port", str(free_port()),
            *extra, RANK]


def many(ranks: int, *extra: str) -> list[str]:
    return [DETLAUNCH, "--layer", "direct", "--nproc-per-node", str(ranks), "--master-port", str(free_port()),
            *extra, TRIVIAL]


def bare_many(ranks: int) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port", str(free_port()),
            TRIVIAL]


COLD = ("--no-warm-ranks",)
# name: (argv maker, ranks, failures, what is measured)
CASES = {
    "restart 1 node x 2, warm": (lambda: detlaunch_job(1, *ONE_RESTART, layer="direct"), 2, 1, "restart"),
    "restart 1 node x 2, cold": (lambda: detlaunch_job(1, *ONE_RESTART, *COLD, layer="direct"), 2, 1, "restart"),
    "restart 2 nodes x 1, warm": (lambda: detlaunch_job(2, *ONE_RESTART, layer="direct"), 2, 1, "restart"),
    "restart 2 nodes x 1, cold": (lambda: detlaunch_job(2, *ONE_RESTART, *COLD, layer="direct"), 2, 1, "restart"),
    "torchrun restart 1 node x 2, warm": (lambda: detlaunch_job(1, *ONE_RESTART), 2, 1, "restart"),
    "torchrun restart 1 node x 2, cold": (lambda: detlaunch_job(1, *ONE_RESTART, *COLD), 2, 1, "restart"),
    "torchrun first start 2 ranks, warm": (lambda: first_start(2, layer="torchrun"), 2, 0, "start"),
    "torchrun first start 2 ranks, cold": (lambda: first_start(2, *COLD, layer="torchrun"), 2, 0, "start"),
    "torchrun first start 8 ranks, warm": (lambda: first_start(8, layer="torchrun"), 8, 0, "start"),
    "torchrun first start 8 ranks, cold": (lambda: first_start(8, *COLD, layer="torchrun"), 8, 0, "start"),
    "first start 2 ranks, warm": (lambda: first_start(2), 2, 0, "start"),
    "first start 2 ranks, cold": (lambda: first_start(2, *COLD), 2, 0, "start"),
    "first start 8 ranks, warm": (lambda: first_start(8), 8, 0, "start"),
    "first start 8 ranks, cold": (lambda: first_start(8, *COLD), 8, 0, "start"),
    "64 trivial ranks, warm": (lambda: many(64), 64, 0, "job"),
    "64 trivial ranks, cold": (lambda: many(64, *COLD), 64, 0, "job"),
    "64 trivial ranks, bare torchrun": (lambda: bare_many(64), 64, 0, "job"),
}


def main(env: dict[str, str], reps: int, quick: bool, tmp: Path, only: str = "") -> Section:
    cases = {n: c for n, c in CASES.items() if any(part in n for part in only.split("|"))}
    took: dict[str, list[float]] = {n: [] for n in cases}
    start: dict[str, list[float]] = {n: [] for n in cases}
    imports: dict[str, list[float]] = {n: [] for n in cases}
    pss: dict[str, list[float]] = {n: [] for n in cases}
    notes: list[str] = []
    for n, (rep, name) in enumerate(interleaved(reps, list(cases))):
        make, ranks, failures, what = cases[name]
        out = tmp / f"warm-{n}"
        out.mkdir()
        job = run(make(), {**env, "BENCH_OUT": str(out), "BENCH_FAILURES": str(failures)}, timeout=300)
        value = None
        if what == "restart":
            times = restart_time(out, ranks)
            if times:
                value = times[0]
                start[name].append(times[1])
                imports[name].append(times[2] - times[1])
        elif what == "start":
            first = stamps(out, 0)
            if len(first) == ranks:
                value = max(ready for _, ready, _ in first) - job.start
                start[name].append(max(s for s, _, _ in first) - job.start)
                imports[name].append(max(i for _, _, i in first) - max(s for s, _, _ in first))
            kb = [int(p.read_text()) for p in out.glob("pss-r*")]
            if len(kb) == ranks:
                pss[name].append(sum(kb) / 1024)
        else:
            value = job.duration
        if value is None or job.code != 0 or job.leaked:
            notes.append(f"{name}: exit {job.code}, {len(job.leaked)} leaked: {job.stderr.strip()[-300:]!r}")
        else:
            took[name].append(value)
        say(f"warm {rep + 1}/{reps} {name}: {'failed' if value is None or job.code else f'{value:.2f} s'}")
        shutil.rmtree(out)

    def fmt(values: list[float], unit: str = "s") -> str:
        return Stat(values).fmt(unit) if values else "-"

    rows = [[name, fmt(took[name]), fmt(start[name]), fmt(imports[name]), fmt(pss[name], "MB"),
             f"{len(took[name])}/{reps}"] for name in cases]

    def median(name: str, of: dict[str, list[float]] = took) -> float | None:
        return Stat(of[name]).median if of.get(name) else None

    def ratio(a: str, b: str, of: dict[str, list[float]] = took) -> float | None:
        x, y = median(a, of), median(b, of)
        return x / y if x and y else None

    restart, torchrun = median("restart 1 node x 2, warm"), median("torchrun restart 1 node x 2, warm")
    torchrun_eight = ratio("torchrun first start 8 ranks, warm", "torchrun first start 8 ranks, cold")
    eight, two = ratio("first start 8 ranks, warm", "first start 8 ranks, cold"), ratio(
        "first start 2 ranks, warm", "first start 2 ranks, cold")
    memory = ratio("first start 8 ranks, warm", "first start 8 ranks, cold", pss)
    scale = ratio("64 trivial ranks, warm", "64 trivial ranks, bare torchrun")
    goals = [
        Goal("restart 1 node x 2 (--layer direct), failure to every rank running", "<= 0.6 s",
             f"{restart:.2f} s" if restart else "n/a", restart <= 0.6 if restart else None),
        Goal("restart 1 node x 2 (--layer torchrun), failure to every rank running", "<= 0.6 s",
             f"{torchrun:.2f} s" if torchrun else "n/a", torchrun <= 0.6 if torchrun else None),
        Goal("first start of 8 ranks (--layer torchrun), warm against cold", "<= 0.5x",
             f"{torchrun_eight:.2f}x" if torchrun_eight else "n/a", torchrun_eight <= 0.5 if torchrun_eight else None),
        Goal("first start of 8 ranks, warm against cold", "<= 0.5x", f"{eight:.2f}x" if eight else "n/a",
             eight <= 0.5 if eight else None),
        Goal("first start of 2 ranks, warm against cold", "no slower (<= 1.0x)", f"{two:.2f}x" if two else "n/a",
             two <= 1.0 if two else None),
        Goal("PSS of 8 ranks after their imports, warm (template included) against cold", "<= 0.5x",
             f"{memory:.2f}x" if memory else "n/a", memory <= 0.5 if memory else None),
        Goal("64 trivial ranks, warm detlaunch against bare torchrun", "<= 1.1x", f"{scale:.2f}x" if scale else "n/a",
             scale <= 1.1 if scale else None),
    ]
    table = Table("Warm ranks (--layer direct, and torchrun where named) against cold ones", [
                  "case", "seconds", "of which: to start",
                  "import torch", "PSS of the ranks", "runs ok"], rows, notes)
    panel = Panel("warm ranks", "s", list(cases), [Stat(took[n]) if took[n] else None for n in cases])
    return Section("warm", [table], [panel], goals)


if __name__ == "__main__":  # python -m bench.warm [REPS [CASE|CASE]]: this measurement alone, printed
    import tempfile

    from .common import base_env, become_subreaper, print_section

    become_subreaper()
    with tempfile.TemporaryDirectory() as d:
        section = main(base_env(Path(d)), int(sys.argv[1]) if len(sys.argv) > 1 else 3, False, Path(d),
                       sys.argv[2] if len(sys.argv) > 2 else "")
    print_section(section)
