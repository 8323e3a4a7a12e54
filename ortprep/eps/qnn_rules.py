"""QNN's node rules, measured on the real EP (onnxruntime-qnn's HTP simulator): what it refuses
although its op table lists the op (static shapes, run-time Clip bounds, graph I/O Q/DQ), where it
puts control flow, and the lone Q/DQ partitions it gives back to the CPU EP. Applied by
rules.evaluate_node and prediction; the measurements: docs/eps.md."""

from __future__ import annotations

from ortprep.analysis import NodeInfo
from ortprep.eps.tables import SupportLevel
from ortprep.eps.verdict import QDQ_OPS, NodeVerdict
from ortprep.findings import Severity

QNN_MEASURED = "measured with onnxruntime 1.32.0 + onnxruntime-qnn 2.7.0, HTP backend (x86 simulator), 2026-11-22"
QNN_CLIP_MEASURED = QNN_MEASURED.replace("2026-11-22", "2026-12-07 (openWakeWord 0.4.0's mel front end)")


def qnn_node(node: NodeInfo, verdict: NodeVerdict, graph_inputs: set[str], graph_outputs: set[str],
             folded: frozenset[str] | set[str] = frozenset()) -> NodeVerdict:
    """What the real QNN EP rejects although its op table lists the op (see docs/eps.md)."""
    if node.graph_id > 0:
        return verdict  # a node of an If's branch goes where its If goes: see qnn_control_flow
    # Every named tensor needs known facts (an output typed as a constant does not count) and
    # every one but an initializer a static shape. One pass: this runs for every node.
    inputs = [v for v in node.inputs if v is not None]
    outputs = [v for v in node.outputs if v is not None and not v.is_initializer]
    named = sum(1 for n in node.node.input if n) + sum(1 for n in node.node.output if n)
    if (len(inputs) + len(outputs) < named or not all(v.static for v in outputs)
            or not all(v.static or v.is_initializer for v in inputs)):
        return NodeVerdict(SupportLevel.UNSUPPORTED_OP, "QNN needs a static shape on every tensor "
                           "(QNN: \"Cannot get shape\")", QNN_MEASURED, "QNN002")
    # a bound ORT folds before partitioning is constant; an initializer listed as an input is not
    if node.op_type == "Clip" and any(
            (v is not None and not v.is_initializer and name not in folded) or name in graph_inputs
            for v, name in zip(node.inputs[1:3], node.node.input[1:3]) if name):
        return NodeVerdict(SupportLevel.UNSUPPORTED_OP, "QNN takes Clip only with constant bounds (QNN: \"QNN doesn't "
                           "support dynamic min/max\")", QNN_CLIP_MEASURED, "QNN010")
    if node.op_type == "QuantizeLinear" and node.node.input[0] in graph_inputs:
        return NodeVerdict(SupportLevel.UNSUPPORTED_OP, "the QuantizeLinear of a graph input stays on the CPU "
                           "unless the QNN option offload_graph_io_quantization is 1", QNN_MEASURED, "QNN003",
                           severity=Severity.INFO)
    if node.op_type == "DequantizeLinear" and node.node.output[0] in graph_outputs:
        return NodeVerdict(SupportLevel.UNSUPPORTED_OP, "the DequantizeLinear of a graph output stays on the CPU "
                           "unless the QNN option offload_graph_io_quantization is 1", QNN_MEASURED, "QNN003",
                           severity=Severity.INFO)
    return verdict


QNN_SESSIONS = ("measured with onnxruntime 1.32.0 + onnxruntime-qnn 2.7.0, HTP simulator, soc_model 60: whole-model "
                "sessions of tools/probe_sessions.py (eps/data/measured/sessions.json), 2026-11-24")
# Measured not taken inside an If's branch although QNN takes them in the main graph (lstm_in_if,
# an If whose branches run an LSTM: the If and its branches stay on the CPU EP).
QNN_NOT_IN_IF = ("LSTM", "GRU", "RNN")


