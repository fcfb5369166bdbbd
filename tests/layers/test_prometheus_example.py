"""The example exporter plugin (examples/detlaunch-prometheus): events in, Prometheus text out, over loopback.

The module is imported from the example's folder (it is a separate distribution); its hooks are called
as detlaunch calls them, with real Event objects, a real argparse parser and a real StageContext.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from detlaunch import ClusterInfo, Config, ConfigError, StageContext
from detlaunch.observe.events import Event, EventKind
from support import paths
from support.helpers import free_port
from support.jobs import SCRIPTS, Launcher
from support.plugin_examples import fake_dist

EXAMPLE = paths.EXAMPLES / "detlaunch-prometheus"
RANKS = str(SCRIPTS / "ranks.py")
sys.path.insert(0, str(EXAMPLE))
from detlaunch_prometheus import exporter  # noqa: E402


def ev(kind: EventKind, rank: int | None = None, t: float = 100.0, **details: object) -> Event:
    return Event(t, "job-9", 1, rank, kind, details)


def context(port: int | None) -> StageContext:
    config = Config(layer="torchrun", command=("train.py",), launcher_args=(), env={},
                    options={"metrics_port": port, "metrics_host": "127.0.0.1"})
    cluster = ClusterInfo(node_addrs=("127.0.0.1",), slots=(2,), node_rank=0, chief_addr="127.0.0.1", job_id="job-9")
    return StageContext(config=config, cluster=cluster, run_dir="/nonexistent", shared_dir="/nonexistent",
                        user_command=("train.py",))


@pytest.fixture(autouse=True)
def fresh_metrics() -> Iterator[None]:
    exporter.METRICS = exporter.Metrics()
    yield
    exporter.stop()


def scrape(port: int, path: str = "/metrics") -> tuple[int, str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.status, r.headers["Content-Type"], r.read().decode()


def test_the_metrics_follow_the_events() -> None:
    for e in (ev(EventKind.RANK_STARTED, 2, pid=10), ev(EventKind.RANK_STARTED, 3, pid=11),
              ev(EventKind.RANK_EXITED, 3, t=105.5, code=None, signal=9, wall=105.5, stopped=False),
              ev(EventKind.RANK_EXITED, 2, t=106.0, code=0, signal=None, wall=106.0, stopped=True),
              ev(EventKind.STRAGGLER, 3, t=104.0, basis="sections", speed=0.5, action="warn", confidence="certain"),
              ev(EventKind.JOB_FINISHED, t=107.0, exit_code=137, duration=7.0)):
        exporter.detlaunch_event(e)
    text = exporter.METRICS.render()
    base = 'job_id="job-9",node="1"'
    for line in (f'detlaunch_events_total{{{base},kind="rank_started"}} 2',
                 f'detlaunch_events_total{{{base},kind="rank_exited"}} 2',
                 f"detlaunch_ranks_running{{{base}}} 0",
                 f'detlaunch_rank_exit_code{{{base},rank="2"}} 0',
                 f'detlaunch_rank_exit_code{{{base},rank="3"}} 137',
                 f"detlaunch_last_event_timestamp_seconds{{{base}}} 107.0",
                 f"detlaunch_job_exit_code{{{base}}} 137",
                 f'detlaunch_rank_straggler_speed{{{base},rank="3"}} 0.5',
                 "# TYPE detlaunch_events_total counter"):
        assert line in text.splitlines(), line


def test_label_values_are_escaped() -> None:
    exporter.detlaunch_event(Event(1.0, 'a"b\\c\nd', 0, None, EventKind.JOB_PLANNED, {}))
    assert 'job_id="a\\"b\\\\c\\nd"' in exporter.METRICS.render()


def test_the_options_exist_and_default_to_off() -> None:
    parser = argparse.ArgumentParser()
    exporter.detlaunch_add_options(parser)
    assert vars(parser.parse_args([])) == {"metrics_port": None, "metrics_host": "127.0.0.1"}
    assert parser.parse_args(["--metrics-port", "9400"]).metrics_port == 9400


def test_without_a_port_nothing_is_served() -> None:
    exporter.detlaunch_job_started(context(None), None)  # type: ignore[arg-type]
    assert exporter._server is None


@pytest.mark.timeout(20)
def test_the_server_serves_the_metrics_on_loopback_until_the_job_finishes(capsys: pytest.CaptureFixture[str]) -> None:
    exporter.detlaunch_job_started(context(0), None)  # type: ignore[arg-type]
    server = exporter._server
    assert server is not None and server.host == "127.0.0.1"
    assert capsys.readouterr().err == f"detlaunch-prometheus: metrics at http://127.0.0.1:{server.port}/metrics\n"
    exporter.detlaunch_event(ev(EventKind.RANK_STARTED, 0, pid=5))
    status, ctype, body = scrape(server.port)
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    assert 'detlaunch_ranks_running{job_id="job-9",node="1"} 1' in body.splitlines()
    with pytest.raises(urllib.error.HTTPError) as err:
        scrape(server.port, "/")
    assert err.value.code == 404
    exporter.detlaunch_job_finished(context(0), None)  # type: ignore[arg-type]
    assert exporter._server is None
    with pytest.raises(urllib.error.URLError):
        scrape(server.port)


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^cannot serve metrics on 127.0.0.1:{port}: Address already in use: "
                                              "choose another --metrics-port"):
            exporter.detlaunch_job_started(context(port), None)  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_a_real_job_serves_its_metrics_while_it_runs(launcher: Launcher, tmp_path: Path) -> None:
    """Installed as a third party's plugin (a dist-info on the child's PYTHONPATH: the shared venv is left
    alone), it serves the supervisor's events, which run in another process than job_started."""
    env = fake_dist(tmp_path / "site", "detlaunch-prometheus",
                    {"detlaunch.plugins": {"prometheus": "detlaunch_prometheus.exporter"}})
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(EXAMPLE), os.environ.get("PYTHONPATH", "")])
    port = free_port()
    job = launcher.start("--layer", "torchrun", "--nproc-per-node", "2", "--master-port", str(free_port()),
                         "--job-id", "metrics-job", "--metrics-port", str(port), RANKS, env={**env, "SLEEP": "300"})
    for rank in (0, 1):
        job.wait_for_output(f"[rank={rank}] rank {rank} sleeping", timeout=60)
    _, _, body = scrape(port)
    lines = body.splitlines()
    assert 'detlaunch_ranks_running{job_id="metrics-job",node="0"} 2' in lines, body
    assert 'detlaunch_events_total{job_id="metrics-job",node="0",kind="rank_started"} 2' in lines, body
    job.send_signal(signal.SIGINT)
    done = job.wait(60)
    assert done.returncode == 130, done.output
    assert f"detlaunch-prometheus: metrics at http://127.0.0.1:{port}/metrics" in done.stderr
