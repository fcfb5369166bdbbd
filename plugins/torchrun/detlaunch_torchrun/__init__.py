"""The torchrun layer for detlaunch (entry point ``detlaunch.layers: torchrun``)."""
