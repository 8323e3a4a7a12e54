"""Ops the QNN EP takes only as part of a pattern it fuses into one QNN op, though its op table
(and a session of the op alone) refuses them: today the Erf of a GELU written out in float,
x * 0.5 * (1 + Erf(x / sqrt(2))), as PyTorch exports it, which QNN's EP builds as one Gelu
(onnxruntime's qnn_node_group/gelu_fusion.cc).

Measured (docs/decisions/docs-qnn-gelu-fusion.md): an Erf alone stays on the CPU EP; in the
pattern's shapes (gelu_shape) QNN takes it in float32 and float16, in a QDQ model (Q/DQ pairs
between) it does not. onnxruntime-qnn 2.7.0
fuses the shape without reading its constants: a Div by 10, or an Add of a tensor, is computed as
a GELU all the same, wrong by up to 25 on an output of scale 11. Such a shape is QNN011.
"""

from __future__ import annotations

import math

import numpy as np

from ortprep.analysis import ModelAnalysis
from ortprep.eps.qnn_rules import qnn_node
from ortprep.eps.verdict import NodeVerdict
from ortprep.eps.tables import SupportLevel
from ortprep.findings import Finding
from ortprep.graphops import Constants

GELU_SOURCE = ("measured with onnxruntime 1.32.0 + onnxruntime-qnn 2.7.0, HTP simulator, 2026-12-07: an Erf alone "
               "stays on the CPU EP, in a GELU's shape QNN's EP takes it as one Gelu "
               "(onnxruntime's core/providers/qnn/builder/qnn_node_group/gelu_fusion.cc)")
# A GELU's constants, and how far QNN's own fusion lets each be (gelu_fusion.cc): x / sqrt(2) (or
# x * 1/sqrt(2)), + 1, * 0.5.
GELU_CONSTANTS = {"divisor": (math.sqrt(2.0), 1e-3), "scale": (1.0 / math.sqrt(2.0), 1e-3), "addend": (1.0, 1e-2),
                  "half": (0.5, 1e-3)}


class _Graph:
    """The main graph's producers, consumers and float constants (initializers and Constant
    nodes: ORT folds the latter into the former before the EP sees the graph)."""

    def __init__(self, analysis: ModelAnalysis) -> None:
        graph = analysis.handle.graph
        self.constants = Constants(graph, fed_are_constant=True)
        self.producer = {out: node for node in graph.node for out in node.output if out}
        self.consumers: dict[str, list] = {}
        for node in graph.node:
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)

    def values(self, name: str) -> np.ndarray | None:
        """A float constant's values (graphops.Constants); None for anything else."""
        value = self.constants.get(name)
        if value is None:
            return None
        return np.asarray(value, np.float64) if value.dtype.kind == "f" and value.size else None

    def child(self, node):
        """The one node that reads ``node``'s output, or None."""
        readers = self.consumers.get(node.output[0], [])
        return readers[0] if len(readers) == 1 else None

    @staticmethod
    def other(node, besides: str) -> str | None:
        others = [n for n in node.input[:2] if n != besides]
        return others[0] if len(others) == 1 else None


