"""Type consistency after FP16 conversion, subgraphs included.

onnxconverter-common decides float16 or float32 per node, but it inserts Casts only where it sees
a value's type in the same graph. Two cases escape it:
- a value from an outer scope (an initializer converted to float16 in the main graph, read by a
  node kept in float32 inside a Loop body);
- an initializer read by a kept node and by a converted one (left float32, so the converted node
  reads float32 beside float16).
Either makes ORT refuse the model ("Type parameter (T) bound to different types").

``reconcile_types`` walks every graph in order with the types in scope, and wherever the inputs
that one type parameter binds disagree, casts them to the node's precision (float32 for kept
nodes, float16 otherwise). Loop/Scan carried values and If/Loop/Scan body outputs are cast to the
type their body declares, and graph outputs to their declared type.

``run_converter`` drives onnxconverter-common's per-graph passes the way its
``convert_float_to_float16`` does, without its final Cast-pair removal (which raises on a pair
that ends in a graph output); ``drop_cast_round_trips`` does that removal for every case.
"""

from __future__ import annotations

import itertools

import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
FLOATS = (FLOAT, FLOAT16)


def run_converter(model: ModelProto, *, keep_io_types: bool, op_block_list: set[str], node_block_list: set[str],
                  min_positive_val: float, max_finite_val: float) -> ModelProto:
    """onnxconverter-common's conversion, pass by pass (their functions, our loop)."""
    from onnxconverter_common import float16 as f16

    infer_shapes_without_weights(model)
    model, _, _ = f16.initial_checking(model, True)  # (its own shape inference serializes every weight)
    names: dict = {}
    level = [model.graph]
    top = True
    while level:
        following = []
        for graph in level:
            f16.process_graph_input(graph, top, keep_io_types, names)
            blocked_values = f16.process_tensor_in_node(
                graph, op_block_list, node_block_list, min_positive_val, max_finite_val
            )
            f16.process_value_info(graph, blocked_values)
            f16.process_node_in_block_list(graph, names, op_block_list, node_block_list)
            process_initializers(graph, op_block_list, node_block_list, min_positive_val, max_finite_val)
            f16.process_graph_output(graph, top, keep_io_types)
            following.extend(f16.get_next_level_graph(graph, op_block_list, node_block_list))
            if not top:
                f16.process_node_input_output(graph, names)
            top = False
        level = following
    f16.sort_topology(model.graph)
    return model


def to_float16(values, min_positive_val: float, max_finite_val: float):
    """onnxconverter-common's ``convert_np_to_float16`` in two passes instead of twelve (it was
    half of the conversion's time on 400 MB of weights): nonzero magnitudes below
    ``min_positive_val`` become it and finite ones above ``max_finite_val`` become it, sign kept;
    NaN, 0 and infinities unchanged. (Its warnings are left out: ortprep reports CNV001/CNV002.)"""
    import numpy as np

    values = np.asarray(values, dtype=np.float32)
    magnitude = np.abs(values)
    tiny = (magnitude < min_positive_val) & (values != 0)
    huge = (magnitude > max_finite_val) & np.isfinite(values)
    if tiny.any() or huge.any():
        values = values.copy()
        values[tiny] = np.copysign(np.float32(min_positive_val), values[tiny])
        values[huge] = np.copysign(np.float32(max_finite_val), values[huge])
    return values.astype(np.float16)


def process_initializers(graph: GraphProto, op_block_list, node_block_list, min_positive_val: float,
                         max_finite_val: float) -> None:
    """onnxconverter-common's ``process_initializers`` (same initializers, same values) with
    :func:`to_float16`, and float_data packed without a Python loop per value."""
    import numpy as np

    blocked = {name for node in graph.node if node.op_type in op_block_list or node.name in node_block_list
               for name in node.input}
    for tensor in graph.initializer:
        if tensor.name in blocked or tensor.data_type != FLOAT:
            continue
        tensor.data_type = FLOAT16
        if tensor.float_data:
            halves = to_float16(np.array(tensor.float_data), min_positive_val, max_finite_val)
            tensor.int32_data[:] = halves.view(np.uint16).astype(np.int32).tolist()
            tensor.float_data[:] = []
        if tensor.raw_data:
            tensor.raw_data = to_float16(np.frombuffer(tensor.raw_data, dtype=np.float32), min_positive_val,
                                         max_finite_val).tobytes()


def infer_shapes_without_weights(model: ModelProto) -> None:
    """onnx shape inference into ``model``'s value_info, run on its skeleton (ortprep.analysis:
    big initializers keep their type and dims, not their bytes): serializing 400 MB of weights for
    it cost as much as the conversion itself. A model with subgraphs is inferred whole (their
    value_info must land in each body)."""
    from ortprep.analysis import skeleton

    has_subgraphs = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                        for node in model.graph.node for a in node.attribute)
    inferred = onnx.shape_inference.infer_shapes(model if has_subgraphs else skeleton(model))
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    for output, typed in zip(model.graph.output, inferred.graph.output):
        output.CopyFrom(typed)
    if has_subgraphs:
        model.graph.CopyFrom(inferred.graph)


