"""Writes a stream to stdout as fast as Python can, for the throughput benchmark.

    emit.py lines N      N lines of 100 bytes (buffering as the environment says: PYTHONUNBUFFERED)
    emit.py progress N   N tqdm-style updates of 100 bytes, each starting with "\\r" and flushed
                         (as tqdm does), then one "\\n"
"""

import sys

mode, count = sys.argv[1], int(sys.argv[2])
write = sys.stdout.write
if mode == "lines":
    pad = "x" * 89
    for i in range(count):
        write(f"{i:09d} {pad}\n")  # 9 + 1 + 89 + 1 = 100 bytes
elif mode == "progress":
    flush = sys.stdout.flush
    for i in range(count):
        pct = 100 * i // count
        bar = ("#" * (pct // 4)).ljust(25)
        write(f"\rtraining {pct:3d}%|{bar}| {i:9d}/{count:9d} [00:42<01:17, 4711.08it/s, loss=0.123]")
        flush()
    write("\n")
else:
    sys.exit(f"unknown mode {mode}")
