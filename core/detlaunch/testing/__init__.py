"""Test support shipped with detlaunch, for layer and plugin authors.

- :class:`LayerContract`: the layer contract suite. Three lines run it against your layer::

      from detlaunch.testing import LayerContract

      class TestMyLayer(LayerContract):
          layer = "mylayer"

- :class:`DetlaunchRunner`: runs the real ``detlaunch`` command and finds any process a job
  left behind (the ``detlaunch_runner`` fixture hands you one).

pytest loads :mod:`detlaunch.testing.pytest_plugin` through the ``pytest11`` entry point,
so the fixtures exist in any project that has detlaunch installed. Attributes load on first
use: importing this package (pytest does, for every run) costs almost nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "LayerContract": "contract",
    "Capabilities": "contract",
    "DEFAULT_HEAVY_MODULES": "contract",
    "SHAPES": "contract",
    "DetlaunchRunner": "runner",
    "Completed": "runner",
    "Running": "runner",
    "processes_with_marker": "runner",
}
__all__ = [
    "LayerContract",
    "Capabilities",
    "DEFAULT_HEAVY_MODULES",
    "SHAPES",
    "DetlaunchRunner",
    "Completed",
    "Running",
    "processes_with_marker",
]
assert set(__all__) == set(_EXPORTS)

if TYPE_CHECKING:
    from .contract import DEFAULT_HEAVY_MODULES, SHAPES, Capabilities, LayerContract
    from .runner import Completed, DetlaunchRunner, Running, processes_with_marker


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'detlaunch.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
