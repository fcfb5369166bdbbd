"""This node's part planned again when the job's membership moved: a spare in a lost node's place, at another
address, or a job that shrank or grew (planning/membership.py says which places run, and where).

A layer whose launcher lists every node (horovod's -H, deepspeed's hostfile) must list the spare, not the host
it replaced. It happens at an attempt's start (the supervisor's start_attempt) and, on the chief, when a spare
took a node's place before any launcher of the attempt started (a node on an excluded host that never came, or
one the preflight sent away: node/link_events.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from detlaunch.link import places
from detlaunch.link.chief import ChiefLink
from detlaunch.link.worker import WorkerLink
from detlaunch.node.stage_files import StageFiles
from detlaunch.planning import membership
from detlaunch.planning.cluster import ClusterInfo
from detlaunch.planning.plan import LaunchPlan


class ReplanHost(Protocol):
    plan: LaunchPlan
    env: dict[str, str]
    base: ClusterInfo  # the job's places at the start
    files: StageFiles
    replan: Callable[[ClusterInfo], LaunchPlan] | None

    @property
    def link(self) -> ChiefLink | WorkerLink | None: ...

    def trace(self, message: str) -> None: ...


def follow(host: ReplanHost) -> bool:
    """The host's plan, environment and stage files for the membership its link knows now; True if they changed."""
    moved = replanned(host.plan, host.base, host.link, host.replan, host.trace)
    if moved is None:
        return False
    host.plan, host.env = moved, moved.process_env()
    host.files.rewrite(moved.stage)
    return True


def replanned(plan: LaunchPlan, base: ClusterInfo, link: ChiefLink | WorkerLink | None,
              replan: Callable[[ClusterInfo], LaunchPlan] | None, trace: Callable[[str], None]) -> LaunchPlan | None:
    """This node's part planned again for the next attempt's cluster (planning/membership.py), or None if it
    is the same: the chief's when a node joined from another address (a spare in a lost node's place: its
    layer's launcher lists every node) or the places changed; a worker's when the chief's "go" named other
    places (the job shrank or grew: its node rank, the world size)."""
    if replan is None or link is None:
        return None
    if isinstance(link, ChiefLink):
        cluster = membership.cluster_of(base, places.members(link), 0, link.addrs)
    elif link.members is not None and link.node in link.members:
        cluster = membership.cluster_of(base, link.members, link.node)
    else:
        return None
    if cluster == plan.cluster:
        return None
    trace(f"this attempt's nodes: {', '.join(a or '?' for a in cluster.node_addrs)} (this one node "
          f"{cluster.node_rank}): planning this node's part again")
    return replan(cluster)
