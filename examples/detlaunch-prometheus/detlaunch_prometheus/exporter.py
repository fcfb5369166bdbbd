"""Prometheus metrics of a running detlaunch job, from its events: ``--metrics-port PORT``.

    detlaunch --metrics-port 9400 --layer torchrun train.py   # then: curl 127.0.0.1:9400/metrics

Each node's detlaunch serves its own node's metrics, on 127.0.0.1 unless ``--metrics-host`` says
otherwise (metrics name hosts and exit codes: expose them only where you mean to). Without
``--metrics-port`` the plugin does nothing but count.

How: ``detlaunch_event`` runs in the supervisor's event loop, so it only updates counters under a
lock (microseconds, never I/O); a stdlib HTTP server in a daemon thread renders them when scraped.
The port is taken in ``detlaunch_job_started`` (a port in use stops the launch with one line,
before anything runs), served from the first event on (in the supervisor's process, where the
events are) and closed in ``detlaunch_job_finished``. No prometheus_client dependency:
the text format is a few lines.

Imports nothing but the public ``detlaunch`` API and the standard library.
"""

from __future__ import annotations

import argparse
import http.server
import os
import sys
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

from detlaunch import ConfigError, hookimpl

if TYPE_CHECKING:
    from detlaunch import Event, JobResult, Stage, StageContext

DEFAULT_HOST = "127.0.0.1"


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """What the events say so far, for one node of one job. Thread-safe: events come from the
    supervisor's loop, scrapes from the server's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.job = ""
        self.node = 0
        self.events: Counter[str] = Counter()
        self.running: set[int] = set()
        self.exit_codes: dict[int, int] = {}
        self.job_exit_code: int | None = None
        self.stragglers: dict[int, float] = {}  # rank -> its speed against the others' (the chief's `straggler`)
        self.last_event_time = 0.0

    def observe(self, event: Event) -> None:
        kind = str(event.kind)
        with self._lock:
            self.job, self.node = event.job_id, event.node
            self.events[kind] += 1
            self.last_event_time = max(self.last_event_time, event.time)
            if kind == "rank_started" and event.rank is not None:
                self.running.add(event.rank)
            elif kind == "rank_exited" and event.rank is not None:
                self.running.discard(event.rank)
                code, signum = event.details.get("code"), event.details.get("signal")
                self.exit_codes[event.rank] = 128 + int(signum) if signum else int(code or 0)
            elif kind == "straggler" and event.rank is not None:
                self.stragglers[event.rank] = float(event.details.get("speed", 0.0))
            elif kind == "job_finished":
                self.job_exit_code = int(event.details.get("exit_code", 0))

    def render(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        with self._lock:
            base = f'job_id="{_label(self.job)}",node="{self.node}"'
            out = [
                "# HELP detlaunch_events_total Events of the job on this node, by kind.",
                "# TYPE detlaunch_events_total counter",
                *(f'detlaunch_events_total{{{base},kind="{_label(k)}"}} {n}' for k, n in sorted(self.events.items())),
                "# HELP detlaunch_ranks_running Ranks of this node running now.",
                "# TYPE detlaunch_ranks_running gauge",
                f"detlaunch_ranks_running{{{base}}} {len(self.running)}",
                "# HELP detlaunch_rank_exit_code Exit code of each rank that ended (128+N for signal N).",
                "# TYPE detlaunch_rank_exit_code gauge",
                *(f'detlaunch_rank_exit_code{{{base},rank="{r}"}} {c}' for r, c in sorted(self.exit_codes.items())),
                "# HELP detlaunch_last_event_timestamp_seconds Wall-clock time of the last event.",
                "# TYPE detlaunch_last_event_timestamp_seconds gauge",
                f"detlaunch_last_event_timestamp_seconds{{{base}}} {self.last_event_time}",
            ]
            if self.stragglers:
                out += ["# HELP detlaunch_rank_straggler_speed A rank named a straggler: its speed against the "
                        "other ranks' median (0.5: twice as slow).",
                        "# TYPE detlaunch_rank_straggler_speed gauge",
                        *(f'detlaunch_rank_straggler_speed{{{base},rank="{r}"}} {v}'
                          for r, v in sorted(self.stragglers.items()))]
            if self.job_exit_code is not None:
                out += ["# HELP detlaunch_job_exit_code The exit code the job ended with on this node.",
                        "# TYPE detlaunch_job_exit_code gauge",
                        f"detlaunch_job_exit_code{{{base}}} {self.job_exit_code}"]
            return "\n".join(out) + "\n"


class MetricsServer:
    """GET /metrics on (host, port), from a daemon thread; port 0 picks a free one (see `port`)."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics is here")
                    return
                body = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass  # a scrape every few seconds must not reach the job's console

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host, self.port = host, int(self._server.server_address[1])
        self._thread: threading.Thread | None = None
        self._pid = 0

    def serve(self) -> None:
        """Serve from this process (once). detlaunch runs its supervisor, which gets the events, in a
        child process of the one that called job_started (the PID namespace): the listening socket is
        inherited by it, a thread is not, so serving starts with the first event, where the events are."""
        if self._thread is None or self._pid != os.getpid():
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._server.serve_forever, name="detlaunch-metrics",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        if self._thread is not None and self._pid == os.getpid():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


METRICS = Metrics()
_server: MetricsServer | None = None


def start(host: str, port: int) -> MetricsServer:
    """Serve METRICS; ConfigError (one line) when the address cannot be had."""
    global _server
    stop()
    try:
        _server = MetricsServer(METRICS, host, port)
    except OSError as e:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}: "
                          "choose another --metrics-port (or --metrics-host)") from None
    return _server


def stop() -> None:
    global _server
    if _server is not None:
        server, _server = _server, None
        server.close()


@hookimpl
def detlaunch_add_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("prometheus exporter (detlaunch-prometheus)")
    g.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve the job's metrics at http://HOST:PORT/metrics while it runs (default: off)")
    g.add_argument("--metrics-host", default=DEFAULT_HOST, metavar="ADDR",
                   help=f"the address to serve metrics on (default {DEFAULT_HOST}: this machine only)")


@hookimpl
def detlaunch_job_started(ctx: StageContext, stage: Stage) -> None:
    port = ctx.option("metrics_port")
    if port is not None:
        server = start(ctx.option("metrics_host", DEFAULT_HOST), int(port))
        print(f"detlaunch-prometheus: metrics at http://{server.host}:{server.port}/metrics", file=sys.stderr)


@hookimpl
def detlaunch_event(event: Event) -> None:
    METRICS.observe(event)
    if _server is not None:
        _server.serve()


@hookimpl
def detlaunch_job_finished(ctx: StageContext, result: JobResult) -> None:
    stop()
