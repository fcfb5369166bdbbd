"""An always-on plugin (``detlaunch.plugins``) for tests: an option of its own, and three observers.

Each observer appends one JSON line to the file named by TOY_OBSERVER_LOG; with
TOY_OBSERVER_RAISE set, job_finished raises after logging (an observer's failure must be
reported and must not change the exit code). detlaunch_event appends each event to the file
named by TOY_OBSERVER_EVENTS, and raises after it too when TOY_OBSERVER_RAISE is set.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from detlaunch import Event, JobResult, Stage, StageContext, hookimpl


@hookimpl
def detlaunch_add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument_group("toy observer").add_argument("--toy-tag", default="untagged",
                                                           help="a tag the toy observer logs")


def _log(ctx: StageContext, record: dict[str, Any]) -> None:
    path = ctx.env.get("TOY_OBSERVER_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({**record, "tag": ctx.option("toy_tag"), "pid": os.getpid()}) + "\n")


@hookimpl
def detlaunch_job_started(ctx: StageContext, stage: Stage) -> None:
    _log(ctx, {"hook": "job_started", "commands": [c.name for c in stage.commands]})


@hookimpl
def detlaunch_job_finished(ctx: StageContext, result: JobResult) -> None:
    root = result.failure.rank.rank if result.failure and result.failure.rank else None
    _log(ctx, {"hook": "job_finished", "exit_code": result.exit_code,
               "ranks": sorted(s.rank for s in result.ranks), "root_cause_rank": root})
    if ctx.env.get("TOY_OBSERVER_RAISE"):
        raise RuntimeError("the toy observer fails on purpose")


@hookimpl
def detlaunch_event(event: Event) -> None:
    path = os.environ.get("TOY_OBSERVER_EVENTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"kind": event.kind, "rank": event.rank, "details": dict(event.details),
                                "pid": os.getpid()}) + "\n")
    if os.environ.get("TOY_OBSERVER_RAISE"):
        raise RuntimeError("the toy event observer fails on purpose")
