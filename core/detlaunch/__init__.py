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

from ._lazy import lazy_attributes

__version__ = "0.1.0"

_EXPORTS = {
    "hookimpl": "hookspecs",
    "ClusterInfo": "cluster",
    "Config": "config",
    "Number": "config",
    "StageContext": "stage",
    "Stage": "stage",
    "Command": "stage",
    "RankWrapper": "stage",
    "JobResult": "report",
    "RankStatus": "report",
    "Failure": "report",
    "DetlaunchError": "errors",
    "ConfigError": "errors",
    "ClusterError": "errors",
    "LaunchError": "errors",
    "check_port_free": "netutil",
    "Check": "doctor",
    "Event": "events",
    "EventKind": "events",
    "progress": "progress",
}
__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # `X as X`: an explicit re-export, for type checkers
    from .cluster import ClusterInfo as ClusterInfo
    from .config import Config as Config
    from .config import Number as Number
    from .doctor import Check as Check
    from .errors import ClusterError as ClusterError
    from .errors import ConfigError as ConfigError
    from .errors import DetlaunchError as DetlaunchError
    from .errors import LaunchError as LaunchError
    from .events import Event as Event
    from .events import EventKind as EventKind
    from .hookspecs import hookimpl as hookimpl
    from .netutil import check_port_free as check_port_free
    from .progress import progress as progress
    from .report import Failure as Failure
    from .report import JobResult as JobResult
    from .report import RankStatus as RankStatus
    from .stage import Command as Command
    from .stage import RankWrapper as RankWrapper
    from .stage import Stage as Stage
    from .stage import StageContext as StageContext

# Exported here before they moved to detlaunch.ssh: still found, with a warning, for one more release.
_MOVED = {name: "ssh" for name in ("SshLayout", "SshParts", "add_ssh_options", "sshd_parts", "ssh_client_parts")}

__getattr__, __dir__ = lazy_attributes(__name__, globals(), _EXPORTS, moved=_MOVED)