def qnn_control_flow(analysis, verdicts: list[NodeVerdict]) -> list[NodeVerdict]:
    """Where QNN puts control flow, from whole-model sessions (QNN_SESSIONS): an If whose branches
    hold only nodes QNN takes (Relu, Sigmoid/Mul, Conv, Softmax, Tanh measured; with or without
    initializers of their own, reading a graph input or an inner value) goes to QNN whole, with
    its branches; an If whose branches hold a node it does not take, or a recurrent op, stays on
    the CPU EP with them, and so does one whose branches read a value of the outer scope that a
    node off QNN makes (qdq_loop_if: the dequantized output of a Loop). No Loop or Scan is taken
    (four models), nor anything in its body."""
    nodes = analysis.all_nodes()
    by_scope = {graph.scope: graph_id for graph_id, graph in enumerate(analysis.graphs)}
    starts, position = [], 0
    for graph in analysis.graphs:
        starts.append(position)
        position += len(graph.nodes)
    result = list(verdicts)

    def inner(graph_id: int, node: NodeInfo) -> list[int]:
        scope = analysis.graphs[graph_id].scope
        found = []
        for attribute in node.node.attribute:
            child = by_scope.get(f"{scope}/{node.name}.{attribute.name}")
            if child is None:
                continue
            for offset, child_node in enumerate(analysis.graphs[child].nodes):
                found.append(starts[child] + offset)
                if child_node.has_subgraphs:
                    found.extend(inner(child, child_node))
        return found

    producers = {out: i for i, node in enumerate(nodes[:len(analysis.graphs[0].nodes)]) for out in node.node.output
                 if out}
    decided: set[int] = set()
    for index, node in enumerate(nodes):
        if not node.has_subgraphs or index in decided:
            continue
        members = inner(node.graph_id, node)
        if node.op_type == "If" and node.graph_id == 0:
            blockers = sorted({nodes[i].op_type for i in members
                               if nodes[i].op_type in QNN_NOT_IN_IF or nodes[i].op_type in ("Loop", "Scan")
                               or not verdicts[i].level.runs_on_ep})
            # The If's own single-op probes say little (onnx's If cases return constants from their
            # branches); a tensor of the If without a static shape still keeps it off (QNN002).
            own = verdicts[index]
            shared = _shared_branch_names(node.node)
            outside = [name for name in _outer_reads(node.node)
                       if name in producers and not result[producers[name]].level.runs_on_ep]
            if not blockers and own.code != "QNN002" and not shared and not outside:
                taken = NodeVerdict(SupportLevel.SUPPORTED, "QNN takes the If with its branches", QNN_SESSIONS)
                result[index] = taken
                for i in members:
                    result[i] = taken
                decided.update(members)
                continue
            why = (f"its branches hold {', '.join(blockers)}, which QNN does not take inside an If" if blockers
                   else f"its two branches make a tensor of the same name ('{shared[0]}'), which QNN does not rename "
                        "(\"If branches share internal tensor name\"; measured with onnxruntime-qnn 2.7.0: the If "
                        "nodes of convert --keep-off-ep)" if shared
                   else f"its branches read '{outside[0]}', which '{nodes[producers[outside[0]]].name}' makes off QNN "
                        "(\"If implicit input is produced outside the QNN partition\"; measured: case qdq_loop_if)"
                   if outside
                   else f"QNN does not take the If itself ({own.reason})")
        else:
            why = f"QNN takes no {node.op_type}, nor the nodes of its body"
        result[index] = NodeVerdict(SupportLevel.UNSUPPORTED_OP, why, QNN_SESSIONS, "EP001")
        for i in members:
            result[i] = NodeVerdict(SupportLevel.UNSUPPORTED_OP, f"inside {node.op_type} '{node.name}': {why}",
                                    QNN_SESSIONS, "EP001")
        decided.update(members)
    return result



def qnn_lone_qdq(analysis, assignment: list[int], chosen: int) -> list[int]:
    """The nodes of the main graph that QNN would take as a partition of their own made of one
    QuantizeLinear or DequantizeLinear: QNN gives such a partition back to the CPU EP (measured:
    cases qdq_loop_only, qdq_loop, qdq_if of QNN_SESSIONS: the lone DQ of a graph input before a
    Loop, a weight's DQ duplicated for the Conv after a Loop). ``assignment`` as prediction's
    (``chosen``: QNN's index in the target)."""
    from collections import Counter

    from ortprep.eps.partition import partition_graph

    graph = analysis.graphs[0]
    part = assignment[:len(graph.nodes)]
    if chosen not in part:
        return []
    partition_of = partition_graph(graph.graph, part).partition_of
    sizes = Counter(p for i, p in enumerate(partition_of) if p >= 0 and part[i] == chosen)
    return [i for i, p in enumerate(partition_of)
            if p >= 0 and part[i] == chosen and sizes[p] == 1 and graph.nodes[i].op_type in QDQ_OPS]


def _outer_reads(node) -> list[str]:
    """The values of the outer scope that an If's branches read (its implicit inputs), in order."""
    reads: list[str] = []
    for attribute in node.attribute:
        if attribute.name not in ("then_branch", "else_branch") or not attribute.HasField("g"):
            continue
        own = {init.name for init in attribute.g.initializer} | {value.name for value in attribute.g.input}
        for inner in attribute.g.node:
            reads += [name for name in inner.input if name and name not in own and name not in reads]
            own.update(out for out in inner.output if out)
    return reads


def _shared_branch_names(node) -> list[str]:
    """Names that both branches of an If make (node outputs), sorted; [] for other nodes."""
    made = []
    for attribute in node.attribute:
        if attribute.name in ("then_branch", "else_branch") and attribute.HasField("g"):
            made.append({out for inner in attribute.g.node for out in inner.output if out})
    return sorted(made[0] & made[1]) if len(made) == 2 else []
