"""The EP's view of a graph: groups of supported nodes, fallbacks, and copies between devices.

ORT hands an EP the nodes it claims and groups them into partitions with a topological walk
(onnxruntime/core/providers/partitioning_utils.cc, CreateSupportedPartitionNodeGroups). This
module follows the same rule, one walk per EP (linear in nodes and edges).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from onnx import GraphProto

from ortprep.model import subgraphs_of

CPU = -1  # assignment value of a node that runs on the CPU EP
FOLDED = -2  # a Constant node: ORT turns it into an initializer, no EP runs it


@dataclass
class PartitionResult:
    partitions: int  # groups of EP nodes (summed over the graph and its subgraphs)
    copies: int  # distinct tensors that cross between an EP node and a CPU node
    partition_of: list[int]  # per node: partition id, or -1 (CPU or folded)


@dataclass(frozen=True)
class _Topology:
    """A graph's node inputs and outputs as Python tuples: protobuf's repeated fields cost a call
    per read, and check walks a graph's edges several times per EP (a 100,000-node model)."""

    graph: GraphProto  # held so that the id the cache is keyed by stays this graph's
    inputs: list[tuple[str, ...]]
    outputs: list[tuple[str, ...]]
    producers: dict[str, int]
    names: list[str]  # node_names(graph)
    ops: list[str]
    topological: bool  # every node comes after the producers of its inputs


# Graphs read while a reader that does not change them holds cached_topologies() (check);
# None: no cache, each call reads the graph afresh (a transform may have changed it).
_TOPOLOGIES: dict[int, _Topology] | None = None


@contextmanager
def cached_topologies() -> Iterator[None]:
    """Within this block, each graph's edges are read once (the graphs must not change in it)."""
    global _TOPOLOGIES
    outer = _TOPOLOGIES
    _TOPOLOGIES = {} if outer is None else outer
    try:
        yield
    finally:
        _TOPOLOGIES = outer


def _topology(graph: GraphProto) -> _Topology:
    cache = _TOPOLOGIES
    found = cache.get(id(graph)) if cache is not None else None
    if found is not None and found.graph is graph:
        return found
    inputs = [tuple(node.input) for node in graph.node]
    outputs = [tuple(node.output) for node in graph.node]
    producers = {name: index for index, names in enumerate(outputs) for name in names if name}
    ops = [node.op_type for node in graph.node]
    labels = [node.name or f"{op}#{i}" for i, (node, op) in enumerate(zip(graph.node, ops))]
    topological = all(producers.get(name, -1) < index for index, names in enumerate(inputs) for name in names)
    found = _Topology(graph, inputs, outputs, producers, labels, ops, topological)
    if cache is not None:
        cache[id(graph)] = found
    return found


def _producers(graph: GraphProto) -> dict[str, int]:
    return _topology(graph).producers


def partition_graph(graph: GraphProto, assignment: list[int]) -> PartitionResult:
    """Group EP nodes of one graph (not its subgraphs) into partitions, as ORT's partitioner does.

    ``assignment[i]`` is the index of the EP that takes node i (its position in the session's
    priority list), CPU or FOLDED. For each EP, nodes are visited in a topological order; a node
    the EP takes joins the open group, and a node it does not take is visited at once unless it
    consumes an output of the group (then it waits for the next group). The group closes only when
    nothing but such waiting nodes is left. So independent EP nodes (the DequantizeLinear of every
    weight in a QDQ model, a CPU Q node on a graph input) never split a partition, and a new
    partition starts only where the way on passes through a node the EP does not take.
    """
    eps = sorted({a for a in assignment if a >= 0})
    if not eps or (len(eps) == 1 and CPU not in assignment and _topology(graph).topological):
        # No EP node, or one EP takes every node of a graph in topological order: the walk would
        # visit every node and never close the group (no node waits for a next one), so its
        # answer is known without it (0.5 s of a 100,000-node check).
        partitions, partition_of = len(eps), [0 if a >= 0 else -1 for a in assignment]
    else:
        partitions, partition_of = _walk(graph, assignment, eps)
    return PartitionResult(partitions=partitions, copies=count_copies(graph, assignment), partition_of=partition_of)


def _walk(graph: GraphProto, assignment: list[int], eps: list[int]) -> tuple[int, list[int]]:
    """partition_graph's walk, EP by EP: (partitions, partition of each node)."""
    consumers, pending = _edges(graph, assignment)
    partition_of = [-1] * len(graph.node)
    partitions = 0
    for ep in eps:
        waiting = list(pending)
        ready = deque(i for i, a in enumerate(assignment) if a != FOLDED and waiting[i] == 0)
        next_group: deque[int] = deque()
        border: set[int] = set()
        group_size = 0
        while ready or next_group:
            if not ready:
                group_size = 0  # only nodes that need the group's outputs are left: close it
                border.clear()
                ready, next_group = next_group, deque()
                continue
            index = ready.popleft()
            taken = assignment[index] == ep
            if not taken and index in border:
                next_group.append(index)
                continue
            if taken:
                if group_size == 0:
                    partitions += 1
                group_size += 1
                partition_of[index] = partitions - 1
                border.discard(index)
            for consumer in consumers[index]:
                if taken:
                    border.add(consumer)
                waiting[consumer] -= 1
                if waiting[consumer] == 0:
                    ready.append(consumer)
    return partitions, partition_of


