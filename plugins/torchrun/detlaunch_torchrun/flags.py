"""torchrun's own flags on detlaunch's command line: what detlaunch does with each (docs/LAUNCHER_FLAGS.md).

tests/planning/test_launcher_flags.py checks this table against ``torch.distributed.run.get_args_parser()``:
a flag a new torch adds fails the test until it has a row here.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from detlaunch import ConfigError
from detlaunch.launcher_flags import GIVEN, LauncherFlag, maps, passes, refuses, same_as_detlaunch, turns_on

LOG_FILES = "detlaunch writes each rank's output to DIR/rank-N.log with --log-dir DIR"


def nproc_per_node(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    if value is not None and not value.isdigit():
        raise ConfigError(f"--nproc-per-node={value}: detlaunch counts the visible GPUs itself when "
                          "--nproc-per-node is not given (else 1): drop it, or give a number")
    return {"nproc_per_node": value}


def _one_stream_value(flag: str, value: str | None, options: Mapping[str, Any]) -> str:
    """torchrun's Std value (0-3) for every rank; per-rank maps and one stream alone are refused."""
    text = (value or "").strip()
    if text not in ("0", "1", "2", "3"):
        raise ConfigError(f"{flag} {text}: detlaunch applies one setting to every rank: give {flag} 3 "
                          "(both streams; per-rank values such as 0:3,1:0 are not supported)")
    if text in ("1", "2"):
        raise ConfigError(f"{flag} {text}: {LOG_FILES}, both streams together: use {flag} 3")
    return text


def log_dir(flag: str, options: Mapping[str, Any]) -> Mapping[str, Any]:
    """The files {flag} 3 asks for: in --log-dir, else a new folder of the user's cache (as torchrun makes
    one in /tmp), said in one line."""
    if options.get("log_dir"):
        return {}
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "detlaunch", "logs", f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    print(f"detlaunch: {flag} 3 without --log-dir: each rank's output goes to {path}/rank-N.log", file=sys.stderr)
    return {"log_dir": path}


def tee(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    """Files and the console: what --log-dir does."""
    return log_dir("--tee", options) if _one_stream_value("--tee", value, options) == "3" else {}


def redirects(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    """Files only: no rank reaches the console (rank -1 never exists). With --tee 3 as well, the
    console too, as torchrun does: it redirects to the files and tails the tee'd ones to the console."""
    if _one_stream_value("--redirects", value, options) != "3":
        return {}
    files = log_dir("--redirects", options)
    return files if options.get(GIVEN, {}).get("-t") == "3" else {**files, "ranks": (-1,)}


def run_path(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    """torchrun runs the script with runpy.run_path in its worker process: a rank under detlaunch runs it
    under Python as __main__, which is what the script sees either way."""
    return {}


def local_ranks_filter(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    """The same local ranks on every node, as global ranks (homogeneous nodes)."""
    try:
        local = [int(r) for r in (value or "").split(",") if r.strip()]
    except ValueError:
        raise ConfigError(f"--local-ranks-filter {value}: give local ranks, such as 0 or 0,1") from None
    nnodes = options.get("nnodes") or 1
    if options.get("hosts") or options.get("hostfile"):
        raise ConfigError(f"--local-ranks-filter {value} with a host list: give the global ranks with --ranks R,R")
    if nnodes == 1:
        return {"ranks": tuple(local)}
    nproc = options.get("nproc_per_node")
    if not nproc:
        raise ConfigError(f"--local-ranks-filter {value} on {nnodes} nodes needs --nproc-per-node N "
                          "(or give the global ranks with --ranks R,R)")
    return {"ranks": tuple(node * int(nproc) + r for node in range(nnodes) for r in local)}


def standalone(value: str | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
    return {"nnodes": 1}


TABLE: tuple[LauncherFlag, ...] = (
    same_as_detlaunch("-h", "--help", value=False, doc="detlaunch's help (with --layer torchrun, its options)"),
    maps("--nnodes", to="nnodes", doc="--nnodes (N, or MIN:MAX: a job that may shrink, docs/RESTARTS.md)"),
    maps("--nproc-per-node", "--nproc_per_node", to=nproc_per_node, doc="--nproc-per-node (a number)"),
    passes("--rdzv-backend", "--rdzv_backend"),
    passes("--rdzv-endpoint", "--rdzv_endpoint"),
    passes("--rdzv-id", "--rdzv_id"),
    passes("--rdzv-conf", "--rdzv_conf"),
    maps("--standalone", to=standalone, value=False, doc="--nnodes 1"),
    maps("--max-restarts", "--max_restarts", to="max_restarts", needs_dest=True,
         doc="detlaunch's --max-restarts: the whole job restarts, on every node (docs/RESTARTS.md)",
         why="torchrun would restart this node's ranks behind detlaunch's back, and detlaunch has no job-wide "
         "restarts yet: drop it (detlaunch stops the whole job at the first failure)"),
    passes("--monitor-interval", "--monitor_interval"),
    passes("--start-method", "--start_method"),
    passes("--event-log-handler", "--event_log_handler"),
    passes("--role"),
    maps("-m", "--module", to=turns_on("module"), value=False,
         doc="--module: every rank runs `python -m MODULE ARGS`"),
    maps("--no-python", "--no_python", to=turns_on("no_python"), value=False,
         doc="--no-python: the command runs as it is, even X.py"),
    maps("--run-path", "--run_path", to=run_path, value=False,
         doc="nothing to do: each rank runs the script under Python as its __main__, as runpy.run_path does"),
    maps("--log-dir", "--log_dir", to="log_dir"),
    maps("-r", "--redirects", to=redirects,
         doc="3: --log-dir files only (without --log-dir: a new folder, said in one line), and the console too "
         "with --tee 3, as torchrun does; 0: nothing to do"),
    maps("-t", "--tee", to=tee, doc="3: --log-dir files and the console (without --log-dir: a new folder, said "
         "in one line); 0: nothing to do"),
    maps("--local-ranks-filter", "--local_ranks_filter", to=local_ranks_filter,
         doc="--ranks: those local ranks on every node"),
    refuses("--duplicate-stdout-filters", "--duplicate_stdout_filters",
            why=f"ranks write straight to detlaunch's console, not through torchrun: {LOG_FILES}"),
    refuses("--duplicate-stderr-filters", "--duplicate_stderr_filters",
            why=f"ranks write straight to detlaunch's console, not through torchrun: {LOG_FILES}"),
    maps("--node-rank", "--node_rank", to="node_rank"),
    maps("--master-addr", "--master_addr", to="master_addr"),
    maps("--master-port", "--master_port", to="master_port"),
    maps("--local-addr", "--local_addr", to="node_addr"),
    refuses("--logs-specs", "--logs_specs",
            why=f"ranks write straight to detlaunch's console, not through torchrun: {LOG_FILES}"),
    passes("--numa-binding", "--numa_binding"),
    refuses("--signals-to-handle", "--signals_to_handle",
            why="detlaunch handles SIGINT, SIGTERM and SIGHUP and forwards them to every rank itself: drop it"),
    maps("--shutdown-timeout", "--shutdown_timeout", to="grace_period"),
    passes("--virtual-local-rank", "--virtual_local_rank", value=False),
)
