"""Every rank's Python stack: taken, grouped, and asked for.

Owns py-spy dumps of many pids within a budget (`pyspy.py`, with the faulthandler fallback of
`rank/faultdump.py`), the grouping and the suspects (`groups.py`, pure), what torch's Flight Recorder
says of the ranks' collectives (`flight.py`, pure; asked through `rank/flightrec.py`) and taking them
off the event loop, a node's answer and the job's (`query.py`).

May import: `rank`, `system`, and the top-level modules below `outcome`.
"""
