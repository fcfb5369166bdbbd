"""Print this rank's ancestors' command lines, one JSON list per line, nearest first (to see who started it)."""

import json
import os

pid = os.getppid()
while pid > 1:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    print(json.dumps(argv), flush=True)
    with open(f"/proc/{pid}/stat") as f:
        pid = int(f.read().rsplit(")", 1)[1].split()[1])
