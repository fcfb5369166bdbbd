"""Test support shipped with detlaunch, for layer and plugin authors.

- :class:`LayerContract`: the layer contract suite. Three lines run it against your layer::

      from detlaunch.testing import LayerContract

      class TestMyLayer(LayerContract):
          layer = "mylayer"

- :class:`SpawnerContract`: the same for a ``--spawn`` spawner (``spawner = "NAME"``).
- :class:`DetlaunchRunner`: runs the real ``detlaunch`` command and finds any process a job
  left behind (the ``detlaunch_runner`` fixture hands you one).
- :func:`free_port`: a port (and its successor) for a test job's ``--master-port``, picked
  below the kernel's ephemeral range so that nothing else is handed it before the job binds it.

pytest loads :mod:`detlaunch.testing.pytest_plugin` through the ``pytest11`` entry point,
so the fixtures exist in any project that has detlaunch installed. Attributes load on first
use: importing this package (pytest does, for every run) costs almost nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from detlaunch._lazy import lazy_attributes

_EXPORTS = {
    "LayerContract": "contract",
    "SpawnerContract": "spawner_contract",
    "Capabilities": "capabilities",
    "DEFAULT_HEAVY_MODULES": "capabilities",
    "SHAPES": "shapes",
    "DetlaunchRunner": "runner",
    "Completed": "runner",
    "Running": "runner",
    "processes_with_marker": "runner",
    "free_port": "ports",
}
__all__ = list(_EXPORTS)

if TYPE_CHECKING:  # `X as X`: an explicit re-export, for type checkers
    from detlaunch.testing.capabilities import DEFAULT_HEAVY_MODULES as DEFAULT_HEAVY_MODULES
    from detlaunch.testing.capabilities import Capabilities as Capabilities
    from detlaunch.testing.contract import LayerContract as LayerContract
    from detlaunch.testing.ports import free_port as free_port
    from detlaunch.testing.runner import Completed as Completed
    from detlaunch.testing.runner import DetlaunchRunner as DetlaunchRunner
    from detlaunch.testing.runner import Running as Running
    from detlaunch.testing.runner import processes_with_marker as processes_with_marker
    from detlaunch.testing.shapes import SHAPES as SHAPES
    from detlaunch.testing.spawner_contract import SpawnerContract as SpawnerContract


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _EXPORTS)
