"""A rank that prints what a script can learn from its launcher: its environment, argv and cwd, as JSON."""

import json
import os
import sys

seen = {"env": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd()}
print("SEEN " + json.dumps(seen, sort_keys=True), flush=True)
