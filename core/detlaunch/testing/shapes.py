"""The cluster shapes the layer contract suite plans for, seen from one node, on loopback addresses."""

from __future__ import annotations

import dataclasses

from detlaunch.planning.cluster import ClusterInfo

CHIEF_ADDR, WORKER_ADDR = "127.0.0.1", "127.0.0.2"


@dataclasses.dataclass(frozen=True)
class Shape:
    """A cluster shape seen from one node: `nodes` x `slots`, this node's rank."""

    nodes: int
    slots: int
    node_rank: int

    @property
    def id(self) -> str:
        return f"{self.nodes}x{self.slots}-{'chief' if self.node_rank == 0 else 'worker'}"

    def cluster(self) -> ClusterInfo:
        addrs = (CHIEF_ADDR, WORKER_ADDR)[: self.nodes]
        return ClusterInfo(node_addrs=addrs, slots=(self.slots,) * self.nodes, node_rank=self.node_rank,
                           chief_addr=CHIEF_ADDR, job_id=f"contract-{self.nodes}x{self.slots}",
                           provider="contract", sources={"nodes": "the contract suite"})


SHAPES = (Shape(1, 1, 0), Shape(1, 8, 0), Shape(2, 8, 0), Shape(2, 8, 1))
