"""One door for every event of a node: the event log, the plugins' ``detlaunch_event`` hook, the status.

The supervisor says what happened (`emit`), once; this part stamps it, applies it to the node's
`StatusTracker` (what ``detlaunch status`` answers from), appends it to the event log and hands it
to the plugins, in that order, so the three never disagree. Nothing here may break the job: a
log that cannot be written is said once (and in the end report), a plugin that raises is said
once per plugin, and the job goes on either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from detlaunch.observe.events import Event, EventKind, EventLog
from detlaunch.observe.status import StatusTracker

# A plugin's hook call: the errors it raised, as (plugin name, one line).
EventHook = Callable[[Event], list[tuple[str, str]]]


class EventEmitter:
    """Stamps, tracks, logs and publishes a node's events (see the module docstring)."""

    def __init__(self, job_id: str, node: int, *, path: str | None, hook: EventHook | None,
                 warn: Callable[[str], None], clock: Callable[[], float] = time.time) -> None:
        self.job_id, self.node = job_id, node
        self.hook, self.warn, self.clock = hook, warn, clock
        self.tracker = StatusTracker(job_id)
        self.log = EventLog(path) if path else None
        self._said_log_error = False
        self._failed_plugins: set[str] = set()
        self._check_log()

    def emit(self, kind: EventKind, rank: int | None = None, *, node: int | None = None, **details: Any) -> Event:
        """Record that `kind` happened now (on `node`, default this node's), about `rank` if given."""
        event = Event(self.clock(), self.job_id, self.node if node is None else node, rank, kind, details)
        self.tracker.observe(event)
        if self.log is not None and not self.log.write(event):
            self._check_log()
        if self.hook is not None:
            for plugin, error in self.hook(event):
                if plugin not in self._failed_plugins:
                    self._failed_plugins.add(plugin)
                    self.warn(f"plugin {plugin}: detlaunch_event failed: {error}; its later failures are not shown")
        return event

    def warnings(self) -> list[str]:
        """For the end report: the log's problem and how many events it missed."""
        if self.log is None or self.log.error is None:
            return []
        return [f"{self.log.error} ({self.log.dropped} event(s) not written)"]

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self._check_log()

    def _check_log(self) -> None:
        if self.log is not None and self.log.error and not self._said_log_error:
            self._said_log_error = True
            self.warn(self.log.error)
