"""The bench runner: `python -m bench [--quick] [--reps N] [--only NAME ...]` (bench/run.sh sets up first).

Runs each measurement (a module of this package), interleaving the compared cases in
every repetition, and writes bench/results/results.{md,png,json}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from . import (
    common,
    direct,
    flood,
    launch,
    memory,
    multinode,
    report,
    restarts,
    scale,
    spawn,
    status,
    story,
    stragglers,
    teardown,
    teardown_nodes,
    teardown_tutorial,
    throughput,
    warm,
)
from .common import BENCH, DET_PY, ROOT, Section, Table, base_env, become_subreaper, nothing_left, say

MEASUREMENTS: dict[str, Callable[..., Section]] = {
    "throughput": lambda env, reps, quick, tmp: throughput.main(env, reps, quick),
    "memory": memory.main,
    "teardown": teardown.main,
    "teardown-nodes": teardown_nodes.main,
    "teardown-tutorial": teardown_tutorial.main,
    "launch": launch.main,
    "scale": scale.main,
    "multinode": multinode.main,
    "restarts": restarts.main,
    "direct": direct.main,
    "status": status.measure,
    "story": story.measure,
    "flood": flood.measure,
    "spawn": spawn.measure,
    "stragglers": stragglers.measure,
    "warm": warm.main,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="2 repetitions, no 2M-line streams, scale with 1 repetition")
    p.add_argument("--reps", type=int,
                   help="repetitions per case (default 5; at most 3 for the 2M-line streams, scale and "
                        "teardown-nodes; 2 with --quick)")
    p.add_argument("--only", nargs="+", choices=list(MEASUREMENTS), help="run only these measurements")
    p.add_argument("--cases", nargs="+", metavar="TEXT", default=[],
                   help="only the cases whose name holds one of TEXT (with --only: e.g. --only multinode "
                        "--cases horovod)")
    p.add_argument("--out", type=Path, default=BENCH / "results", help="where results go (default bench/results)")
    return p.parse_args(argv)


def header(args: argparse.Namespace, reps: int, started: float, wall: float, load_at_start: str) -> list[str]:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    try:
        det = subprocess.run([DET_PY, "-c", "import determined; print(determined.__version__)"],
                             capture_output=True, text=True).stdout.strip() or "not installed"
    except FileNotFoundError:
        det = "not installed"
    rev = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                         capture_output=True, text=True).stdout.strip()
    load = f"{os.getloadavg()[0]:.2f}"
    return [
        f"- run: {time.strftime('%Y-%m-%d %H:%M', time.localtime(wall))}, "
        f"{time.monotonic() - started:.0f} s, {'--quick, ' if args.quick else ''}{reps} repetitions per case, "
        "cases interleaved (order rotated every repetition)",
        f"- machine: {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}; "
        f"1-min load average {load_at_start} at the start, {load} at the end (a shared machine: the spread "
        "shows the noise)",
        f"- versions: detlaunch {rev}, torch {version('torch')}, deepspeed {version('deepspeed')}, "
        f"horovod {version('horovod')}, determined {det}",
        "- times: median (min-max) over the repetitions",
    ]


def measure_all(args: argparse.Namespace, reps: int, env: dict[str, str], tmp: Path,
                sections: list[Section]) -> bool:
    """Run the chosen measurements into `sections`; True when one of them failed."""
    failed = False
    for name, measure in MEASUREMENTS.items():
        if args.only and name not in args.only:
            continue
        long = name in ("scale", "teardown-nodes")  # scale: 8 jobs a repetition; 32 nodes: ~1 min a run
        n = min(reps, 1 if args.quick else 3) if long else reps
        try:
            sections.append(measure(env, n, args.quick, tmp))
        except Exception as e:  # one broken measurement must not lose the others
            failed = True
            traceback.print_exc()
            sections.append(Section(name, [Table(f"{name}: FAILED", ["error"], [[str(e).splitlines()[0]]])], [], []))
    return failed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    reps = args.reps or (2 if args.quick else 5)
    common.CASES_WITH[:] = args.cases
    become_subreaper()
    started, wall = time.monotonic(), time.time()
    load_at_start = f"{os.getloadavg()[0]:.2f}"
    sections: list[Section] = []
    tmp = Path(tempfile.mkdtemp(prefix="detlaunch-bench-"))
    try:
        with nothing_left():  # Ctrl-C, SIGTERM, SIGHUP or the end: every process the bench started is gone
            failed = measure_all(args, reps, base_env(tmp), tmp, sections)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # once nothing writes there any more

    args.out.mkdir(parents=True, exist_ok=True)
    text = report.markdown(sections, header(args, reps, started, wall, load_at_start))
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps([dataclasses.asdict(s) for s in sections], indent=1))
    try:
        report.chart(sections, args.out / "results.png")
        charted = f" and {args.out / 'results.png'}"
    except ImportError:
        charted = " (no chart: matplotlib is not installed)"
    print(text)
    say(f"wrote {args.out / 'results.md'}{charted}")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        say("interrupted: stopped every process the bench had started")
        sys.exit(130)
