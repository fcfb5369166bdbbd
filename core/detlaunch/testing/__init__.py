"""Test support shipped with detlaunch: the layer contract suite (see LayerContract)."""
