"""`convert --rewrite-for EP`: find the main-graph nodes check places off the EP, decompose each one
that has a decomposition the EP's table takes, and predict the placement again. A node whose
decomposition still falls back (a dtype or rule the table has beyond op names) gets the next
decomposition, else stays as it was; what was done and what was left is the outcome's record."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from onnx import ModelProto, NodeProto, TensorProto

from ortprep.analysis import ModelAnalysis
from ortprep.graphops import Constants
from ortprep.eps.registry import EpSpec
from ortprep.model import ModelHandle
from ortprep.prediction import check_target
from ortprep.runtime.kernels import support_table
from ortprep.runtime.shapes import symbolic_infer
from ortprep.transforms.decompose.base import Decomposition, Emitter, TensorFacts
from ortprep.transforms.decompose.registry import candidates, for_op

log = logging.getLogger(__name__)


@dataclass
class RewriteOutcome:
    """What --rewrite-for did: nodes rewritten (and by what), nodes left (and why), and check's
    placement on the EP before and after (nodes on the EP, partitions, copies, EP001 findings)."""

    ep: str
    rewritten: list[dict[str, Any]] = field(default_factory=list)
    left: list[dict[str, Any]] = field(default_factory=list)
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)

    def detail(self) -> str:
        """One line for the report's transforms list."""
        if not self.rewritten:
            return f"for {self.ep}: no node to rewrite"
        by_rewrite = Counter((item["op"], item["rewrite"]) for item in self.rewritten)
        done = ", ".join(f"{count} {op} by {name}" for (op, name), count in by_rewrite.items())
        return f"for {self.ep}: {done}" + (f"; {len(self.left)} node(s) left as they were" if self.left else "")

    def record(self) -> dict[str, Any]:
        return {"ep": self.ep, "rewritten": self.rewritten, "left": self.left,
                "predicted": {"before": self.before, "after": self.after}}


def placement_summary(record: dict[str, Any], findings) -> dict[str, Any]:
    """check's prediction for one target, the figures a rewrite changes."""
    unsupported = Counter(f.op_type for f in findings if f.code == "EP001")
    return {"nodes": record["nodes"], "nodes_on_ep": record["supported_nodes"], "partitions": record["partitions"],
            "copies": record["copies"], "verdict": record["verdict"], "ep001": sum(unsupported.values()),
            "ep001_ops": dict(sorted(unsupported.items()))}


def predict(proto: ModelProto, spec: EpSpec) -> tuple[ModelAnalysis, dict[str, Any], list]:
    analysis = ModelAnalysis(ModelHandle(proto=proto, path=None), symbolic_infer=symbolic_infer)
    record, findings = check_target(analysis, (spec,))
    return analysis, record, findings


def rewrite_for_ep(proto: ModelProto, spec: EpSpec) -> tuple[ModelProto, RewriteOutcome]:
    """Decompose, in ``proto`` (changed in place), the main-graph nodes ``spec`` does not take."""
    table = support_table(spec.name)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    analysis, record, findings = predict(proto, spec)
    outcome = RewriteOutcome(ep=spec.name, before=placement_summary(record, findings))
    fallback = set(record["fallback_nodes"])
    plan: dict[int, list[Decomposition]] = {}
    names: dict[int, str] = {}
    for info in analysis.graphs[0].nodes:
        if info.name not in fallback or not for_op(info.node.domain, info.op_type):
            continue
        names[info.index] = info.name
        options = candidates(table, info.node.domain, info.op_type, opset)
        if options:
            plan[info.index] = options
        else:
            outcome.left.append({"node": info.name, "op": info.op_type,
                                 "why": f"no decomposition of {info.op_type} is written for opset {opset} with ops "
                                        f"{spec.name}'s table takes"})
    facts = _facts(analysis)
    values = _constants(proto)
    original_nodes = [_copy(node) for node in proto.graph.node]
    initializers = len(proto.graph.initializer)
    while True:
        done, declined = _apply(proto, plan, names, facts, values, opset)
        outcome.left.extend({"node": names[i], "op": original_nodes[i].op_type,
                             "why": "its form is one no decomposition handles (attributes, unknown rank or type)"}
                            for i in declined)
        if not done:
            break
        _, record, findings = predict(proto, spec)
        off_ep = set(record["fallback_nodes"])
        fallen = {index for index, produced in done.items() if off_ep & set(produced)}
        if not fallen:
            outcome.rewritten = [{"node": names[i], "op": original_nodes[i].op_type, "rewrite": plan[i][0].name,
                                  "nodes": len(done[i])} for i in sorted(done)]
            break
        for index in fallen:  # the next decomposition, else the node stays as it is
            tried = plan[index].pop(0)
            if not plan[index]:
                del plan[index]
                outcome.left.append({"node": names[index], "op": original_nodes[index].op_type,
                                     "why": f"{tried.name}'s nodes fall back on {spec.name} too"})
        del proto.graph.node[:]
        proto.graph.node.extend(_copy(node) for node in original_nodes)
        del proto.graph.initializer[initializers:]
    drop_unread_initializers(proto)
    _, record, findings = predict(proto, spec)
    outcome.after = placement_summary(record, findings)
    return proto, outcome


