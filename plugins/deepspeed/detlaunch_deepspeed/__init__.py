"""The deepspeed layer for detlaunch (entry point ``detlaunch.layers: deepspeed``)."""
