"""A launcher-less jax.distributed layer for detlaunch (an example of a third-party layer)."""
