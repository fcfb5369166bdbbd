"""Job-wide restarts, as pure decisions: nothing here starts, stops or waits for anything.

Owns what ended an attempt, as the policy reads it (`classify.py`: its RestartClass, derived from
the root cause's FailureKind, and its crash-loop signature), whether the job starts another
(`policy.py`), the options that make a policy (`options.py`), what differs from one attempt to the
next for the ranks (`per_attempt.py`: their restart count, their log folder) and one job's attempts
as the supervisor counts them (`attempts.py`). The attempts' lines in the end report are the
report's (observe/report.py). Unit-tested in milliseconds with scripted histories.

May import: the top-level `errors`, `numbers`, `exit_codes`, `tracebacks`, `native_errors`, `outcome`, and
`observe.report`.
"""
