"""Per-node facts that several steps need: opset in force, schema, input/output dtypes and shapes.

Types come from onnx shape inference on a copy of the graph (weights are never read: with
external data the proto holds only metadata). Where onnx gives up, values stay unknown.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, TypeProto

from ortprep.model import (
    ModelHandle,
    dtype_name,
    iter_graphs,
    normalize_domain,
    subgraphs_of,
    tensor_nbytes,
    text_of,
)

log = logging.getLogger(__name__)

Shape = list[int | str | None]


@dataclass(frozen=True, slots=True)
class ValueFacts:
    """A value's type. One object stands for every value of the same type (a large model has few
    types: docs/decisions/seams-large-graph-costs.md), so its shape list is never changed in place."""

    dtype: str | None
    shape: Shape | None
    is_initializer: bool = False
    static: bool = field(init=False, repr=False, compare=False)  # a shape of known positive sizes

    def __post_init__(self) -> None:
        static = self.shape is not None and all(isinstance(d, int) and d > 0 for d in self.shape)
        object.__setattr__(self, "static", static)


@dataclass(slots=True)
class NodeInfo:
    node: NodeProto
    index: int  # position in its graph
    graph_id: int  # index into ModelAnalysis.graphs
    name: str  # node.name, or a generated "<op>#<index>" label when the node has none
    domain: str  # normalized ("ai.onnx" for the default domain)
    opset: int | None  # opset imported for the node's domain
    since: int | None  # since-version of the schema in force (None: onnx has no schema)
    schema: onnx.defs.OpSchema | None
    inputs: list[ValueFacts | None]
    outputs: list[ValueFacts | None]
    has_subgraphs: bool = False
    graph_size: int = 0  # nodes in the node's own graph

    @property
    def op_type(self) -> str:
        return self.node.op_type

    def attribute(self, name: str, default=None):
        for attr in self.node.attribute:
            if attr.name == name:
                return onnx.helper.get_attribute_value(attr)
        return default

    def data_inputs(self) -> list[ValueFacts]:
        return [v for v in self.inputs if v is not None and not v.is_initializer]


@dataclass
class GraphInfo:
    graph: GraphProto
    scope: str
    nodes: list[NodeInfo] = field(default_factory=list)


def ort_type_string(type_proto: TypeProto) -> str | None:
    """The type as ORT writes it in kernel type constraints: tensor(float), seq(tensor(int64)),
    map(int64,tensor(float)), optional(tensor(float)); None when unknown."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        elem = type_proto.tensor_type.elem_type
        return f"tensor({dtype_name(elem)})" if elem else None
    if kind == "sparse_tensor_type":
        elem = type_proto.sparse_tensor_type.elem_type
        return f"sparse_tensor({dtype_name(elem)})" if elem else None
    if kind == "sequence_type":
        inner = ort_type_string(type_proto.sequence_type.elem_type)
        return f"seq({inner})" if inner else None
    if kind == "optional_type":
        inner = ort_type_string(type_proto.optional_type.elem_type)
        return f"optional({inner})" if inner else None
    if kind == "map_type":
        value = ort_type_string(type_proto.map_type.value_type)
        return f"map({dtype_name(type_proto.map_type.key_type)},{value})" if value else None
    return None


def _facts_from_type(type_proto: TypeProto) -> tuple[str | None, Shape | None]:
    """(dtype, shape): dtype is the element type name for tensors ("float") and ORT's type string
    for other types ("seq(tensor(float))"), matching the generated tables."""
    text = ort_type_string(type_proto)
    dtype = text[len("tensor(") : -1] if text and text.startswith("tensor(") else text
    if type_proto.WhichOneof("value") != "tensor_type" or not type_proto.tensor_type.HasField("shape"):
        return dtype, None
    dims = type_proto.tensor_type.shape.dim
    shape: Shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]
    return dtype, shape


# Initializers up to this size keep their values in the skeleton: shape inference reads small
# integer tensors (Reshape shapes, axes) to propagate shapes.
SKELETON_KEEP_BYTES = 4096


