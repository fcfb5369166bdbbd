"""Cluster discovery where users run: one provider per scheduler, each its own always-on plugin.

Every provider implements ``detlaunch_discover_cluster(config)`` (a firstresult hook) and
is registered through the ``detlaunch.plugins`` entry point group, exactly as a third
party would add LSF or PBS. A provider answers only when its own variables are present
(or when ``--cluster NAME`` names it), and returns None otherwise.

Order, first answer wins (docs/DISCOVERY.md says the same for users):

1. ``static`` (tryfirst, core): ``--hosts``/``--hostfile``, or torchrun-style
   ``--nnodes``/``--node-rank``/``--master-addr``. What the user typed describes the
   whole cluster; no scheduler variable is merged into it.
2. Schedulers, most specific first: ``determined`` (its cluster info file), ``slurm``
   (``SLURM_JOB_ID``), ``kubernetes`` (``MASTER_ADDR`` + ``NNODES``/``WORLD_SIZE``...).
   Determined can run inside SLURM or Kubernetes, and SLURM users often export
   ``MASTER_ADDR``/``WORLD_SIZE`` for torch, so a later one defers to an earlier one whose
   variables are present. That rule lives in `precedence.py` (:data:`SCHEDULERS`, with the
   variables each scheduler is recognised by), not in pluggy's registration order, which
   follows entry point names.
3. ``local`` (trylast, core): this machine alone.

A detlaunch started inside another launch layer's job (``DET_CHIEF_IP`` is set, as
every layer exports it) is nested: the scheduler variables it sees were inherited from
the outer job (a torchrun rank has ``MASTER_ADDR``/``WORLD_SIZE``, a SLURM task its
``SLURM_*``), so no scheduler answers unless forced, and local trusts ``DET_CHIEF_IP``.

Precedence when sources disagree: ``--cluster NAME`` forces one provider (and a host
flag given with it is an error, not silently ignored); inside a scheduler provider, a flag
beats the scheduler's variable for what the flag names (``--nproc-per-node`` for slots,
``--job-id``/``DETLAUNCH_JOB_ID`` for the job id, ``--node-addr`` for this node's
address), and ``ClusterInfo.sources`` says which one won.
"""
