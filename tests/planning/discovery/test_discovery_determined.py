"""The determined provider: Determined's cluster info files, and the worker's daemon mark on a real HTTP server.

A Determined master cannot run here; FakeMaster is a real HTTP(S) server on 127.0.0.1 that
implements the one endpoint detlaunch calls and records every request.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from detlaunch.errors import ClusterError, ConfigError, LaunchError
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.providers.determined import read_det_info
from detlaunch.planning.providers.determined_master import Master, canonical_url, post
from detlaunch.planning.stage import Command, Stage, StageContext
from support.discovery import clean_env, config_for, discover, hooks_for, short_tmp  # noqa: F401
from support.helpers import free_port
from support.jobs import Launcher

pytestmark = pytest.mark.timeout(120)
ALLOC, RES, TOKEN = "alloc.1-2", "res-7", "tok3n"
DAEMON_PATH = f"/api/v1/allocations/{ALLOC}/resources/{RES}/daemon"


# -- a real HTTP server standing in for the master ----------------------------------------------


class FakeMaster:
    """A real HTTP server on 127.0.0.1 that answers the daemon endpoint and records requests.

    refuse_for: the port is bound but not listening for that many seconds first, so
    connections are refused (as while a master restarts), then it listens.
    """

    def __init__(self, status: int = 200, refuse_for: float = 0.0, tls: ssl.SSLContext | None = None):
        self.requests: list[dict[str, Any]] = []
        self.status = status
        master = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                master.requests.append({"method": "POST", "path": self.path, "headers": dict(self.headers),
                                        "body": self.rfile.read(length), "at": time.monotonic()})
                ok = master.status < 300 and self.path == DAEMON_PATH
                body = b"{}" if ok else json.dumps({"error": {"error": "boom\nsecond line"}}).encode()
                self.send_response(master.status if self.path == DAEMON_PATH else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        self.server.socket.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.socket.getsockname()[1])
        self.listening_at: float | None = None
        self.listening = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(refuse_for,), daemon=True)
        self.thread.start()
        if not refuse_for:
            assert self.listening.wait(10) and self.listening_at is not None, "the fake master never listened"

    def _serve(self, refuse_for: float) -> None:
        time.sleep(refuse_for)  # the outage the test asks for: connections are refused until then
        try:
            self.server.server_activate()  # listen()
            self.listening_at = time.monotonic()
        finally:
            self.listening.set()  # also on failure: the test's assert reports it instead of hanging
        self.server.serve_forever(poll_interval=0.05)

    @property
    def url(self) -> str:
        scheme = "https" if isinstance(self.server.socket, ssl.SSLSocket) else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self.listening_at is not None:
            self.server.shutdown()
        self.thread.join(10)
        self.server.server_close()


@pytest.fixture
def master() -> Iterator[FakeMaster]:
    m = FakeMaster()
    yield m
    m.close()


# -- Determined's info files --------------------------------------------------------------------


def write_info(folder: Path, master_url: str = "http://127.0.0.1:8080", rank: int = 1,
               addrs: tuple[str, ...] = ("127.0.0.1", "127.0.0.2"), counts: tuple[int, ...] = (2, 2),
               task_type: str = "TRIAL", **changes: Any) -> dict[str, str]:
    """cluster.json and rendezvous.json as Determined 0.38.1's harness writes them; the env pointing at them."""
    folder.mkdir(parents=True, exist_ok=True)
    cluster = {"master_url": master_url, "cluster_id": "c1", "agent_id": "agent-1", "slot_ids": [0, 1],
               "task_id": "1.trial", "allocation_id": ALLOC, "session_token": TOKEN, "task_type": task_type,
               "master_cert_name": None, "master_cert_file": None, "latest_checkpoint": None, **changes}
    (folder / "cluster.json").write_text(json.dumps(cluster))
    rendezvous = {"container_addrs": list(addrs), "container_rank": rank, "container_slot_counts": list(counts)}
    (folder / "rendezvous.json").write_text(json.dumps(rendezvous))
    return clean_env(os.environ, DET_CLUSTER_INFO=str(folder / "cluster.json"), DET_RESOURCES_ID=RES)


def test_a_trial_container_gives_nodes_rank_slots_and_allocation(tmp_path: Path) -> None:
    c = discover(env=write_info(tmp_path, counts=(2, 4)))
    assert (c.provider, c.node_addrs, c.slots, c.node_rank, c.chief_addr, c.job_id) == (
        "determined", ("127.0.0.1", "127.0.0.2"), (2, 4), 1, "127.0.0.1", ALLOC)
    assert dict(c.sources) == {
        "nodes": "container_addrs of rendezvous.json", "node_rank": "container_rank=1",
        "slots": "container_slot_counts=[2, 4]", "chief": "container_addrs[0]",
        "job_id": f"allocation_id of {tmp_path / 'cluster.json'}"}


