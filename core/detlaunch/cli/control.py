"""``detlaunch status`` and ``detlaunch stacks``: a shell's side of control.py.

A question to a running job should answer at once, so this path imports only what it needs
(control.py's client part, status.py's table; json, socket, argparse): not the launcher's
options, plugins or parts (planning/config.py, planning/plugin_manager.py...), which cost more than the answer itself.
`python -m detlaunch status` comes here without importing cli/main.py at all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, NoReturn

import detlaunch.exit_codes as exit_codes
from detlaunch.errors import ConfigError, one_line

CONTROL_COMMANDS = ("status", "stacks")  # questions to a running job (control.py): no plugin is loaded for them
# py-spy's budget on every node (the answer comes within it + 2 s); the ranks' Flight Recorders are asked too
CONTROL_ARGS: dict[str, dict[str, Any]] = {"stacks": {"budget": 2.0, "flight": True}}


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError (one line, exit 2) instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see detlaunch --help)")


def watch_every(text: str) -> int | float:
    """--watch S, checked as every number is (config.Number), imported only when S is given."""
    from detlaunch.planning.config import Number

    return Number(float, 0.1, 3600, None, "s").parse(text)


def control_command(what: str, argv: list[str], env: Mapping[str, str]) -> int:
    """``detlaunch status [JOB] [--format json] [--watch [S]]``: ask a running job on this node, print its answer."""
    from detlaunch.link import control

    p = _Parser(prog=f"detlaunch {what}", description=f"Ask this user's running job (on this node) for its {what}.")
    p.add_argument("job", nargs="?", help="the job id (default: your only running job on this node)")
    p.add_argument("--format", choices=("text", "json"), default=env.get("DETLAUNCH_FORMAT") or "text")
    p.add_argument("--watch", nargs="?", const=2.0, type=watch_every, metavar="S",
                   help="ask again every S seconds (default 2), redrawn in place on a terminal, until the job ends")
    if what == "stacks":
        p.add_argument("--full", action="store_true", help="every frame of each group's main thread")
    try:
        ns = p.parse_args(argv)
        if ns.format not in ("text", "json"):  # argparse does not check a default against the choices
            raise ConfigError(f"DETLAUNCH_FORMAT={ns.format!r}: choose text or json")
        job, path = control.find_job(ns.job)
        data = job_facts(control.ask(path, what, CONTROL_ARGS.get(what)))
    except ConfigError as e:
        print(f"detlaunch: error: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except (control.NotRunning, OSError) as e:
        print(f"detlaunch: {e}", file=sys.stderr)
        return exit_codes.FAILED
    except ValueError as e:  # an answer that is not what this detlaunch reads (another version's)
        return _unreadable(e)
    tty = sys.stdout.isatty()
    try:
        while True:
            if what == "stacks":
                text = format_stacks(data, ns.format == "json", full=ns.full)
            else:
                text = json.dumps(data, indent=2, sort_keys=True) if ns.format == "json" else format_status(data)
            if ns.watch is None:
                print(text, flush=True)
                return 0
            from detlaunch.observe.status import watch_frame

            sys.stdout.write(watch_frame(text + "\n", tty))
            sys.stdout.flush()
            time.sleep(ns.watch)  # the refresh the user asked for: the job is never touched in between
            try:
                data = job_facts(control.ask(path, what, CONTROL_ARGS.get(what)))
            except (control.NotRunning, OSError):
                print(f"detlaunch: job {job} is not running any more", file=sys.stderr)
                return 0
    except ValueError as e:
        return _unreadable(e)
    except BrokenPipeError:  # `detlaunch status | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt:  # the usual way out of --watch
        return 0
    return 0


def _unreadable(e: ValueError) -> int:
    print(f"detlaunch: the job's answer could not be read ({e}): is it run by another detlaunch version?",
          file=sys.stderr)
    return exit_codes.FAILED


def job_facts(data: dict[str, Any]) -> dict[str, Any]:
    """The chief's facts about the job (in its node's part) on the answer itself: "stragglers" ({rank: mark}),
    each rank's "straggler" (its mark or null), and "hang_timeout" (what --hang-timeout auto learned)."""
    nodes = [n for n in data.get("nodes") or [] if isinstance(n, dict)]
    chief: dict[str, Any] = next((n for n in nodes if "stragglers" in n), {})
    named: dict[str, Any] = chief["stragglers"] if isinstance(chief.get("stragglers"), dict) else {}
    data["stragglers"] = named
    if chief.get("hang_timeout"):
        data["hang_timeout"] = chief["hang_timeout"]
    if isinstance(chief.get("spares"), list):
        data["spares"] = [str(s) for s in chief["spares"]]
    if chief.get("size"):  # --nnodes MIN:MAX
        data["size"] = str(chief["size"])
    for node in nodes:
        for rank in node.get("ranks") or []:
            if isinstance(rank, dict) and "rank" in rank:
                rank["straggler"] = named.get(str(rank["rank"]))
    return data


def format_stacks(data: Mapping[str, object], as_json: bool, full: bool = False) -> str:
    """`detlaunch stacks`: every node's answer, grouped (stacks/groups.py). Stacks take seconds: their
    formatting may import more than a status does."""
    from detlaunch.stacks.groups import format_json, format_text
    from detlaunch.stacks.query import report_of

    report = report_of(data)
    missing = list(data.get("missing") or [])  # type: ignore[call-overload]
    named = data.get("stragglers") or {}
    if as_json:
        return json.dumps({"job": data.get("job"), "missing": missing, **format_json(report), "stragglers": named},
                          indent=2)
    lines = [f"job {data.get('job')}", *format_text(report, full=full)]
    lines += [f"rank {rank}: named a straggler ({mark})" for rank, mark in named.items()]  # type: ignore[attr-defined]
    if not report.groups and not report.unavailable:
        lines.append("no rank is running")
    if missing:
        lines.append(f"no answer from node(s) {', '.join(map(str, missing))}")
    return "\n".join(lines)


def format_status(data: Mapping[str, Any]) -> str:
    """The table of `detlaunch status` (status.py's): every rank of every node that answered, one row each."""
    from detlaunch.observe import status as status_view

    parts = []
    known = status_view.RANK_FIELDS
    for node in data.get("nodes") or []:
        if "ranks" not in node:  # an old supervisor's, or an error: shown as it came
            parts.append(status_view.JobStatus(str(data.get("job")), str(node.get("error") or "?"), time.time()))
            continue
        ranks = tuple(status_view.RankState(**{k: v for k, v in r.items() if k in known}) for r in node["ranks"])
        parts.append(status_view.JobStatus(str(data.get("job")), str(node.get("phase")),
                                           float(node.get("taken_at") or time.time()), ranks,
                                           node.get("root_cause")))
    if not parts:
        return f"job {data.get('job')}: {data.get('error') or 'no node answered'}"
    merged = dataclasses.replace(status_view.merge(parts), hang_timeout=data.get("hang_timeout"),
                                 spares=tuple(data.get("spares") or ()), size=data.get("size"))
    text = status_view.render_table(merged, time.time())
    missing = data.get("missing") or []
    if missing:
        text += f"no answer from node(s) {', '.join(map(str, missing))}\n"
    return text.rstrip("\n")


def main() -> int:
    """`python -m detlaunch status|stacks ...` (__main__.py sends them here before cli/main.py is imported)."""
    return control_command(sys.argv[1], sys.argv[2:], os.environ)
