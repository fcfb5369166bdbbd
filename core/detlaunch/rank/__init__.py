"""The rank's side: the per-rank wrapper and everything it imports.

Owns the wrapper (`wrapper.py`, started as ``python -S run_wrapper.py`` in front of every rank, and
its parts: `options.py`, `connection.py`, `output.py`, `wrapped_rank.py`, `stopping.py`), the messages
it sends its node's supervisor (`protocol.py`), the heartbeat file a rank writes (`progress.py`, public as
``detlaunch.progress``), the faulthandler fallback a rank is started with (`faultdump.py`,
`faultsite/`), torch's Flight Recorder, asked through a FIFO (`flightrec.py`), and warm ranks: the
node's rank template (`template.py`, a script of its own) and the wrapper's request to it (`warm.py`).

May import: the standard library only, and only what the wrapper can afford (it runs once per
rank: no typing, dataclasses, json or re at run time). Nothing else of detlaunch: every other part
may import this one. When run as a script, these modules import each other by file.
"""