def test_other_task_types_are_one_local_container(tmp_path: Path) -> None:
    env = write_info(tmp_path, task_type="COMMAND")
    (tmp_path / "rendezvous.json").unlink()
    c = discover(env=env)
    assert (c.node_addrs, c.slots, c.node_rank) == (("127.0.0.1",), (2,), 0)


def test_flags_win_and_zero_slots_run_one_cpu_rank(tmp_path: Path) -> None:
    env = write_info(tmp_path, counts=(0, 0))
    c = discover(env=env)
    assert (c.slots, c.sources["slots"]) == ((1, 1), "container_slot_counts=[0, 0] (0 slots: one CPU rank)")
    c = discover("--nproc-per-node", "3", "--job-id", "j", env=env)
    assert (c.slots, c.job_id, c.sources["slots"], c.sources["job_id"]) == ((3, 3), "j", "--nproc-per-node", "--job-id")


def test_determined_comes_before_slurm_and_kubernetes(tmp_path: Path) -> None:
    env = {**write_info(tmp_path), "SLURM_JOB_ID": "4", "SLURM_JOB_NODELIST": "localhost", "SLURM_NODEID": "0",
           "MASTER_ADDR": "m", "WORLD_SIZE": "2", "RANK": "0"}
    assert discover(env=env).provider == "determined"
    assert discover("--cluster", "slurm", env=env).provider == "slurm"
    assert discover(env={**env, "DETLAUNCH_DISABLE_PLUGINS": "determined"}).provider == "slurm"
    assert discover("--hosts", "a:1", env=env).provider == "static"


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: (d / "cluster.json").unlink(),
     "Determined cluster info {d}/cluster.json does not exist: run inside a Determined task, point "
     "DET_CLUSTER_INFO at cluster.json, or drop --cluster determined"),
    (lambda d: (d / "rendezvous.json").unlink(),
     "Determined rendezvous info {d}/rendezvous.json does not exist: run inside a Determined task, point "
     "DET_CLUSTER_INFO at cluster.json, or drop --cluster determined"),
    (lambda d: (d / "cluster.json").write_text("{not json"),
     "cannot read Determined cluster info {d}/cluster.json: Expecting property name enclosed in double quotes: "
     "line 1 column 2 (char 1)"),
    (lambda d: write_info(d, allocation_id=None),
     "Determined cluster info {d}/cluster.json has no 'allocation_id': is it from Determined 0.38 or later?"),
    (lambda d: write_info(d, slot_ids="0,1"),
     "Determined cluster info {d}/cluster.json: 'slot_ids' should be list, got '0,1'"),
    (lambda d: write_info(d, rank=2),
     "Determined rendezvous info {d}/rendezvous.json: container_rank 2 is outside the 2 containers (valid 0..1)"),
    (lambda d: write_info(d, counts=(1,)),
     "Determined rendezvous info {d}/rendezvous.json: 2 container_addrs but 1 container_slot_counts"),
    (lambda d: write_info(d, master_url="http://h:port"),
     "bad Determined master URL 'http://h:port': the port is not a number"),
])
def test_bad_info_is_one_clear_line(tmp_path: Path, change: Any, message: str) -> None:
    env = write_info(tmp_path)
    change(tmp_path)
    with pytest.raises(ConfigError) as e:
        discover(env=env)
    assert str(e.value) == message.format(d=tmp_path)


def test_the_info_is_read_as_the_harness_reads_it(tmp_path: Path) -> None:
    info = read_det_info(write_info(tmp_path, master_url="det.example:8443", master_cert_name="det"))
    assert (info.master_url, info.container_rank, info.slot_ids, info.master_cert_name) == (
        "http://det.example:8443", 1, (0, 1), "det")
    assert canonical_url("https://m") == "https://m:443" and canonical_url("m/") == "http://m:8080"


# -- marking a worker as a daemon, through the real hook call -----------------------------------


def stage_context(env: dict[str, str], cluster: ClusterInfo) -> StageContext:
    hooks = hooks_for(env)
    config = config_for(hooks, [], env)
    return StageContext(config=config, cluster=cluster, run_dir="/nonexistent", shared_dir="/nonexistent",
                        user_command=("train.py",))


SSHD = Stage(commands=(Command(("sshd", "-D"), daemon=True),))
TORCHRUN = Stage(commands=(Command(("torchrun", "train.py")),))


def job_started(env: dict[str, str], stage: Stage = SSHD) -> None:
    hooks = hooks_for(env)
    ctx = stage_context(env, hooks.discover_cluster(config_for(hooks, [], env)))
    hooks.job_started(ctx, stage)


