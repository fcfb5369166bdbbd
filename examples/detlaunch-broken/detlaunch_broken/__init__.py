"""A detlaunch layer that fails to import, on purpose (see layer.py)."""
