"""Job-wide restarts, as pure decisions: nothing here starts, stops or waits for anything.

Owns what ended an attempt and whether the job starts another (`policy.py`), and one job's
attempts as the supervisor counts them (`attempts.py`). Unit-tested in milliseconds with
scripted histories.

May import: the top-level `errors`, `numbers`, `outcome` (and `rank.protocol`'s constants).
"""
