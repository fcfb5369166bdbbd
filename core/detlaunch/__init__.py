"""detlaunch: launch layers for distributed training.

This module is the public API, and the only thing a layer or plugin may import, with three
public submodules: ``detlaunch.ssh`` (per-job sshd and ssh client parts, for layers that reach
other nodes over ssh), ``detlaunch.launcher_flags`` (a launcher's own flags on detlaunch's command
line) and ``detlaunch.testing`` (the layer contract suite and the job runner).
The built-in layers use nothing else, exactly as a third party would.

Attributes load on first use, so that ``import detlaunch`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from detlaunch._lazy import lazy_attributes
from detlaunch.version import __version__ as __version__

_EXPORTS = {
    "hookimpl": "planning.hookspecs",
    "ClusterInfo": "planning.cluster",
    "Config": "planning.config",
    "Number": "numbers",
    "StageContext": "planning.stage",
    "Stage": "planning.stage",
    "Command": "planning.stage",
    "RankWrapper": "planning.stage",
    "JobResult": "outcome",
    "RankStatus": "outcome",
    "Failure": "outcome",
    "DetlaunchError": "errors",
    "ConfigError": "errors",
    "ClusterError": "errors",
    "LaunchError": "errors",
    "check_port_free": "system.ports",
    "cuda_visible_devices": "planning.gpus",
    "given_hosts": "planning.discovery",
    "cpu_sets": "planning.cpu_binding",
    "CPUS_ENV": "planning.cpu_binding",
    "NUMA_BINDING_MODES": "planning.cpu_binding",
    "Check": "planning.doctor",
    "PreflightCheck": "planning.preflight",
    "PreflightFigure": "planning.preflight",
    "PreflightPeer": "planning.preflight",
    "Event": "observe.events",
    "EventKind": "observe.events",
    "progress": "progress",
    "SpawnRequest": "planning.spawn",
    "NodeLaunch": "planning.spawn",
    "Spawner": "planning.spawn",
    "section": "progress",
}
__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # `X as X`: an explicit re-export, for type checkers
    from detlaunch.errors import ClusterError as ClusterError
    from detlaunch.errors import ConfigError as ConfigError
    from detlaunch.errors import DetlaunchError as DetlaunchError
    from detlaunch.errors import LaunchError as LaunchError
    from detlaunch.numbers import Number as Number
    from detlaunch.observe.events import Event as Event
    from detlaunch.observe.events import EventKind as EventKind
    from detlaunch.outcome import Failure as Failure
    from detlaunch.outcome import JobResult as JobResult
    from detlaunch.outcome import RankStatus as RankStatus
    from detlaunch.planning.cluster import ClusterInfo as ClusterInfo
    from detlaunch.planning.config import Config as Config
    from detlaunch.planning.cpu_binding import CPUS_ENV as CPUS_ENV
    from detlaunch.planning.cpu_binding import NUMA_BINDING_MODES as NUMA_BINDING_MODES
    from detlaunch.planning.cpu_binding import cpu_sets as cpu_sets
    from detlaunch.planning.discovery import given_hosts as given_hosts
    from detlaunch.planning.doctor import Check as Check
    from detlaunch.planning.gpus import cuda_visible_devices as cuda_visible_devices
    from detlaunch.planning.hookspecs import hookimpl as hookimpl
    from detlaunch.planning.preflight import PreflightCheck as PreflightCheck
    from detlaunch.planning.preflight import PreflightFigure as PreflightFigure
    from detlaunch.planning.preflight import PreflightPeer as PreflightPeer
    from detlaunch.planning.spawn import NodeLaunch as NodeLaunch
    from detlaunch.planning.spawn import Spawner as Spawner
    from detlaunch.planning.spawn import SpawnRequest as SpawnRequest
    from detlaunch.planning.stage import Command as Command
    from detlaunch.planning.stage import RankWrapper as RankWrapper
    from detlaunch.planning.stage import Stage as Stage
    from detlaunch.planning.stage import StageContext as StageContext
    from detlaunch.progress import progress as progress
    from detlaunch.progress import section as section
    from detlaunch.system.ports import check_port_free as check_port_free

# Exported here before they moved to detlaunch.ssh: still found, with a warning, for one more release.
_MOVED = {name: "ssh" for name in ("SshLayout", "SshParts", "add_ssh_options", "sshd_parts", "ssh_client_parts")}

__getattr__, __dir__ = lazy_attributes(__name__, globals(), _EXPORTS, moved=_MOVED)
