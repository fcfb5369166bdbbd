"""The preflight's check child: runs one round of checks on this node and prints its figures.

Started by the node's detlaunch (node/preflight.py) with the job's environment; it reads what to do
as one JSON object on stdin and prints one JSON line, {"results": [...]} (planning/preflight.Result),
on stdout. It loads the plugins and the layer as ``detlaunch doctor`` does, so every plugin's
``detlaunch_preflight_checks`` (and, in the first round, the layer's ``detlaunch_doctor_checks``)
run here, where importing torch costs the launcher nothing. The built-in checks
(node/preflight_checks.py) are registered through the same hook.

    {"node": 1, "layer": "direct", "options": {...}, "node_checks": true, "doctor": true,
     "group": {"nodes": [0, 1], "addr": "127.0.0.1", "port": 29502} | null, "backend": "gloo", "timeout": 20}
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from detlaunch.planning.preflight import Figure, Peer, PreflightCheck, Result


def run_checks(spec: dict[str, Any], checks: list[PreflightCheck]) -> list[Result]:
    """The round's checks on this node: its node checks, and its pair checks in `spec["group"]`."""
    node = int(spec["node"])
    group = spec.get("group")
    peer = None
    if group:
        nodes = tuple(int(n) for n in group["nodes"])
        peer = Peer(nodes.index(node), len(nodes), str(group["addr"]), int(group["port"]),
                    str(spec.get("backend") or "gloo"), nodes, float(spec.get("timeout") or 30))
    # The pair checks first: forming the pair's group waits for its other nodes, so the node checks that follow
    # start together on every node of the group. Nodes that share a machine (loopback test nodes, one host's
    # detlaunch per GPU set) would otherwise time their compute while the others still import torch, and the
    # first one would look slow. The figures keep the checks' order.
    order = sorted(range(len(checks)), key=lambda i: not checks[i].pairwise)
    ran: dict[int, Result] = {}
    for i in order:
        check = checks[i]
        if check.pairwise and peer is None or not check.pairwise and not spec.get("node_checks"):
            continue
        try:
            figure = check.run(peer if check.pairwise else None)
            if not isinstance(figure, Figure):
                figure = Figure(False, None, f"returned {type(figure).__name__}, not a PreflightFigure")
        except Exception as e:  # noqa: BLE001 - any error is this check's failure on this node
            figure = Figure(False, None, f"{type(e).__name__}: {e}"[:300])
        ran[i] = Result(node, check.name, figure, check.unit, check.compare,
                        peer.nodes if peer is not None and check.pairwise else ())
    return [ran[i] for i in sorted(ran)]


def main() -> int:
    from detlaunch.node import preflight_checks
    from detlaunch.planning.config import Config
    from detlaunch.planning.plugin_manager import PluginSet

    spec = json.loads(sys.stdin.read())
    env = dict(os.environ)
    plugins = PluginSet(env)
    plugins.load_plugins()
    plugins.pm.register(preflight_checks, name="detlaunch.plugins:preflight")
    if spec.get("layer"):
        plugins.load_layer(str(spec["layer"]))
    options = dict(spec.get("options") or {})
    config = Config(layer=str(spec.get("layer") or ""), command=(), launcher_args=(), options=options, env=env)
    hooks = plugins.hooks
    checks, errors = hooks.preflight_checks(config)
    node = int(spec["node"])
    results = run_checks(spec, checks)
    results += [Result(node, "plugins", Figure(False, None, e), compare=False) for e in errors]
    if spec.get("doctor"):  # the layer's own needs (torch, sshd...): a required one failed names the node
        failed = [c for c in hooks.doctor_checks(config) if not c.ok and c.required]
        results.append(Result(node, "doctor", Figure(not failed, None, "; ".join(
            f"{c.name}: {c.detail}" for c in failed)), compare=False))
    print(json.dumps({"results": [r.to_json() for r in results]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
