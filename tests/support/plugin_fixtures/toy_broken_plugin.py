"""An always-on plugin that cannot be imported; importing it leaves a line in TOY_BROKEN_PLUGIN_LOG."""

import os

if os.environ.get("TOY_BROKEN_PLUGIN_LOG"):
    with open(os.environ["TOY_BROKEN_PLUGIN_LOG"], "a") as f:
        f.write("imported\n")

raise ImportError("toy_broken_plugin cannot be imported, on purpose")
