"""Graph rewrites used by `convert`: opset conversion, fixing dynamic dimensions, and 1-D
convolution/pooling rewritten as 2-D (which DirectML NPUs handle)."""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

from ortprep.analysis import ModelAnalysis, unknown_negative_dims
from ortprep.errors import UsageError
from ortprep.model import ModelHandle, iter_graphs
from ortprep.runtime.shapes import symbolic_infer

log = logging.getLogger(__name__)

ONE_D_OPS = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool")


def convert_opset(proto: ModelProto, target: int) -> ModelProto:
    """onnx's version converter, with its failure turned into one clear line."""
    current = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if current == target:
        return proto
    try:
        return onnx.version_converter.convert_version(proto, target)
    except Exception as exc:  # noqa: BLE001 - the converter raises several types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"onnx's version converter cannot take this model from opset {current} to {target}: {first}",
            hint="try a nearer opset, or re-export the model at the opset you need",
        ) from exc


def _symbolic_dims(proto: ModelProto) -> set[str]:
    return {
        d.dim_param
        for value in proto.graph.input
        if value.type.WhichOneof("value") == "tensor_type"
        for d in value.type.tensor_type.shape.dim
        if d.dim_param
    }


def fix_dims(proto: ModelProto, dims: dict[str, int]) -> list[str]:
    """Replace named symbolic dimensions with values, in inputs, outputs and value_info."""
    known = _symbolic_dims(proto)
    unknown = sorted(set(dims) - known)
    if unknown:
        raise UsageError(
            f"the model has no symbolic dimension named {', '.join(repr(u) for u in unknown)}",
            hint=f"its inputs' symbolic dimensions are: {', '.join(sorted(known)) or 'none'}",
        )
    changed = []
    for _, graph in iter_graphs(proto.graph):
        for value in list(graph.input) + list(graph.output) + list(graph.value_info):
            if value.type.WhichOneof("value") != "tensor_type":
                continue
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param in dims:
                    name = dim.dim_param
                    dim.dim_value = dims[name]  # clears dim_param (oneof)
                    changed.append(f"{value.name}: {name}={dims[name]}")
    return changed


def fix_shapes(proto: ModelProto, shapes: dict[str, list[int]]) -> list[str]:
    """Set whole input shapes; fixed dimensions must agree with the model."""
    inputs = {v.name: v for v in proto.graph.input}
    changed = []
    for name, new_shape in shapes.items():
        value = inputs.get(name)
        if value is None or value.type.WhichOneof("value") != "tensor_type":
            raise UsageError(f"the model has no tensor input '{name}'", hint=f"its inputs are: {', '.join(inputs)}")
        dims = value.type.tensor_type.shape.dim
        if len(dims) != len(new_shape):
            raise UsageError(
                f"input '{name}' has rank {len(dims)}, but --fix-shape gives {len(new_shape)} dimensions",
                hint="give one value per dimension",
            )
        for index, (dim, size) in enumerate(zip(dims, new_shape)):
            if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                raise UsageError(
                    f"input '{name}' dimension {index} is fixed to {dim.dim_value}; --fix-shape gives {size}",
                    hint="only dynamic dimensions can be changed",
                )
            dim.dim_value = size
        changed.append(f"{name}: {list(new_shape)}")
    return changed


def propagate_static_shapes(proto: ModelProto) -> ModelProto:
    """Re-run shape inference after fixing inputs, so outputs and value_info become static too.
    What inference cannot shape keeps its old output shape, and a value_info without a shape is
    dropped: onnx's checker refuses a tensor type without one."""
    for _, graph in iter_graphs(proto.graph):
        del graph.value_info[:]
    old_outputs = {}
    for value in proto.graph.output:
        if value.type.WhichOneof("value") == "tensor_type":
            old_outputs[value.name] = onnx.TypeProto()
            old_outputs[value.name].CopyFrom(value.type)
            value.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001
        log.info("shape inference after fixing shapes failed: %s", exc)
        inferred = proto
    for value in inferred.graph.output:
        if value.name in old_outputs and not value.type.tensor_type.HasField("shape"):
            value.type.CopyFrom(old_outputs[value.name])
            unknown_negative_dims(value)
    for _, graph in iter_graphs(inferred.graph):
        keep = [
            v
            for v in graph.value_info
            if v.type.WhichOneof("value") != "tensor_type" or v.type.tensor_type.HasField("shape")
        ]
        if len(keep) != len(graph.value_info):
            del graph.value_info[:]
            graph.value_info.extend(keep)
    if _all_static(inferred.graph.input) and not _all_static(
        list(inferred.graph.value_info) + list(inferred.graph.output)
    ):
        _static_from_symbolic(inferred)
    return inferred