def test_a_daemon_only_worker_marks_its_resources(tmp_path: Path, master: FakeMaster) -> None:
    job_started(write_info(tmp_path, master_url=master.url))
    assert len(master.requests) == 1
    r = master.requests[0]
    assert (r["method"], r["path"], r["body"]) == ("POST", DAEMON_PATH, b"")
    assert r["headers"]["Grpc-Metadata-x-allocation-token"] == f"Bearer {TOKEN}"


def test_the_chief_and_launcher_workers_are_not_marked(tmp_path: Path, master: FakeMaster) -> None:
    job_started(write_info(tmp_path, master_url=master.url, rank=0))
    job_started(write_info(tmp_path, master_url=master.url, rank=1), TORCHRUN)
    assert master.requests == []


def test_connections_refused_at_first_are_retried(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = FakeMaster(refuse_for=0.6)
    try:
        started = time.monotonic()
        job_started(write_info(tmp_path, master_url=m.url))
        assert len(m.requests) == 1 and m.listening_at is not None and m.requests[0]["at"] >= m.listening_at
        assert time.monotonic() - started >= 0.6
    finally:
        m.close()
    warnings = capsys.readouterr().err.splitlines()
    assert warnings[0] == (f"detlaunch: the Determined master at {m.url} is not reachable (Connection refused); "
                           "retrying in 0.25 s (1/5)")
    assert 2 <= len(warnings) <= 3


def test_a_master_error_is_one_line_naming_the_plugin(tmp_path: Path) -> None:
    m = FakeMaster(status=500)
    try:
        with pytest.raises(LaunchError) as e:
            job_started(write_info(tmp_path, master_url=m.url))
    finally:
        m.close()
    assert str(e.value) == (f"determined: the Determined master answered 500 Internal Server Error to POST "
                            f"{m.url}{DAEMON_PATH}: boom second line (see the master's log)")
    assert len(m.requests) == 1  # an HTTP error is not retried


def test_a_master_that_never_answers_gives_up_with_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: refused every time
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        warned: list[str] = []
        with pytest.raises(LaunchError) as e:
            post(Master(url, TOKEN), DAEMON_PATH, attempts=3, first_delay=0.01, warn=warned.append)
    assert str(e.value) == (f"cannot reach the Determined master at {url} (Connection refused) after 3 attempts: "
                            "is DET_MASTER right and the master up?")
    assert len(warned) == 2


def test_missing_resources_id(tmp_path: Path, master: FakeMaster) -> None:
    env = write_info(tmp_path, master_url=master.url)
    del env["DET_RESOURCES_ID"]
    with pytest.raises(ClusterError) as e:
        job_started(env)
    assert str(e.value) == ("determined: DET_RESOURCES_ID is not set, so this worker cannot be marked as a daemon: "
                            "Determined sets it in every task container; is this one?")


# -- TLS: the master's certificate, and the name it must carry -----------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=det-master", "-addext", "subjectAltName=DNS:det-master", "-keyout", str(key),
                        "-out", str(cert)], capture_output=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"openssl cannot make a test certificate: {r.stderr.decode()[:200]}")
    return key, cert


@pytest.fixture
def tls_master(tls_files: tuple[Path, Path]) -> Iterator[FakeMaster]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(tls_files[1]), str(tls_files[0]))
    m = FakeMaster(tls=context)
    yield m
    m.close()


def test_tls_needs_the_masters_certificate(tmp_path: Path, tls_master: FakeMaster,
                                           tls_files: tuple[Path, Path]) -> None:
    env = write_info(tmp_path, master_url=tls_master.url)
    with pytest.raises(LaunchError) as e:
        job_started(env)
    assert str(e.value).startswith(f"determined: TLS to the Determined master at {tls_master.url} failed (")
    assert str(e.value).endswith("set DET_MASTER_CERT_FILE to its CA bundle, DET_MASTER_CERT_NAME to the name in "
                                 "its certificate, or DET_MASTER_CERT_FILE=noverify")
    with pytest.raises(LaunchError, match="TLS to the Determined master"):  # right CA, wrong name (127.0.0.1)
        job_started({**env, "DET_MASTER_CERT_FILE": str(tls_files[1])})
    job_started({**env, "DET_MASTER_CERT_FILE": str(tls_files[1]), "DET_MASTER_CERT_NAME": "det-master"})
    with pytest.warns(urllib3.exceptions.InsecureRequestWarning):  # the user asked for it; urllib3 still says so
        job_started({**env, "DET_MASTER_CERT_FILE": "noverify"})
    assert [r["path"] for r in tls_master.requests] == [DAEMON_PATH, DAEMON_PATH]


# -- the real CLI, on two "containers" ------------------------------------------------------------

