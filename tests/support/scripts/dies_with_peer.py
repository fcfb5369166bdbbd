"""Rank 0 dies by itself while detlaunch asks for its stack, as a gloo rank does once its peer is gone.

Rank 1 opens the PEER_FIFO for writing (so both are up), then fails (exit 3). Rank 0 reads the FIFO to its
end (rank 1 is gone), then waits for detlaunch's request for its stack (faulthandler's signal 41, which it
blocks: its faulthandler never answers) and aborts instead: a survivor on its way out, the case where a
dump before kill used to wait its whole budget. Run it under a shell (sh -c "python dies_with_peer.py"):
py-spy cannot read the shell, so detlaunch asks the rank's Python through faulthandler.
"""

import os
import signal
import sys

rank = int(os.environ["RANK"])
fifo = os.environ["PEER_FIFO"]
if rank == 1:
    with open(fifo, "wb"):
        print("rank 1 failing", flush=True)
    print("something broke in rank 1", file=sys.stderr, flush=True)
    sys.exit(3)
signal.pthread_sigmask(signal.SIG_BLOCK, {41})
print("rank 0 waiting for its peer", flush=True)
with open(fifo, "rb") as peer:
    peer.read()
print("rank 0: its peer is gone", flush=True)
signal.sigwait({41})  # detlaunch asks for its stack now
os.abort()