def is_static(value: onnx.ValueInfoProto) -> bool:
    """Every dimension a number (a negative one, PaddlePaddle's -1, is not a size)."""
    if value.type.WhichOneof("value") != "tensor_type":
        return True
    tensor = value.type.tensor_type
    return tensor.HasField("shape") and all(d.HasField("dim_value") and d.dim_value >= 0 for d in tensor.shape.dim)


def _all_static(values) -> bool:
    return all(is_static(v) for v in values)


def dynamic_tensors(proto: ModelProto) -> list[str]:
    """Where every input of the main graph is static: its tensors (value_info, outputs) with a
    dimension that is not a number. Empty where an input is dynamic."""
    if not _all_static(proto.graph.input):
        return []
    return [v.name for v in list(proto.graph.value_info) + list(proto.graph.output) if not is_static(v)]


def _static_from_symbolic(proto: ModelProto) -> None:
    """Where onnx's inference leaves dimensions unknown though every input is static, take the
    static shapes ONNX Runtime's symbolic inference finds (it follows sizes computed at run time:
    Shape -> Gather -> Slice of a position buffer, as BERT and GPT-2 exports read their
    position_ids, which onnx's data propagation leaves as unk__N). An EP that needs every tensor
    static (QNN: "Cannot get shape") reads these value_infos. Main graph only; nothing changes
    where symbolic inference fails."""
    symbolic = symbolic_infer(proto)
    if symbolic is None:
        return
    found = {v.name: v for v in list(symbolic.graph.value_info) + list(symbolic.graph.output) if is_static(v)}
    graph = proto.graph
    for value in list(graph.value_info) + list(graph.output):
        if not is_static(value) and value.name in found:
            value.type.CopyFrom(found[value.name].type)
    known = ({v.name for v in graph.value_info} | {v.name for v in graph.input} | {v.name for v in graph.output}
             | {t.name for t in graph.initializer})
    graph.value_info.extend(v for name, v in found.items() if name not in known)


# Shape computations folded into constants once every input is static: the ops a shape is computed
# with, and the most elements a folded value may have (shapes, not data).
SHAPE_OPS = frozenset(
    {
        "Shape",
        "Size",
        "Cast",
        "Gather",
        "Slice",
        "Concat",
        "Unsqueeze",
        "Squeeze",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Floor",
        "Ceil",
        "Equal",
        "Where",
        "Range",
        "ReduceProd",
        "Identity",
        "Max",
        "Min",
        "Neg",
        "Abs",
        "Reshape",
        "Expand",
        "ConstantOfShape",
        "Sqrt",
    }
)
SHAPE_FOLD_ELEMENTS = 4096


