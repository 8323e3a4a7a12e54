"""Small graph utilities that understand subgraphs (If/Loop/Scan bodies read outer-scope values)."""

from __future__ import annotations

import heapq

from onnx import GraphProto, NodeProto

from ortprep.model import subgraphs_of


def outer_scope_names(graph: GraphProto) -> set[str]:
    """Names a subgraph reads without defining them (inputs, initializers or node outputs)."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(name for name in node.input if name)
        for _, sub in subgraphs_of(node):
            used |= outer_scope_names(sub)
        defined.update(node.output)
    return used - defined


def node_dependencies(node: NodeProto) -> set[str]:
    deps = {name for name in node.input if name}
    for _, sub in subgraphs_of(node):
        deps |= outer_scope_names(sub)
    return deps


def topological_sort(graph: GraphProto) -> bool:
    """Order nodes so each comes after what it reads, subgraph reads included; keeps the original
    order where it is free. Returns True when the order changed. Recurses into subgraphs."""
    changed = False
    for node in graph.node:
        for _, sub in subgraphs_of(node):
            changed |= topological_sort(sub)
    nodes = list(graph.node)
    producer = {out: index for index, node in enumerate(nodes) for out in node.output if out}
    waiting_on = [0] * len(nodes)
    dependents: dict[int, list[int]] = {}
    for index, node in enumerate(nodes):
        parents = {producer[name] for name in node_dependencies(node) if name in producer and producer[name] != index}
        waiting_on[index] = len(parents)
        for parent in parents:
            dependents.setdefault(parent, []).append(index)
    ready = [index for index, count in enumerate(waiting_on) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for child in dependents.get(index, []):
            waiting_on[child] -= 1
            if waiting_on[child] == 0:
                heapq.heappush(ready, child)
    if len(order) != len(nodes):
        return changed  # a cycle: leave it for the checker to report
    if order != list(range(len(nodes))):
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)
        return True
    return changed