def skeleton(proto: ModelProto) -> ModelProto:
    """The model without its large weights (dims and types kept), for shape inference.

    Avoids copying and serializing every weight byte when the weights are loaded."""
    result = ModelProto()
    for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        value = getattr(proto, name)
        setattr(result, name, text_of(value) if isinstance(value, (str, bytes)) else value)
    result.opset_import.extend(proto.opset_import)
    result.functions.extend(proto.functions)
    graph, source = result.graph, proto.graph
    graph.name = text_of(source.name)
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    for value in list(graph.output) + list(graph.value_info):
        unknown_negative_dims(value)
    graph.sparse_initializer.extend(source.sparse_initializer)
    for tensor in source.initializer:
        # tensor_nbytes, not len(raw_data): reading the field copies every weight byte.
        if not tensor.HasField("raw_data") or tensor_nbytes(tensor) <= SKELETON_KEEP_BYTES:
            graph.initializer.append(tensor)
            continue
        stub = graph.initializer.add()
        stub.name, stub.data_type = tensor.name, tensor.data_type
        stub.dims.extend(tensor.dims)
        stub.data_location = TensorProto.EXTERNAL
        entry = stub.external_data.add()
        entry.key, entry.value = "location", "<not loaded>"
    return result


def _negative_dims(value) -> bool:
    """A dimension declared as a negative number (PaddlePaddle's exports write -1 for "any")."""
    tensor = value.type.tensor_type if value.type.WhichOneof("value") == "tensor_type" else None
    return tensor is not None and tensor.HasField("shape") and any(
        d.HasField("dim_value") and d.dim_value < 0 for d in tensor.shape.dim)


def unknown_negative_dims(value) -> None:
    """Such a dimension as unknown, for inference to fill. Kept at -1 behind static inputs it
    contradicts what inference finds: check read the output's node as dynamic (QNN: PP-OCR's
    classifier's last node predicted on the CPU, "Cannot get shape", where the real session took
    every node), and onnx's checker refused a model convert --fix-shape wrote ("Inferred shape and
    existing shape differ in dimension 0: (1) vs (-1)")."""
    if _negative_dims(value):
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value < 0:
                dim.Clear()


def _skeleton_bytes(proto: ModelProto) -> bytes:
    """skeleton(proto), serialized: the model itself where it holds no weight to leave out (a
    graph-only open of a model with external weights), so that the graph is not copied first
    (docs/decisions/seams-large-graph-costs.md). Shape inference reads nothing of what
    the skeleton drops besides the weights (doc strings, metadata)."""
    if any(t.HasField("raw_data") and tensor_nbytes(t) > SKELETON_KEEP_BYTES for t in proto.graph.initializer) or any(
            _negative_dims(v) for v in list(proto.graph.output) + list(proto.graph.value_info)):
        return skeleton(proto).SerializeToString()
    return proto.SerializeToString()


def _infer(proto: ModelProto, strict: bool) -> tuple[ModelProto, bool]:
    """(the model with inferred value_info, whether onnx's strict, type-checking inference passed).

    ``strict``: try that one first. It is the inference onnx's full checker runs, so where it
    passes the checker need not run it again. Where it fails, the lenient one gives what facts it
    can."""
    # the skeleton as bytes at once: its proto is freed before onnx builds the inferred one
    # (docs/decisions/seams-large-graph-costs.md)
    data = _skeleton_bytes(proto)
    if strict:
        try:
            return onnx.shape_inference.infer_shapes(data, check_type=True, strict_mode=True, data_prop=True), True
        except Exception as exc:  # noqa: BLE001 - onnx raises several types
            log.debug("strict onnx shape inference failed (%s); inferring leniently", exc)
    try:
        return onnx.shape_inference.infer_shapes(data, check_type=False, strict_mode=False, data_prop=True), False
    except Exception as exc:  # noqa: BLE001 - onnx raises several types; partial facts are still useful
        log.info("onnx shape inference failed (%s); using the model's own value_info", exc)
        return proto, False


