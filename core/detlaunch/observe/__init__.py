"""What anyone can see of a job: events, status, the console and the end-of-job report.

Owns the typed event stream and its log (`events.py`), the one door every event goes through
(`emitter.py`), what `detlaunch status` shows (`status.py`) and the samples behind it
(`sampler.py`), the folding console (`dedupe.py`, `console.py`), the report printed at the end
(`report.py`: the root cause, and each attempt's end), how a set of ranks is written
(`rank_sets.py`), and a job's story from its event logs, as a page or a trace (`story_*.py`: read, model,
lanes, html, trace; `story_details.py`, what the events carry for it). Watching is a side channel: nothing
here can stop a job.

May import: `rank`, `system`, and the top-level `errors`, `numbers`, `exit_codes`, `tracebacks`, `native_errors`,
`outcome`.
"""