LAYER = '''
"""A third-party layer: the chief runs one command, workers only serve it (a daemon, like sshd)."""
import sys

from detlaunch import Command, Stage, hookimpl

@hookimpl
def detlaunch_chief_stage(ctx):
    proof = "import os; open(os.environ['PROOF'], 'w').write('the chief ran')"
    return Stage(commands=(Command((sys.executable, "-c", proof)),), expected_ranks=0)

@hookimpl
def detlaunch_worker_stage(ctx):
    return Stage(commands=(Command((sys.executable, "-c", "import time; time.sleep(60)"), name="fake-sshd",
                                   daemon=True),), expected_ranks=0)
'''


def install_daemon_layer(site: Path) -> dict[str, str]:
    """Install a layer the way pip would leave it: a module and a dist-info with its entry point."""
    dist = site / "detlaunch_testlayer-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: detlaunch-testlayer\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[detlaunch.layers]\ndaemonworker = daemonworker_layer\n")
    (site / "daemonworker_layer.py").write_text(LAYER)
    return {"PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}


def two_containers(launcher: Launcher, tmp_path: Path, master_url: str, short_tmp: str,  # noqa: F811
                   ) -> tuple[dict[str, str], dict[str, str]]:
    port = free_port()
    layer_env = install_daemon_layer(tmp_path / "site")
    envs = []
    for rank in (0, 1):
        env = write_info(tmp_path / f"c{rank}", master_url=master_url, rank=rank)
        envs.append({**clean_env(launcher.env), "DET_CLUSTER_INFO": env["DET_CLUSTER_INFO"],
                     "DET_RESOURCES_ID": RES, "DETLAUNCH_MASTER_PORT": str(port), "TMPDIR": short_tmp,
                     **layer_env})
    return envs[0], envs[1]


def test_the_cli_marks_the_worker_then_runs_the_job(launcher: Launcher, tmp_path: Path, master: FakeMaster,
                                                    short_tmp: str) -> None:  # noqa: F811
    chief_env, worker_env = two_containers(launcher, tmp_path, master.url, short_tmp)
    proof = tmp_path / "proof"
    worker = launcher.start("--layer", "daemonworker", "true", env=worker_env)
    chief = launcher.start("--layer", "daemonworker", "true", env={**chief_env, "PROOF": str(proof)})
    rc, rw = chief.wait(60), worker.wait(60)
    assert (rc.returncode, rw.returncode) == (0, 0), rc.output + rw.output
    assert proof.read_text() == "the chief ran"
    assert [(r["path"], r["headers"]["Grpc-Metadata-x-allocation-token"]) for r in master.requests] == [
        (DAEMON_PATH, f"Bearer {TOKEN}")]  # the worker, once; never the chief


def test_the_cli_stops_with_one_line_when_the_master_refuses(launcher: Launcher, tmp_path: Path,
                                                             short_tmp: str) -> None:  # noqa: F811
    m = FakeMaster(status=500)
    try:
        _, worker_env = two_containers(launcher, tmp_path, m.url, short_tmp)
        r = launcher.run("--layer", "daemonworker", "true", env=worker_env, timeout=60)
    finally:
        m.close()
    assert r.returncode == 1, r.output
    assert r.stderr == (f"detlaunch: error: determined: the Determined master answered 500 Internal Server Error "
                        f"to POST {m.url}{DAEMON_PATH}: boom second line (see the master's log)\n")
    assert r.stdout == ""  # nothing started


def test_python_sees_the_test_layer_only_through_pythonpath(real_processes: None, tmp_path: Path) -> None:
    env = {**os.environ, **install_daemon_layer(tmp_path / "site")}
    r = subprocess.run([sys.executable, "-m", "detlaunch", "layers"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert "daemonworker" in r.stdout and "detlaunch-testlayer 0.0" in r.stdout, r.stdout + r.stderr


def test_any_job_started_failure_is_one_line_naming_its_plugin(tmp_path: Path) -> None:
    from detlaunch.planning.hookspecs import hookimpl
    from detlaunch.planning.plugin_manager import PluginSet

    class Broken:
        @hookimpl
        def detlaunch_job_started(self, ctx: StageContext) -> None:
            raise KeyError("DET_SOMETHING")

    env = write_info(tmp_path)
    plugins = PluginSet(env)
    plugins.load_plugins()
    plugins.pm.register(Broken(), name="detlaunch.plugins:broken")
    hooks = plugins.hooks
    ctx = stage_context(env, hooks.discover_cluster(config_for(hooks, [], env)))
    with pytest.raises(LaunchError) as e:
        hooks.job_started(ctx, TORCHRUN)
    assert str(e.value) == "broken: job_started failed: KeyError: 'DET_SOMETHING'"
