"""detlaunch: launch layers for distributed training.

This module is the public API, and the only thing a layer or plugin may import:
the built-in layers use nothing else, exactly as a third party would.

Attributes load on first use, so that ``import detlaunch`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "hookimpl": "hookspecs",
    "ClusterInfo": "cluster",
    "Config": "config",
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
    "SshLayout": "ssh",
    "SshParts": "ssh",
    "add_ssh_options": "ssh",
    "sshd_parts": "ssh",
    "ssh_client_parts": "ssh",
    "progress": "progress",
}

__all__ = [
    "__version__",
    "hookimpl",
    "ClusterInfo",
    "Config",
    "StageContext",
    "Stage",
    "Command",
    "RankWrapper",
    "JobResult",
    "RankStatus",
    "Failure",
    "DetlaunchError",
    "ConfigError",
    "ClusterError",
    "LaunchError",
    "check_port_free",
    "SshLayout",
    "SshParts",
    "add_ssh_options",
    "sshd_parts",
    "ssh_client_parts",
    "progress",
]
assert set(__all__) == {"__version__", *_EXPORTS}

if TYPE_CHECKING:
    from .cluster import ClusterInfo
    from .config import Config
    from .errors import ClusterError, ConfigError, DetlaunchError, LaunchError
    from .hookspecs import hookimpl
    from .netutil import check_port_free
    from .progress import progress
    from .report import Failure, JobResult, RankStatus
    from .ssh import SshLayout, SshParts, add_ssh_options, ssh_client_parts, sshd_parts
    from .stage import Command, RankWrapper, Stage, StageContext


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'detlaunch' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