def drop_cast_round_trips(graph: GraphProto, original_casts: set[str]) -> int:
    """Remove float32 -> float16 -> float32 Cast pairs the converter inserted between two float32
    nodes (they would round the value to float16 for nothing). A pair whose end is a graph output
    becomes an Identity. Casts the original model had are left alone. Returns pairs removed."""
    consumers: dict[str, list[NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    producers = {out: node for node in graph.node for out in node.output}
    removed = 0
    dead: set[int] = set()
    for first in list(graph.node):
        if first.op_type != "Cast" or first.name in original_casts or _cast_to(first) != FLOAT16:
            continue
        upstream = producers.get(first.input[0])
        if upstream is None or upstream.op_type == "Cast" and _cast_to(upstream) == FLOAT16:
            continue  # a graph input, or not a float32 value for certain
        if upstream.op_type != "Cast" and not _outputs_float32(upstream, first.input[0], graph):
            continue
        readers = consumers.get(first.output[0], [])
        graph_outputs = {v.name for v in graph.output}
        if not readers or first.output[0] in graph_outputs:
            continue
        if not all(r.op_type == "Cast" and r.name not in original_casts and _cast_to(r) == FLOAT for r in readers):
            continue
        for second in readers:
            second.op_type = "Identity"
            del second.attribute[:]
            second.input[0] = first.input[0]
            removed += 1
        dead.add(id(first))
    if dead:
        keep = [n for n in graph.node if id(n) not in dead]
        del graph.node[:]
        graph.node.extend(keep)
    return removed


def _outputs_float32(node: NodeProto, name: str, graph: GraphProto) -> bool:
    """The converter names the float32 side of a kept node's output '<node>_output_cast_<i>'."""
    return name.startswith(f"{node.name}_output_cast_") or name.startswith(f"{node.name}_input_cast_")


def _cast_to(node: NodeProto) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None)


class _Reconciler:
    def __init__(self, model: ModelProto, fp32_nodes: set[str], fp32_ops: set[str]) -> None:
        self.opsets = {o.domain or "": o.version for o in model.opset_import}
        self.fp32_nodes = fp32_nodes
        self.fp32_ops = fp32_ops
        self.changes: list[str] = []
        self.counter = itertools.count()
        self.inside_kept = 0  # > 0 inside the bodies of a kept If/Loop/Scan (the converter left them float32)

    def kept(self, node: NodeProto) -> bool:
        return self.inside_kept > 0 or node.name in self.fp32_nodes or node.op_type in self.fp32_ops

    def cast(self, source: str, to: int, where: str) -> tuple[NodeProto, str]:
        name = f"{source}_ortprep_to{'16' if to == FLOAT16 else '32'}_{next(self.counter)}"
        return helper.make_node("Cast", [source], [name], to=to, name=name), name

    def graph(self, graph: GraphProto, scope: dict[str, int | None], path: str) -> None:
        types = dict(scope)
        for value in graph.input:
            types[value.name] = _elem(value)
        for tensor in graph.initializer:
            types[tensor.name] = tensor.data_type
        rebuilt: list[NodeProto] = []
        for node in graph.node:
            before = self.node(node, types, f"{path}/{node.name or node.op_type}")
            rebuilt.extend(before)
            rebuilt.append(node)
        # graph outputs: the declared type wins
        for value in graph.output:
            declared, produced = _elem(value), types.get(value.name)
            if declared in FLOATS and produced in FLOATS and declared != produced:
                producer = next((n for n in rebuilt if value.name in n.output), None)
                if producer is None:
                    continue
                inner = f"{value.name}_ortprep_{'fp16' if produced == FLOAT16 else 'fp32'}"
                producer.output[list(producer.output).index(value.name)] = inner
                rebuilt.append(helper.make_node("Cast", [inner], [value.name], to=declared,
                                                name=f"{value.name}_ortprep_output_cast"))
                types[value.name] = declared
                self.changes.append(f"{path or 'main graph'}: output '{value.name}' cast to its declared type")
        if len(rebuilt) != len(graph.node):
            del graph.node[:]
            graph.node.extend(rebuilt)

    def node(self, node: NodeProto, types: dict[str, int | None], path: str) -> list[NodeProto]:
        """Casts to insert before ``node``; records its output types in ``types``."""
        if node.op_type == "Cast":
            for out in node.output:
                types[out] = _cast_to(node)
            return []
        inserted: list[NodeProto] = []
        bodies = [a for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
        if bodies:
            return self.control_flow(node, bodies, types, path)
        schema = _schema(node, self.opsets)
        if schema is None:
            for out in node.output:
                types[out] = None
            return []
        want = FLOAT if self.kept(node) else FLOAT16
        groups: dict[str, list[int]] = {}
        constrained = {c.type_param_str for c in schema.type_constraints}
        for index, name in enumerate(node.input):
            if not name:
                continue
            formal = schema.inputs[min(index, len(schema.inputs) - 1)] if schema.inputs else None
            if formal is not None and formal.type_str in constrained:
                groups.setdefault(formal.type_str, []).append(index)
        bound: dict[str, int | None] = {}
        kept = self.kept(node)
        for param, indices in groups.items():
            have = {types.get(node.input[i]) for i in indices}
            floats = have & set(FLOATS)
            # mixed float types, or float16 reaching a node that must compute in float32
            if len(floats) > 1 or (kept and FLOAT16 in floats):
                for i in indices:
                    if types.get(node.input[i]) in FLOATS and types.get(node.input[i]) != want:
                        cast, name = self.cast(node.input[i], want, path)
                        inserted.append(cast)
                        node.input[i] = name
                        types[name] = want
                self.changes.append(f"{path}: inputs cast to float{'16' if want == FLOAT16 else '32'}")
                bound[param] = want
            else:
                known = have - {None}
                bound[param] = next(iter(known)) if len(known) == 1 else None
        for index, out in enumerate(node.output):
            formal = schema.outputs[min(index, len(schema.outputs) - 1)] if schema.outputs else None
            if formal is None:
                types[out] = None
            elif formal.type_str in bound:
                types[out] = bound[formal.type_str]
            elif formal.type_str.startswith("tensor("):
                types[out] = (
                    onnx.helper.np_dtype_to_tensor_dtype(_np_of(formal.type_str)) if _np_of(formal.type_str) else None
                )
            else:
                types[out] = None
        return inserted

    def control_flow(self, node: NodeProto, bodies, types: dict[str, int | None], path: str) -> list[NodeProto]:
        inserted: list[NodeProto] = []
        kept = self.kept(node)
        self.inside_kept += kept
        try:
            for attr in bodies:
                self.graph(attr.g, types, f"{path}.{attr.name}")
        finally:
            self.inside_kept -= kept
        body = bodies[0].g
        if node.op_type in ("Loop", "Scan"):
            # carried (and scanned) inputs take the type the body declares
            offset = 2 if node.op_type == "Loop" else 0
            for index in range(offset, len(node.input)):
                name = node.input[index]
                body_index = index if node.op_type == "Loop" else index
                if not name or body_index >= len(body.input):
                    continue
                declared, have = _elem(body.input[body_index]), types.get(name)
                if declared in FLOATS and have in FLOATS and declared != have:
                    cast, new = self.cast(name, declared, path)
                    inserted.append(cast)
                    node.input[index] = new
                    types[new] = declared
                    self.changes.append(f"{path}: carried value '{name}' cast to the body's type")
            body_outputs = list(body.output)[1:] if node.op_type == "Loop" else list(body.output)
            for out, value in zip(node.output, body_outputs):
                types[out] = _elem(value)
        elif node.op_type == "If":
            then_branch = next(a.g for a in bodies if a.name == "then_branch")
            else_branch = next((a.g for a in bodies if a.name == "else_branch"), None)
            if else_branch is not None:
                for then_value, else_value in zip(then_branch.output, else_branch.output):
                    if (
                        _elem(then_value) in FLOATS
                        and _elem(else_value) in FLOATS
                        and _elem(then_value) != _elem(else_value)
                    ):
                        # make the else branch produce the then branch's type
                        produced = _elem(else_value)
                        else_value.type.tensor_type.elem_type = _elem(then_value)
                        producer = next((n for n in else_branch.node if else_value.name in n.output), None)
                        if producer is not None:
                            inner = f"{else_value.name}_ortprep_{'fp16' if produced == FLOAT16 else 'fp32'}"
                            producer.output[list(producer.output).index(else_value.name)] = inner
                            else_branch.node.append(helper.make_node("Cast", [inner], [else_value.name],
                                                                     to=_elem(then_value), name=f"{inner}_cast"))
                        self.changes.append(
                            f"{path}: else branch output '{else_value.name}' cast to the then branch's type"
                        )
            for out, value in zip(node.output, then_branch.output):
                types[out] = _elem(value)
        else:
            for out in node.output:
                types[out] = None
        return inserted


def _elem(value) -> int | None:
    if value.type.WhichOneof("value") != "tensor_type":
        return None
    return value.type.tensor_type.elem_type or None


def _np_of(type_str: str):
    name = type_str[len("tensor("):-1]
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(getattr(TensorProto, name.upper()))
    except (AttributeError, KeyError, TypeError):
        return None


def _schema(node: NodeProto, opsets: dict[str, int]):
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    try:
        return onnx.defs.get_schema(node.op_type, opsets.get(domain, opsets.get("", 1)), domain)
    except onnx.defs.SchemaError:
        return None


def reconcile_types(model: ModelProto, fp32_nodes: set[str], fp32_ops: set[str]) -> list[str]:
    """Insert Casts so every node's inputs agree in type (see the module doc). Returns what changed."""
    worker = _Reconciler(model, fp32_nodes, fp32_ops)
    worker.graph(model.graph, {}, "")
    return worker.changes
