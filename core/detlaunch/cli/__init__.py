"""The command line: `detlaunch` and its subcommands (`main.py`), a shell's questions to a
running job, `detlaunch status` and `detlaunch stacks` (`control.py`), and a job's page from its
event logs, `detlaunch report` (`report.py`).

May import every other part. Kept empty, so that ``python -m detlaunch status`` imports only
`control.py`, not `main.py`'s options, plugins and supervisor.
"""