def fold_shape_computations(proto: ModelProto) -> list[str]:
    """Replace, in the main graph, each Shape (and Size) of a tensor whose shape is static by its
    value, and every node of SHAPE_OPS whose inputs are then all constants by its result (small
    integer tensors only), so that a Reshape reads a constant shape. An EP that takes the Reshape but not
    the integer arithmetic feeding it otherwise gets the model in several partitions, and a Shape
    chain between them is a partition of its own: PP-OCR's direction classifier after --fix-shape,
    Shape -> Cast -> Slice -> Cast -> Concat -> Reshape, compiled by QNN (onnxruntime-qnn 2.7.0)
    into two EPContext nodes whose session then aborted ("Tensor name not found"; measured).
    Returns the names of the nodes folded. Nodes are evaluated with onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    graph = proto.graph
    shapes: dict[str, list[int]] = {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if value.type.WhichOneof("value") == "tensor_type" and is_static(value):
            shapes[value.name] = [d.dim_value for d in value.type.tensor_type.shape.dim]
    for tensor in graph.initializer:
        shapes[tensor.name] = list(tensor.dims)
    small = {t.name: numpy_helper.to_array(t) for t in graph.initializer
             if int(np.prod(t.dims)) <= SHAPE_FOLD_ELEMENTS and not t.data_location == onnx.TensorProto.EXTERNAL}
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    folded: list[str] = []
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        value = None
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            # read, and kept as it is (dropped below if nothing reads it any more)
            attr = next((a for a in node.attribute if a.name == "value"), None)
            if attr is not None and int(np.prod(attr.t.dims)) <= SHAPE_FOLD_ELEMENTS:
                small[node.output[0]] = numpy_helper.to_array(attr.t)
                shapes[node.output[0]] = list(attr.t.dims)
            kept.append(node)
            continue
        if node.domain in ("", "ai.onnx") and node.op_type in ("Shape", "Size") and node.input[0] in shapes:
            dims = shapes[node.input[0]]
            if node.op_type == "Size":
                value = np.array(int(np.prod(dims)), np.int64)
            else:
                start, end = _int_attr(node, "start", 0), _int_attr(node, "end", None)
                value = np.array(dims[start:end], np.int64)
        elif (node.domain in ("", "ai.onnx") and node.op_type in SHAPE_OPS and len(node.output) == 1
              and not any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute)
              and all(not name or name in small for name in node.input)):
            try:
                single = helper.make_model(
                    helper.make_graph(
                        [node],
                        "fold",
                        [],
                        [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.UNDEFINED, None)],
                    ),
                    opset_imports=[helper.make_opsetid("", opset)],
                )
                value = ReferenceEvaluator(single).run(None, {n: small[n] for n in node.input if n})[0]
            except Exception as exc:  # noqa: BLE001 - not foldable: it stays a node
                log.debug("not folding %s (%s): %s", node.name, node.op_type, exc)
                value = None
        # shapes are integers: a float constant stays a node (folding a Reshape of a bias into an
        # initializer made PP-OCR's classifier quantize its biases as 8-bit weights: cosine 0.997 -> 0.88)
        if (
            value is not None
            and np.asarray(value).size <= SHAPE_FOLD_ELEMENTS
            and np.asarray(value).dtype.kind in "iub"
        ):
            array = np.asarray(value)
            small[node.output[0]] = array
            shapes[node.output[0]] = list(array.shape)
            graph.initializer.append(numpy_helper.from_array(array, node.output[0]))
            folded.append(node.name or node.output[0])
            continue
        kept.append(node)
    if not folded:
        return []
    # initializers and Constant nodes that no node, subgraph or output reads any more
    read = {o.name for o in graph.output} | {name for n in kept for name in n.input}
    read |= {name for _, g in iter_graphs(graph) if g is not graph for n in g.node for name in n.input}
    kept = [n for n in kept if n.op_type != "Constant" or any(o in read for o in n.output)]
    del graph.node[:]
    graph.node.extend(kept)
    unused = [t for t in graph.initializer if t.name not in read]
    if unused:
        names = {t.name for t in unused}
        keep = [t for t in graph.initializer if t.name not in names]
        del graph.initializer[:]
        graph.initializer.extend(keep)
    return folded


def _int_attr(node: onnx.NodeProto, name: str, default):
    for attr in node.attribute:
        if attr.name == name:
            return attr.i
    return default


def _ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    for attr in node.attribute:
        if attr.name == name:
            return list(attr.ints)
    return None


def _set_ints(node: onnx.NodeProto, name: str, values: list[int]) -> None:
    for attr in node.attribute:
        if attr.name == name:
            del attr.ints[:]
            attr.ints.extend(values)
            return
    node.attribute.append(helper.make_attribute(name, values))


def conv1d_to_conv2d(handle: ModelHandle) -> list[str]:
    """Rewrite 1-D Conv/ConvTranspose/pooling (3-D tensors) of the main graph as 2-D:
    Unsqueeze the data to N,C,1,L, use 1xK kernels, Squeeze back. Adjacent rewritten nodes
    share the 4-D tensor. Returns the names of the rewritten nodes."""
    proto = handle.proto
    analysis = ModelAnalysis(handle, symbolic_infer=symbolic_infer)
    graph = proto.graph
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    inits = {t.name: t for t in graph.initializer}
    facts = {node.node.name or f"#{node.index}": node for node in analysis.graphs[0].nodes}
    as_4d: dict[str, str] = {}  # 3-D tensor name -> the 4-D tensor it was squeezed from
    axes_name = "ortprep.axes_2"
    new_nodes: list[onnx.NodeProto] = []
    rewritten = []

    def axis_args(kind: str, data: str, out: str, name: str) -> onnx.NodeProto:
        if opset >= 13:
            return helper.make_node(kind, [data, axes_name], [out], name=name)
        return helper.make_node(kind, [data], [out], name=name, axes=[2])

    for index, node in enumerate(graph.node):
        info = facts.get(node.name or f"#{index}")
        shape = info.inputs[0].shape if info and info.inputs and info.inputs[0] else None
        if node.op_type not in ONE_D_OPS or node.domain not in ("", "ai.onnx") or shape is None or len(shape) != 3:
            new_nodes.append(node)
            continue
        label = node.name or f"{node.op_type}_{index}"
        data = node.input[0]
        if data in as_4d:
            data_4d = as_4d[data]
        else:
            data_4d = f"{data}.ortprep_4d"
            new_nodes.append(axis_args("Unsqueeze", data, data_4d, f"{label}.unsqueeze"))
        inputs = [data_4d]
        if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1:
            weight = node.input[1]
            if weight in inits:
                array = numpy_helper.to_array(inits[weight])
                weight_4d = f"{weight}.ortprep_4d"
                graph.initializer.append(numpy_helper.from_array(np.expand_dims(array, 2), weight_4d))
            else:
                weight_4d = f"{weight}.ortprep_4d"
                new_nodes.append(axis_args("Unsqueeze", weight, weight_4d, f"{label}.unsqueeze_weight"))
            inputs.append(weight_4d)
            inputs.extend(node.input[2:])
        node.input[:] = inputs
        for name in ("kernel_shape", "strides", "dilations"):
            values = _ints(node, name)
            if values is not None:
                _set_ints(node, name, [1] + values)
        pads = _ints(node, "pads")
        if pads is not None and len(pads) == 2:
            _set_ints(node, "pads", [0, pads[0], 0, pads[1]])
        for name, prefix in (("output_padding", 0), ("output_shape", 1)):
            values = _ints(node, name)
            if values is not None:
                _set_ints(node, name, [prefix] + values)
        out = node.output[0]
        out_4d = f"{out}.ortprep_4d"
        node.output[0] = out_4d
        new_nodes.append(node)
        new_nodes.append(axis_args("Squeeze", out_4d, out, f"{label}.squeeze"))
        as_4d[out] = out_4d
        rewritten.append(label)
    if not rewritten:
        return []
    if opset >= 13:
        graph.initializer.append(numpy_helper.from_array(np.array([2], dtype=np.int64), axes_name))
    # Squeeze/Unsqueeze pairs between two rewritten nodes: the consumer reads the 4-D tensor.
    del graph.node[:]
    graph.node.extend(new_nodes)
    _drop_dead_squeezes(proto)
    for _, sub in iter_graphs(graph):
        del sub.value_info[:]
    return rewritten


def _drop_dead_squeezes(proto: ModelProto) -> None:
    graph = proto.graph
    used = {name for _, sub in iter_graphs(graph) for node in sub.node for name in node.input}
    used |= {v.name for v in graph.output}
    keep = [
        n
        for n in graph.node
        if not (n.op_type == "Squeeze" and n.name.endswith(".squeeze") and n.output[0] not in used)
    ]
    del graph.node[:]
    graph.node.extend(keep)
    used_inits = {name for _, sub in iter_graphs(graph) for node in sub.node for name in node.input}
    keep_inits = [t for t in graph.initializer if t.name in used_inits or t.name in {v.name for v in graph.input}]
    del graph.initializer[:]
    graph.initializer.extend(keep_inits)
