"""``detlaunch report [EVENTS...] [-o FILE] [--format html|trace]``: a job's story from its event logs, as one
self-contained page (or a Chrome/Perfetto trace); and the page a job leaves in its ``--log-dir`` when it ends.

The page is built from the logs alone (observe/story_*.py), so it can be made any time after the job, on any
machine the logs were copied to, and no plugin or layer is loaded for it. A log that is cut short or has lines
that are not events still gives a page, of what could be read, and one line saying what could not.
"""

from __future__ import annotations

import argparse
import glob
import os
import stat
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

import detlaunch.exit_codes as exit_codes
from detlaunch.errors import ConfigError, one_line
from detlaunch.observe import story_html, story_trace
from detlaunch.observe.events import events_path
from detlaunch.observe.story_model import build
from detlaunch.observe.story_read import read_logs
from detlaunch.system.safefs import write_private_file

PAGE = "report.html"  # in --log-dir, when a job ends there
DEFAULT_OUT = {"html": "report.html", "trace": "trace.json"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see detlaunch report --help)")


def report_command(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """`detlaunch report`: read the logs, write the page, one line about it; 2 for bad input, 1 for no event."""
    p = _Parser(prog="detlaunch report", description="A job's story from its event logs: one self-contained HTML "
                "page (a timeline, a lane per rank, and the report), or a Chrome/Perfetto trace.")
    p.add_argument("events", nargs="+", metavar="EVENTS",
                   help="event logs (events.jsonl, events-node-N.jsonl), or a --log-dir that holds them")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where it goes (default: report.html, trace.json with --format trace; - for stdout)")
    p.add_argument("--format", choices=("html", "trace"), default="html",
                   help="html: the page; trace: Trace Event JSON for Perfetto or chrome://tracing")
    try:
        ns = p.parse_args(argv)
        reading = read_logs(ns.events)
    except ConfigError as e:
        print(f"detlaunch: error: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except OSError as e:  # a path that is not there (story_read.log_files)
        print(f"detlaunch: error: {one_line(e)}", file=sys.stderr)
        return exit_codes.USAGE
    if not reading.events and not reading.foreign:
        why = f" ({reading.summary()})" if reading.problems else ""
        print(f"detlaunch: error: no event could be read from {', '.join(reading.files)}{why}", file=sys.stderr)
        return exit_codes.FAILED
    if reading.problems:
        print(f"detlaunch: warning: {reading.summary()}", file=sys.stderr)
    story = build(reading)
    text = story_trace.render(story) if ns.format == "trace" else story_html.render(story)
    out = ns.output or DEFAULT_OUT[ns.format]
    try:
        if out != "-" and os.path.lexists(out) and not stat.S_ISREG(os.lstat(out).st_mode):
            print(f"detlaunch: error: {one_line(out)} exists and is not a regular file: not replaced; "
                  "give -o a new path (or - for stdout)", file=sys.stderr)
            return exit_codes.USAGE
        if out == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
            return 0
        write_private_file(out, text)  # whole or not at all; the user's only, as the logs it comes from
    except BrokenPipeError:
        return exit_codes.FAILED
    except OSError as e:
        print(f"detlaunch: error: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return exit_codes.FAILED
    print(f"detlaunch: wrote {one_line(out)} ({len(text.encode()) / 1024:.0f} KiB: {len(story.spans)} rank(s), "
          f"{len(story.attempts)} attempt(s)): {one_line(story.verdict)}", file=sys.stderr)
    return 0


def page_at_end(log_dir: str, events: str | None) -> str | None:
    """The chief, its job over: the page of the job's logs as ``LOG_DIR/report.html``. Never raises: a page that
    cannot be made is one warning line (returned), never the job's failure; no log, no page, nothing said."""
    path = os.path.join(log_dir, PAGE)
    try:
        chief = events_path(events, log_dir)
        logs = [p for p in [chief, *([] if events else glob.glob(os.path.join(log_dir, "events-node-*.jsonl")))]
                if p and os.path.isfile(p)]
        if not logs:
            return None
        reading = read_logs(logs)
        if not reading.events:
            return None
        write_private_file(path, story_html.render(build(reading)))
        return None
    except Exception as e:  # the job is over and its exit code decided: nothing here may change either
        return f"the job's page {path} could not be written: {one_line(e)}"
