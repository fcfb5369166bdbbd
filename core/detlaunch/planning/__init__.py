"""From the command line to this node's plan: nothing here starts a process.

Owns the options (`config.py`), the plugins and the typed facade over their hooks
(`plugin_manager.py`, `hookspecs.py`), what a layer returns (`stage.py`), the cluster and how it is
discovered (`cluster.py`, `discovery.py`, `providers/`; a node's GPUs, `gpus.py`; addresses the other
machines reach, `addresses.py`), the plan and its dry-run rendering (`plan.py`), the variables every rank
gets unless set (`rank_defaults.py`: torchrun's NCCL error handling, a persistent compile cache), whether
the ranks are warm (`warm_ranks.py`) and
`detlaunch doctor`'s checks (`doctor.py`).

May import: `rank`, `system`, `observe`, `restarts` and the top-level `errors`, `numbers`,
`outcome`, `launcher_flags`. Never `link`, `node` or `cli`.
"""
