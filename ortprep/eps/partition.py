"""The EP's view of a graph: groups of supported nodes, fallbacks, and copies between devices.

ORT hands an EP the nodes it claims and fuses connected ones into partitions; a group may
not be merged when a path leaves it and comes back (that would make a cycle between the
fused node and the CPU nodes in between). This module reproduces that grouping greedily in
topological order, with bit sets so that it stays linear-ish on graphs of 10,000 nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import GraphProto

CPU = -1  # assignment value of a node that runs on the CPU EP
FOLDED = -2  # a Constant node: ORT turns it into an initializer, no EP runs it


@dataclass
class PartitionResult:
    partitions: int  # groups of EP nodes (summed over the graph and its subgraphs)
    copies: int  # distinct tensors that cross between an EP node and a CPU node
    partition_of: list[int]  # per node: partition id, or -1 (CPU or folded)


def _producers(graph: GraphProto) -> dict[str, int]:
    return {name: index for index, node in enumerate(graph.node) for name in node.output if name}


def partition_graph(graph: GraphProto, assignment: list[int]) -> PartitionResult:
    """Group EP nodes of one graph (not its subgraphs) into partitions.

    ``assignment[i]`` is the index of the EP that takes node i (its position in the session's
    priority list), or CPU. Nodes are expected in topological order, as ONNX requires.
    """
    produced_by = _producers(graph)
    partition_of = [-1] * len(graph.node)
    partition_ep: list[int] = []
    # up[i]: partitions upstream of node i; outside[i]: those reaching i through a node outside them
    up = [0] * len(graph.node)
    outside = [0] * len(graph.node)
    for index, node in enumerate(graph.node):
        direct: list[int] = []
        reach = 0
        through = 0
        if assignment[index] == FOLDED:
            continue
        for name in node.input:
            producer = produced_by.get(name)
            if producer is None or assignment[producer] == FOLDED:
                continue
            own = partition_of[producer]
            own_bit = (1 << own) if own >= 0 else 0
            reach |= up[producer] | own_bit
            through |= outside[producer] | (up[producer] & ~own_bit)
            if own >= 0:
                direct.append(own)
        if assignment[index] >= 0:
            joinable = [p for p in direct if partition_ep[p] == assignment[index] and not (through >> p) & 1]
            if joinable:
                chosen = min(joinable)
            else:
                chosen = len(partition_ep)
                partition_ep.append(assignment[index])
            partition_of[index] = chosen
            # Other direct partitions now reach this node's partition through it.
            through |= reach & ~(1 << chosen)
        up[index] = reach
        outside[index] = through
    return PartitionResult(partitions=len(partition_ep), copies=count_copies(graph, assignment), partition_of=partition_of)


def count_copies(graph: GraphProto, assignment: list[int]) -> int:
    """Tensors produced on one device and consumed on another (each is one copy per run).

    Graph inputs consumed by an EP node and graph outputs produced by one count too: for a
    device EP they are copied between host and device memory.
    """
    produced_by = _producers(graph)
    graph_inputs = {value.name for value in graph.input} - {t.name for t in graph.initializer}
    initializers = {t.name for t in graph.initializer}
    crossings: set[tuple[str, int]] = set()
    for index, node in enumerate(graph.node):
        if assignment[index] == FOLDED:
            continue
        for name in node.input:
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
