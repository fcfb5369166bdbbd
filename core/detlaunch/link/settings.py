"""What the job link needs to know of the job, and nothing more (the node's supervisor builds it from the plan)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class LinkSettings:
    job_id: str
    node: int  # this node's rank in the job: 0 is the chief
    num_nodes: int  # the nodes that run ranks (the places); spares are numbered after them
    chief_addr: str
    port: int  # the chief's port for the link (--link-port)
    heartbeat: float  # seconds between heartbeats; a peer silent for HEARTBEAT_MISSES of them is lost
    shared_dir: str  # the job directory every node shares: where the job's secret is, unless in `environ`
    environ: Mapping[str, str]  # the job's environment: DETLAUNCH_JOB_SECRET when the scheduler sets one
    node_addrs: tuple[str, ...] = ()  # each node's address where known (""): how the chief names a node
    node_addr: str | None = None  # this node's own address: a worker dials the chief from it
    bind_any: bool = False  # the chief listens on the wildcard (a job across machines: planning/addresses.py)
    spares: int = 0  # spare nodes (numbered num_nodes..num_nodes+spares-1) the chief admits besides
    secret: str = ""  # a successor chief: the job's secret it already holds (node/succession.py)
    promoted_from: int | None = None  # a spare sent to this node's place: its spare number, said when it joins
