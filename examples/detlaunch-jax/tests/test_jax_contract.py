"""The whole detlaunch layer contract, against this layer: `pytest` in this folder runs it."""

from detlaunch.testing import LayerContract


class TestJax(LayerContract):
    layer = "jax"