def gelu_shape(graph: _Graph, erf) -> dict | None:
    """Where ``erf`` sits in a shape QNN's EP fuses into a Gelu: the tensors standing where a GELU
    has its constants (``divisor`` or ``scale``, ``addend``, ``half``) and the pattern's nodes; None
    where it does not. The shapes measured fused on onnxruntime-qnn 2.7.0: Erf(x / sqrt 2) or
    Erf(x * 1/sqrt 2), + 1, then (x * 0.5) * that, x * that * 0.5, or that * 0.5 * x."""
    first = graph.producer.get(erf.input[0])
    if first is None or first.op_type not in ("Div", "Mul") or len(first.input) < 2:
        return None
    root = first.input[0]
    if first.op_type == "Mul" and graph.values(root) is not None:  # the constant first: c * x
        root = first.input[1]
    add = graph.child(erf)
    if add is None or add.op_type != "Add":
        return None
    mul = graph.child(add)
    if mul is None or mul.op_type != "Mul":
        return None
    found = {"divisor" if first.op_type == "Div" else "scale": graph.other(first, root),
             "addend": graph.other(add, erf.output[0])}
    for name in mul.input[:2]:  # root * 0.5 made first, times (1 + erf)
        half = graph.producer.get(name)
        if half is not None and half.op_type == "Mul" and root in half.input[:2]:
            return {**found, "half": graph.other(half, root), "nodes": [first, erf, add, half, mul]}
    if root in mul.input[:2]:  # root * (1 + erf), times 0.5
        last = graph.child(mul)
        if last is None or last.op_type != "Mul":
            return None
        return {**found, "half": graph.other(last, mul.output[0]), "nodes": [first, erf, add, mul, last]}
    last = graph.child(mul)  # (1 + erf) * 0.5, times root
    if last is None or last.op_type != "Mul" or root not in last.input[:2]:
        return None
    return {**found, "half": graph.other(mul, add.output[0]), "nodes": [first, erf, add, mul, last]}


def not_gelu(graph: _Graph, shape: dict) -> list[str]:
    """The places where the shape's inputs are not a GELU's constants, in words."""
    wrong = []
    for place, (value, tolerance) in GELU_CONSTANTS.items():
        if place not in shape:
            continue
        values = graph.values(shape[place]) if shape[place] else None
        if values is None:
            wrong.append(f"the {place} is '{shape[place]}', not a constant")
        elif np.max(np.abs(values - value)) > tolerance:
            wrong.append(f"the {place} is {float(values.reshape(-1)[np.argmax(np.abs(values - value))]):.6g}, "
                         f"not {value:.6g}")
    return wrong


def qnn_fused(analysis: ModelAnalysis, verdicts: list[NodeVerdict], graph_io: tuple) -> list[NodeVerdict]:
    """``verdicts`` (per node of ``analysis.all_nodes()``) with each main-graph Erf in the shape QNN's
    EP fuses into a Gelu taken by QNN (QNN's node rules still apply: a dynamic shape refuses it),
    and QNN011 on it where the shape is not a GELU's. ``graph_io`` as evaluate_node takes it."""
    nodes = analysis.all_nodes()
    erfs = [i for i, node in enumerate(nodes) if node.op_type == "Erf" and node.graph_id == 0
            and not verdicts[i].level.runs_on_ep]
    if not erfs:
        return verdicts
    graph = _Graph(analysis)
    labels = {id(node.node): node.name for node in nodes if node.graph_id == 0}  # OP#INDEX where unnamed
    changed = list(verdicts)
    for position in erfs:
        node = nodes[position]
        shape = gelu_shape(graph, node.node)
        if shape is None:
            continue
        verdict = qnn_node(node, NodeVerdict(SupportLevel.SUPPORTED, "QNN's EP takes it as part of a GELU (x * 0.5 "
                                             "* (1 + Erf(x / sqrt(2))), built as one Gelu)", GELU_SOURCE), *graph_io)
        if not verdict.level.runs_on_ep:
            changed[position] = verdict
            continue
        wrong = not_gelu(graph, shape)
        if wrong:
            verdict.extra.append(Finding.of(
                "QNN011", f"node '{node.name}' (Erf) on qnn: QNN's EP builds "
                f"{', '.join(labels.get(id(n), n.op_type) for n in shape['nodes'])} as one Gelu "
                f"without reading its constants, and this is not a GELU ({'; '.join(wrong)}): QNN computes a GELU "
                "here, not the model", node=node.name, op_type="Erf", ep="qnn", source=GELU_SOURCE,
                fix=f"keep the Erf off QNN, which then computes the rest as written (ortprep convert MODEL "
                    f"--keep-off-ep {node.name} -o OUT), or write the expression in another order"))
        changed[position] = verdict
    return changed