@functools.lru_cache(maxsize=4096)
def _schema(op: str, opset: int, domain: str) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "" if domain == "ai.onnx" else domain)
    except Exception:  # noqa: BLE001 - SchemaError: onnx does not know this op at this opset
        return None


class ModelAnalysis:
    """Node facts for every graph of a model (main graph first, then subgraphs depth first).

    ``strict_inference``: try onnx's strict shape inference first, for a caller that runs onnx's
    full checker too (check): ``strict_inference_passed`` then says whether the checker may skip
    its own. Costs a second inference on a model that fails it.

    ``symbolic_infer``: where onnx leaves node outputs untyped (contrib ops), a second inference
    that may type them (runtime/shapes.py: ONNX Runtime's symbolic one); None: none."""

    def __init__(self, handle: ModelHandle, strict_inference: bool = False,
                 symbolic_infer: Callable[[ModelProto], ModelProto | None] | None = None) -> None:
        self.handle = handle
        self.opsets = handle.opsets()
        inferred, self.strict_inference_passed = _infer(handle.proto, strict_inference)
        self.values: dict[str, ValueFacts] = {}
        by_type: dict[bytes, ValueFacts] = {}  # read each type once: values share few types
        by_tensor_type: dict[tuple, ValueFacts] = {}
        for _, graph in iter_graphs(inferred.graph):
            for value in list(graph.input) + list(graph.output) + list(graph.value_info):
                key = value.type.SerializeToString()
                facts = by_type.get(key)
                if facts is None:
                    facts = by_type[key] = ValueFacts(*_facts_from_type(value.type))
                known = self.values.get(value.name)
                if (known is None or (known.dtype is None and facts.dtype)
                        or (known.shape is None and facts.shape is not None)):
                    self.values[value.name] = facts
            for tensor in graph.initializer:
                key = (tensor.data_type, tuple(tensor.dims))
                facts = by_tensor_type.get(key)
                if facts is None:
                    facts = by_tensor_type[key] = ValueFacts(dtype_name(tensor.data_type), list(tensor.dims), True)
                self.values[tensor.name] = facts
            for node in graph.node:
                if node.op_type == "Constant" and node.output:
                    known = self.values.get(node.output[0])
                    if known is not None:
                        self.values[node.output[0]] = ValueFacts(known.dtype, known.shape, True)
        self.symbolic_used = False
        self.graphs: list[GraphInfo] = []
        self._untyped = False  # a node output onnx could not type (found while collecting)
        self._collect(handle.graph, "")
        if self._untyped and symbolic_infer is not None:
            # onnx gave up on some values (contrib ops, missing schemas): ask ORT's symbolic inference.
            symbolic = symbolic_infer(handle.proto)
            if symbolic is not None:
                for _, graph in iter_graphs(symbolic.graph):
                    for value in list(graph.value_info) + list(graph.output):
                        if value.name not in self.values:
                            dtype, shape = _facts_from_type(value.type)
                            if dtype:
                                self.values[value.name] = ValueFacts(dtype, shape)
                                self.symbolic_used = True
            if self.symbolic_used:
                self.graphs = []
                self._collect(handle.graph, "")  # again, with what it typed

    def _op_facts(self, raw_domain: str, op_type: str) -> tuple[str, int | None, onnx.defs.OpSchema | None, int | None]:
        """(normalized domain, opset in force, schema, since-version) of an op."""
        domain = normalize_domain(raw_domain)
        opset = self.opsets.get(domain)
        if opset is None and domain in ("com.microsoft", "ai.onnx.ml"):
            opset = 1
        schema = _schema(op_type, opset, domain) if opset is not None else None
        return domain, opset, schema, schema.since_version if schema is not None else opset

    def _collect(self, graph: GraphProto, scope: str) -> None:
        info = GraphInfo(graph=graph, scope=scope)
        graph_id = len(self.graphs)
        self.graphs.append(info)
        graph_size = len(graph.node)
        facts_of = self.values.get
        ops: dict[tuple[str, str], tuple] = {}  # what _op_facts says, read once per op of the graph
        for index, node in enumerate(graph.node):
            op_type, raw_domain = node.op_type, node.domain
            op = ops.get((raw_domain, op_type))
            if op is None:
                op = ops[(raw_domain, op_type)] = self._op_facts(raw_domain, op_type)
            domain, opset, schema, since = op
            subgraphs = list(subgraphs_of(node)) if node.attribute else []
            outputs = [facts_of(name) if name else None for name in node.output]
            if None in outputs and any(name and name not in self.values for name in node.output):
                self._untyped = True
            info.nodes.append(
                NodeInfo(
                    node=node,
                    index=index,
                    graph_id=graph_id,
                    name=node.name or f"{op_type}#{index}" + (f"@{scope}" if scope else ""),
                    domain=domain,
                    opset=opset,
                    since=since,
                    schema=schema,
                    inputs=[facts_of(name) if name else None for name in node.input],
                    outputs=outputs,
                    has_subgraphs=bool(subgraphs),
                    graph_size=graph_size,
                )
            )
            for attr_name, subgraph in subgraphs:
                self._collect(subgraph, f"{scope}/{info.nodes[-1].name}.{attr_name}")

    def all_nodes(self) -> list[NodeInfo]:
        return [node for graph in self.graphs for node in graph.nodes]

    def graph_inputs(self) -> list[tuple[str, ValueFacts]]:
        initializers = {t.name for t in self.handle.graph.initializer}
        return [
            (value.name, self.values.get(value.name) or ValueFacts(*_facts_from_type(value.type)))
            for value in self.handle.graph.input
            if value.name not in initializers
        ]