def _apply(proto: ModelProto, plan: dict[int, list[Decomposition]], names: dict[int, str], facts, values,
           opset: int) -> tuple[dict[int, list[str]], list[int]]:
    """Replace each planned node by its first decomposition: ({index: the new nodes' names}, the
    nodes whose builder declined: dropped from the plan, they stay)."""
    graph = proto.graph
    done: dict[int, list[str]] = {}
    declined: list[int] = []
    rebuilt: list[NodeProto] = []
    for index, node in enumerate(list(graph.node)):
        if index not in plan:
            rebuilt.append(node)
            continue
        emit = Emitter(node, names[index], opset, facts, values)
        if not plan[index][0].build(node, emit):
            del plan[index]
            declined.append(index)
            rebuilt.append(node)
            continue
        rebuilt.extend(emit.nodes)
        graph.initializer.extend(emit.initializers)
        done[index] = [n.name for n in emit.nodes]
    if done:
        del graph.node[:]
        graph.node.extend(rebuilt)
    return done, declined


def _facts(analysis: ModelAnalysis):
    def facts(name: str) -> TensorFacts:
        value = analysis.values.get(name)
        if value is None or value.dtype is None:
            return TensorFacts()
        try:
            elem_type = TensorProto.DataType.Value(value.dtype.upper())
        except ValueError:
            elem_type = TensorProto.UNDEFINED
        shape = None if value.shape is None else [d if isinstance(d, int) and d >= 0 else None for d in value.shape]
        return TensorFacts(elem_type, shape)

    return facts


def _constants(proto: ModelProto):
    """A reader of the main graph's constant values (initializers, a fed one included, as ORT folds
    it when nothing is fed; Constant nodes), for the decompositions' Emitter."""
    return Constants(proto.graph, fed_are_constant=True).get


def _copy(node: NodeProto) -> NodeProto:
    copy = NodeProto()
    copy.CopyFrom(node)
    return copy


def decomposition_for(analysis: ModelAnalysis, node_name: str, table, opset: int) -> Decomposition | None:
    """The decomposition --rewrite-for would apply to this main-graph node for ``table``'s EP (the
    first whose ops the table takes and whose builder handles the node's form), or None: what
    check's EP001 fix names. The builder runs on a scratch Emitter; the model is not changed."""
    memo = analysis.__dict__.setdefault("_decompose_memo", {})
    if "nodes" not in memo:
        memo["nodes"] = {info.name: info for info in analysis.graphs[0].nodes} if analysis.graphs else {}
        memo["facts"], memo["values"] = _facts(analysis), _constants(analysis.handle.proto)
    info = memo["nodes"].get(node_name)
    if info is None:
        return None
    for decomposition in candidates(table, info.node.domain, info.op_type, opset):
        if decomposition.build(info.node, Emitter(info.node, info.name, opset, memo["facts"], memo["values"])):
            return decomposition
    return None


def apply_everywhere(proto: ModelProto, decomposition: Decomposition, only: set[str] | None = None) -> list[str]:
    """Decompose every main-graph node of ``decomposition``'s op (``only``: of these names) whatever
    an EP takes (in place); the names of the nodes rewritten. What the tests compare and place."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    analysis = ModelAnalysis(ModelHandle(proto=proto, path=None), symbolic_infer=symbolic_infer)
    plan, names = {}, {}
    for info in analysis.graphs[0].nodes:
        if (info.op_type == decomposition.op and (info.node.domain or "") == decomposition.domain
                and (only is None or info.name in only)):
            plan[info.index], names[info.index] = [decomposition], info.name
    done, _ = _apply(proto, plan, names, _facts(analysis), _constants(proto), opset)
    drop_unread_initializers(proto)
    return [names[index] for index in sorted(done)]


def drop_unread_initializers(proto: ModelProto) -> None:
    """Initializers of the main graph that no node (or subgraph) reads any more, once their node
    was rewritten (a PRelu's slope, now LeakyRelu's attribute); graph inputs keep theirs."""
    from ortprep.model import iter_graphs

    graph = proto.graph
    read = {name for _, sub in iter_graphs(graph) for node in sub.node for name in node.input}
    read |= {value.name for value in graph.input} | {value.name for value in graph.output}
    kept = [tensor for tensor in graph.initializer if tensor.name in read]
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)
