"""One node's part of the job: the supervisor and the parts it drives.

Owns the supervisor, the policy that ties the parts (`supervisor.py`), its state machine
(`phase.py`), the root cause (`verdict.py`, pure), hangs (`hangs.py`, `progress_watch.py`), what
happens between attempts (`attempt_driver.py`, and `release_wait.py`: the last attempt's threads and GPU
memory gone before the next starts), the launchers and daemons it started
(`process_table.py`, `standby.py`), the ranks' wrappers (`rank_registry.py`), the rank template
warm ranks are forked from (`rank_template.py`) and the stage's files (`stage_files.py`).

May import: every part below it (`link`, `planning`, `restarts`, `stacks`, `observe`, `system`,
`rank`) and the top-level modules. Never `cli`.
"""