def _edges(graph: GraphProto, assignment: list[int]) -> tuple[list[list[int]], list[int]]:
    """Consumers of each node, and how many producer nodes each node waits for (folded
    constants, graph inputs, initializers and outer-scope values are there from the start)."""
    topology = _topology(graph)
    produced_by = topology.producers
    consumers: list[list[int]] = [[] for _ in topology.inputs]
    pending = [0] * len(topology.inputs)
    for index, names in enumerate(topology.inputs):
        if assignment[index] == FOLDED:
            continue
        for producer in {produced_by[name] for name in names if name in produced_by}:
            if assignment[producer] != FOLDED and producer != index:
                consumers[producer].append(index)
                pending[index] += 1
    return consumers, pending


def count_copies(graph: GraphProto, assignment: list[int]) -> int:
    """Tensors produced on one device and consumed on another (each is one copy per run).

    Graph inputs consumed by an EP node and graph outputs produced by one count too: for a
    device EP they are copied between host and device memory.
    """
    topology = _topology(graph)
    produced_by = topology.producers
    initializers = {t.name for t in graph.initializer}
    graph_inputs = {value.name for value in graph.input} - initializers
    crossings: set[tuple[str, int]] = set()
    for index, names in enumerate(topology.inputs):
        if assignment[index] == FOLDED:
            continue
        for name in names:
            if not name or name in initializers:
                continue
            producer = produced_by.get(name)
            if producer is not None and assignment[producer] == FOLDED:
                continue
            source = assignment[producer] if producer is not None else CPU
            if producer is None and name not in graph_inputs:
                continue  # outer-scope value of a subgraph: counted where it is produced
            if source != assignment[index]:
                crossings.add((name, assignment[index]))
    for value in graph.output:
        producer = produced_by.get(value.name)
        if producer is not None and assignment[producer] >= 0:
            crossings.add((value.name, CPU))
    return len(crossings)


def node_names(graph: GraphProto) -> list[str]:
    """Each node's name, or OP#INDEX for an unnamed one (how reports name nodes)."""
    return list(_topology(graph).names)


def _links(graph: GraphProto) -> tuple[list[list[int]], list[list[int]]]:
    topology = _topology(graph)
    producers = topology.producers
    parents = [sorted({producers[x] for x in names if x in producers}) for names in topology.inputs]
    children: list[list[int]] = [[] for _ in topology.inputs]
    for child, ps in enumerate(parents):
        for parent in ps:
            children[parent].append(child)
    return parents, children


def cpu_islands(graph: GraphProto, fallback: list[str] | set[str]) -> list[str]:
    """Fallback nodes with a node on the EP both before and after them (a round trip EP -> CPU ->
    EP). Two linear walks over the node order, which the checker guarantees is topological."""
    if not fallback:
        return []  # no fallback, no island: the walks cost about 0.5 s on 100,000 nodes
    topology = _topology(graph)
    names = topology.names
    on_cpu = set(fallback)
    parents, children = _links(graph)
    on_ep = [name not in on_cpu and op != "Constant" for name, op in zip(names, topology.ops)]
    ep_above = [False] * len(names)
    for i in range(len(names)):
        ep_above[i] = any(on_ep[p] or ep_above[p] for p in parents[i])
    ep_below = [False] * len(names)
    for i in reversed(range(len(names))):
        ep_below[i] = any(on_ep[c] or ep_below[c] for c in children[i])
    return [names[i] for i in range(len(names)) if names[i] in on_cpu and ep_above[i] and ep_below[i]]


def partition_groups(graph: GraphProto, fallback: list[str] | set[str]) -> list[list[str]]:
    """The names of the nodes in each EP partition of the main graph, grouped as ORT's partitioner
    groups them (the rule ``partition_graph`` counts with)."""
    names = node_names(graph)
    on_cpu = set(fallback)
    assignment = [FOLDED if node.op_type == "Constant" else (CPU if name in on_cpu else 0)
                  for name, node in zip(names, graph.node)]
    groups: dict[int, list[str]] = {}
    for name, group in zip(names, partition_graph(graph, assignment).partition_of):
        if group >= 0:
            groups.setdefault(group, []).append(name)
    return [groups[key] for key in sorted(groups)]


def graph_view(graph: GraphProto, scope: str = "") -> dict:
    """What a drawing of the graph needs, as plain data: the nodes (name, op type) in order and
    the edges between them (producer index, consumer index); a node that holds graphs (If
    branches, Loop/Scan bodies) has ``bodies``: [{"attribute", "nodes", "edges"}], its nodes named
    as check's findings name them (an unnamed one OP#INDEX@SCOPE)."""
    parents, _children = _links(graph)
    nodes = []
    for index, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}#{index}" + (f"@{scope}" if scope else "")
        entry: dict = {"name": name, "op_type": node.op_type}
        bodies = [{"attribute": attribute, **graph_view(body, f"{scope}/{name}.{attribute}")}
                  for attribute, body in subgraphs_of(node)]
        if bodies:
            entry["bodies"] = bodies
        nodes.append(entry)
    return {"nodes": nodes, "edges": [[parent, child] for child, ps in enumerate(parents) for parent in ps]}
