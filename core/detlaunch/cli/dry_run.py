"""--dry-run: what this node would run, nothing started; or, given a host list and no --node-rank, every node.

A node's detlaunch needs its --node-rank to know its part; a dry run without one, of a job whose --hosts or
--hostfile lists several hosts, shows the whole job instead: each node's plan in turn (the chief's, with
the launcher's host list and what every host runs; then each worker's and spare's), as the detlaunch
started with that --node-rank (or by --spawn) would print it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from detlaunch.planning.discovery import given_hosts

if TYPE_CHECKING:
    from detlaunch.planning.cluster import ClusterInfo
    from detlaunch.planning.config import Config
    from detlaunch.planning.plan import LaunchPlan

PlanNode = Callable[["Config"], tuple["ClusterInfo", "int | None", "LaunchPlan"]]


def every_node(config: Config) -> tuple[int, str] | None:
    """(the number of hosts, the flag that lists them) when the dry run shows every node; None: this node only."""
    o = config.options
    if o.get("node_rank") is not None or o.get("spawn"):
        return None
    hosts = given_hosts(o)
    return (len(hosts[0]), hosts[1]) if hosts is not None and len(hosts[0]) > 1 else None


def dry_run(config: Config, plan_node: PlanNode) -> int:
    as_json = config.options.get("format") == "json"
    whole = every_node(config)
    if whole is None:
        shown = _one(config, plan_node, as_json)
        print(json.dumps(shown, indent=2, sort_keys=True) if as_json else shown)
        return 0
    count, flag = whole
    nodes = [_one(dataclasses.replace(config, options={**config.options, "node_rank": rank}), plan_node, as_json)
             for rank in range(count)]
    if as_json:
        print(json.dumps(nodes, indent=2, sort_keys=True))
        return 0
    print(f"every node of {flag} ({count} hosts), as each node's detlaunch would run it with --node-rank N "
          "(--spawn ssh starts them all from one command):")
    for text in nodes:
        print(f"\n{text}")
    return 0


def _one(config: Config, plan_node: PlanNode, as_json: bool) -> object:
    """One node's plan: its JSON object, or its text (a spare's says so first)."""
    from detlaunch.planning.plan import render_text

    everyone, spare, plan = plan_node(config)
    if as_json:
        return plan.to_json()
    text = render_text(plan)
    if spare is not None:
        text = (f"spare node {spare} ({everyone.node_addr or 'this host'}): runs no rank until it takes a lost "
                f"node's place; as node {plan.cluster.node_rank} it would run:\n{text}")
    return text
