"""A job's page (`detlaunch report`, issue 30): its size, the time to build it, and the time a browser takes to draw it.

    python -m bench.story [--ranks 8 64 1024] [--reps 3]

For each size, the simulated job of tests/support/story_logs.py (3 attempts: a rank's failure, a lost node and its
spare, a straggler, a hang; 8 ranks a node) is written as its nodes' event logs, then:
1. `python -m detlaunch report LOGS -o page.html`, a new Python each time as a user runs it: wall time;
2. the same in this process (read, model, page), without Python's start: the part a job's end pays;
3. the page's size;
4. headless Chromium (Debian's, as the tests run it: tests/support/browser.py) loading the page: the page's own
   mark in its load handler once it has forced the whole document's style and layout (ms from navigation), and
   the browser's wall time.
Goals (issue 30): a 1024-rank, 3-attempt page under 2 MB, drawn in under a second.

Part of `python -m bench` (`--only story`; `--quick`: 8 and 1024 ranks, 2 repetitions) and standalone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import Goal, Panel, Section, Stat, Table, say

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the simulated job and the browser's flags, as the tests use them

from support import browser  # noqa: E402
from support.story_logs import simulated_job, write_logs  # noqa: E402

DETLAUNCH = [sys.executable, "-m", "detlaunch"]


def one_size(ranks: int, reps: int, env: dict[str, str], tmp: Path) -> dict[str, list[float]]:
    """The figures of one size, `reps` times each: command, in-process build, size, draw, browser wall."""
    from detlaunch.observe import story_html
    from detlaunch.observe.story_model import build
    from detlaunch.observe.story_read import read_logs

    logs = tmp / f"logs-{ranks}"
    write_logs(logs, simulated_job(ranks))
    page = tmp / f"page-{ranks}.html"
    out: dict[str, list[float]] = {"command": [], "build": [], "size": [], "draw": [], "browser": []}
    for rep in range(reps):
        t = time.perf_counter()
        subprocess.run([*DETLAUNCH, "report", str(logs), "-o", str(page)], env=env, check=True,
                       capture_output=True)
        out["command"].append(time.perf_counter() - t)
        t = time.perf_counter()
        story_html.render(build(read_logs([str(logs)])))
        out["build"].append(time.perf_counter() - t)
        out["size"].append(page.stat().st_size / 1024 / 1024)
        work = tmp / f"browser-{ranks}-{rep}"
        work.mkdir()
        t = time.perf_counter()
        done = subprocess.run([browser.chromium(), *browser.flags(work), "--dump-dom", page.as_uri()],
                              env={**env, **browser.env()},
                              capture_output=True, text=True, timeout=120, start_new_session=True)
        out["browser"].append(time.perf_counter() - t)
        drawn = browser.drawn_ms(done.stdout)
        if drawn is None:
            raise RuntimeError(f"the {ranks}-rank page was not drawn: {done.stderr[-2000:]}")
        out["draw"].append(drawn / 1000)
    return out


def measure(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    """`python -m bench --only story`: issue 30's figures at 8, 64 and 1024 ranks."""
    sizes = [8, 1024] if quick else [8, 64, 1024]
    reps = min(reps, 3)
    rows, figures = [], {}
    for n in sizes:
        say(f"story: the page of a simulated {n}-rank job of 3 attempts")
        figures[n] = {k: Stat(v) for k, v in one_size(n, reps, env, tmp).items()}
        f = figures[n]
        rows.append([f"{n} ranks", f"{f['size'].median:.2f} MB", f["command"].fmt(digits=3),
                     f["build"].fmt(digits=3), f["draw"].fmt(digits=3), f["browser"].fmt(digits=2)])
    big = figures[max(sizes)]
    goals = [Goal(f"job page, {max(sizes)} ranks x 3 attempts: size", "< 2 MB", f"{big['size'].median:.2f} MB",
                  big["size"].median < 2.0),
             Goal(f"job page, {max(sizes)} ranks x 3 attempts: drawn", "< 1 s", f"{big['draw'].median:.3f} s",
                  big["draw"].median < 1.0)]
    panels = [Panel("job page: drawn by headless Chromium (lower is better)", "seconds",
                    [f"{n} ranks" for n in sizes], [figures[n]["draw"] for n in sizes], goal=1.0)]
    notes = ["command: `python -m detlaunch report LOGS -o page.html`, a new Python each time; build: the same in "
             "the bench's process (read, model, page); drawn: the page's mark in its load handler, the whole "
             "document styled and laid out, ms from navigation, in headless Chromium (`--dump-dom`); browser: "
             "Chromium's whole run"]
    table = Table("A job's page (`detlaunch report`)", ["job", "page", "command", "build", "drawn", "browser"], rows,
                  notes)
    return Section("story", [table], panels, goals)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.story", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 1024])
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp_name:
        for n in args.ranks:
            f = one_size(n, args.reps, env, Path(tmp_name))
            med = {k: statistics.median(v) for k, v in f.items()}
            print(f"{n:>5} ranks x 3 attempts: page {med['size']:.2f} MB; detlaunch report {med['command']:.3f} s "
                  f"(in process {med['build']:.3f} s); drawn {med['draw'] * 1000:.0f} ms (browser run "
                  f"{med['browser']:.2f} s); {args.reps} runs, min-max command {min(f['command']):.3f}-"
                  f"{max(f['command']):.3f} s, drawn {min(f['draw']) * 1000:.0f}-{max(f['draw']) * 1000:.0f} ms",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