def formal_types(node: NodeInfo) -> list[tuple[str, str, ValueFacts | None]]:
    """(type-constraint name, "input"/"output", facts) for each input and output of the node,
    following the schema's formal parameters (variadic ones repeat). Empty without a schema."""
    schema = node.schema
    if schema is None:
        return []
    result = []
    for kind, formals, values in (("input", schema.inputs, node.inputs), ("output", schema.outputs, node.outputs)):
        if not formals:
            continue
        for position, facts in enumerate(values):
            formal = formals[min(position, len(formals) - 1)]
            if position >= len(formals) and formal.option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
                continue
            result.append((formal.type_str, kind, facts))
    return result


def _known(shape: Shape | None) -> list[int] | None:
    # a dim of -1 (PaddlePaddle's exports write the batch so) or 0 is not a known size
    if shape is None or any(not isinstance(d, int) or d < 1 for d in shape):
        return None
    return [int(d) for d in shape]


def node_macs(node: NodeInfo) -> int | None:
    """Multiply-accumulates of Conv, ConvTranspose, MatMul and Gemm when shapes are known."""
    op = node.op_type
    if op not in ("Conv", "ConvTranspose", "MatMul", "Gemm") or node.domain != "ai.onnx":
        return None
    out = _known(node.outputs[0].shape) if node.outputs and node.outputs[0] else None
    first = _known(node.inputs[0].shape) if node.inputs and node.inputs[0] else None
    weight = _known(node.inputs[1].shape) if len(node.inputs) > 1 and node.inputs[1] else None
    if out is None or weight is None:
        return None
    if op == "Conv":
        # each output element: (C_in / group) * kernel elements
        return math.prod(out) * math.prod(weight[1:])
    if op == "ConvTranspose":
        if first is None:
            return None
        return math.prod(first) * math.prod(weight[1:])
    if op == "MatMul":
        if first is None or not first:
            return None
        return math.prod(out) * first[-1]
    # Gemm: A (M x K) or its transpose
    if first is None or len(first) != 2:
        return None
    k = first[0] if node.attribute("transA", 0) else first[1]
    return math.prod(out) * k


def is_float32_tensor(facts: ValueFacts | None) -> bool:
    return facts is not None and facts.dtype == dtype_name(TensorProto.FLOAT)
