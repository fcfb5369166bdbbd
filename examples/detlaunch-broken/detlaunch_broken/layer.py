"""Raises on import, on purpose: detlaunch must report it and go on with every other layer.

Importing it leaves a trace when DETLAUNCH_BROKEN_IMPORT_LOG names a file (one line per import),
so a test can prove that DETLAUNCH_DISABLE_PLUGINS=broken keeps it from being imported at all.
"""

import os

_log = os.environ.get("DETLAUNCH_BROKEN_IMPORT_LOG")
if _log:
    with open(_log, "a") as f:
        f.write(f"imported by pid {os.getpid()}\n")

raise RuntimeError("detlaunch-broken fails to import on purpose (examples/detlaunch-broken)")
