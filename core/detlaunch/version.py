"""detlaunch's version, in a module of its own: ``import detlaunch`` and the spawned nodes' check read it
without importing anything else (every node of a --spawn job must run the spawning command's)."""

__version__ = "0.1.0"
