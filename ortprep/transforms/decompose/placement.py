"""The real session's placement of a model on an EP that runs here (QNN's HTP simulator, OpenVINO's
CPU device): nodes on the EP, partitions and copies counted the way check counts them, and the op
types left on the CPU. What `convert --rewrite-for` reports before and after, as the proof."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import onnx

from ortprep.eps.partition import CPU, FOLDED, count_copies, partition_graph
from ortprep.eps.registry import EpSpec
from ortprep.graphops import has_unnamed_nodes
from ortprep.runtime.kernels import support_table
from ortprep.runtime.targets import ep_runtime, session_options

TIMEOUT_S = 300.0


def real_placement(path: Path, spec: EpSpec, runtimes: dict[str, Any] | None = None,
                   timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """The session a user's application creates for ``spec`` on ``path`` (no run): status
    ``created`` with the figures, ``unavailable`` where the EP does not run here, else the
    session's failure (``failed``, ``crashed``, ``timeout``) and its message."""
    from ortprep.runtime.requests import Prove
    from ortprep.runtime.worker import call

    target = ep_runtime(spec, runtimes)
    if not target.available:
        where = f"the environment of {target.python}" if target.python else "this environment"
        return {"status": "unavailable", "message": f"{spec.provider} does not run in {where}"}
    graph = onnx.load(str(path), load_external_data=False).graph
    reply = call(Prove(model=os.path.abspath(path), provider=spec.provider, provider_options=session_options(target),
                       plugin=target.plugin, label_unnamed=has_unnamed_nodes(graph)),
                 python=target.python, timeout=timeout)
    if not reply.ok:
        return {"status": reply.status, "message": reply.message}
    default = reply.placement.get("default", {})
    assignment, subgraphs = default.get("assignment", {}), default.get("subgraphs", [])
    labels = [node.name or f"{node.op_type}#{index}" for index, node in enumerate(graph.node)]
    placed = [FOLDED if label not in assignment else 0 if assignment[label] == spec.provider else CPU
              for label in labels]
    if support_table(spec.name).granularity == "kernel":
        partitions = partition_graph(graph, placed).partitions
    else:
        partitions = sum(1 for ep, _ in subgraphs if ep == spec.provider)
    on_cpu = Counter(node.op_type for node, where in zip(graph.node, placed) if where == CPU)
    cpu_nodes = sorted(label for label, where in zip(labels, placed) if where == CPU)
    return {"status": "created", "nodes": len(assignment),
            "nodes_on_ep": sum(1 for ep in assignment.values() if ep == spec.provider),
            "partitions": partitions, "copies": count_copies(graph, placed),
            "cpu_ops": dict(sorted(on_cpu.items())), "cpu_nodes": cpu_nodes}
