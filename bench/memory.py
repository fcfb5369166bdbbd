"""2. Peak RSS of the per-rank wrapper.

VmHWM, the kernel's high-water mark of a process's resident memory (/proc/PID/status), read
by the rank itself: it prints 200k lines of 100 bytes, waits until the wrapper has read
every byte of them, and then reads VmHWM of every process above it. After that a wrapper
only collects the rank's exit status and exits. Measured standalone (wrapper -> rank) and
in a 2-rank job (detlaunch --layer torchrun; Determined's pid_server chain).

Cross-check over the whole life of the process: GNU time's %M (ru_maxrss from wait4), for
the wrapper in front of a tiny shell rank (about 2 MB; %M is the larger of the two). Note
that ru_maxrss of a process includes the RSS of its parent at fork time, so it must be
started by something small (time itself), never straight from the bench's Python.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .common import DET_PY, PY, SCRIPTS, WRAPPER, Goal, Panel, Section, Stat, Table, interleaved, run, say
from .launchers import determined_chain, detlaunch_torchrun

RANK = str(SCRIPTS / "rank.py")
LINES = 200_000
TINY_RANK = ["/bin/sh", "-c", f"yes {'z' * 99} | head -n {LINES}"]
GNU_TIME = "/usr/bin/time"

WRAPPERS = {
    "detlaunch rank wrapper": [PY, "-S", WRAPPER, "--rank", "0", "--"],
    "Determined wrap_rank": [DET_PY, "-m", "determined.launch.wrap_rank", "0", "--"],
}
JOBS = {"detlaunch --layer torchrun": detlaunch_torchrun, "Determined pid_server chain": determined_chain}
# which ancestor of a rank is which process, by the program it runs
ROLES = {
    "wrapper.py": "detlaunch rank wrapper",  # started by hand
    "run_wrapper.py": "detlaunch rank wrapper",  # as the supervisor starts it
    "determined.launch.wrap_rank": "Determined wrap_rank",
    "determined.exec.pid_client": "Determined pid_client",
    "determined.exec.pid_server": "Determined pid_server (per node)",
    "detlaunch": "detlaunch supervisor (per node)",
    "torch.distributed.run": "torchrun agent (per node)",
}


def role(cmdline: str) -> str | None:
    """'python -S x/run_wrapper.py ...' -> run_wrapper.py; 'python -m mod ...' -> mod; looked up in ROLES."""
    argv = cmdline.split()
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "-m" and i + 1 < len(argv):
            return ROLES.get(argv[i + 1])
        i += 1
    return ROLES.get(os.path.basename(argv[i] if i < len(argv) else argv[0]))


def hwm(job: Path) -> dict[str, list[float]]:
    """The VmHWM (MB) the ranks of a job read of each process above them, by role."""
    found: dict[str, list[float]] = {}
    for path in sorted(job.glob("hwm-*")):
        for proc in json.loads(path.read_text()):
            who = role(proc["cmdline"])
            if who:
                found.setdefault(who, []).append(proc["vmhwm_kb"] / 1024)
    return found


def main(env: dict[str, str], reps: int, quick: bool, tmp: Path) -> Section:
    standalone: dict[str, list[float]] = {name: [] for name in WRAPPERS}
    whole_life: dict[str, list[float]] = {name: [] for name in WRAPPERS}
    in_job: dict[str, list[float]] = {}
    cases = [*(f"{w}|standalone" for w in WRAPPERS), *(f"{w}|time" for w in WRAPPERS), *(f"{j}|job" for j in JOBS)]
    for rep, case in interleaved(reps, cases):
        name, how = case.split("|")
        say(f"memory: {name}, {how} ({rep + 1}/{reps})")
        job = tmp / f"memory-{cases.index(case)}-{rep}"
        job.mkdir()
        if how == "standalone":
            run([*WRAPPERS[name], PY, "-S", RANK, "probe", str(job), str(LINES)], env).check(0)
            standalone[name] += hwm(job)[name]
        elif how == "time":
            out = job / "maxrss"
            run([GNU_TIME, "-f", "%M", "-o", str(out), *WRAPPERS[name], *TINY_RANK], env).check(0)
            whole_life[name].append(int(out.read_text().split()[-1]) / 1024)
        else:
            run(JOBS[name](2, [RANK, "probe", str(job), str(LINES)], job, env), env).check(0)
            for who, values in hwm(job).items():
                in_job.setdefault(who, []).extend(values)

    rows = []
    for name in WRAPPERS:
        rows.append([name, "standalone: VmHWM read by the rank", Stat(standalone[name]).fmt("MB", 1)])
        rows.append([name, "standalone: GNU time %M, whole life", Stat(whole_life[name]).fmt("MB", 1)])
    for name, values in sorted(in_job.items()):
        rows.append([name, "in a 2-rank job: VmHWM read by the rank", Stat(values).fmt("MB", 1)])
    det_pair = [a + b for a, b in zip(in_job.get("Determined pid_client", []),
                                      in_job.get("Determined wrap_rank", []), strict=False)]
    if det_pair:
        rows.append(["Determined pid_client + wrap_rank", "in a 2-rank job: summed per rank",
                     Stat(det_pair).fmt("MB", 1)])
    ours = [*standalone["detlaunch rank wrapper"], *whole_life["detlaunch rank wrapper"],
            *in_job.get("detlaunch rank wrapper", [])]
    goals = [Goal("per-rank wrapper peak RSS", "<= 12 MB", f"{max(ours):.1f} MB (worst run)", max(ours) <= 12)]
    table = Table("Peak RSS of the per-rank wrapper (and, for scale, the per-node processes)",
                  ["process", "how", "peak RSS"], rows,
                  ["median (min-max) over every run and rank; MB = 2^20 bytes",
                   f"each rank first streams {LINES:,} lines of 100 bytes through its wrapper"])
    labels = ["detlaunch wrapper\nstandalone", "Determined wrap_rank\nstandalone"]
    stats = [Stat(standalone[name]) for name in WRAPPERS]
    for name in ("detlaunch rank wrapper", "Determined wrap_rank", "Determined pid_client"):
        if name in in_job:
            labels.append(f"{name.replace('rank wrapper', 'wrapper')}\nin a job")
            stats.append(Stat(in_job[name]))
    if det_pair:
        labels.append("Determined pid_client\n+ wrap_rank, in a job")
        stats.append(Stat(det_pair))
    panel = Panel("Per-rank wrapper peak RSS (lower is better)", "MB", labels, stats, goal=12)
    return Section("memory", [table], [panel], goals)
