"""Protobuf-field mutations of a seed model: parse it, change one or two fields the way a faulty
exporter or a damaged edit would (tensor dims, element types, raw bytes, typed-data counts,
external-data entries, attributes, node input/output names, opsets, value_info shapes, graph
input/output types, subgraphs), serialize it again. Unlike byte flips, the result still parses,
so it reaches the checks and steps behind the parser.

Each case is deterministic from (seed model, case number): ``mutate_fields(seed, case)`` replays it.
"""

from __future__ import annotations

import random

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, helper

FIELD_MUTATIONS = (
    "tensor_dims", "tensor_data_type", "raw_truncate", "raw_extend", "typed_count", "wrong_typed_field",
    "external_entries", "attribute_type", "attribute_value", "node_io_names", "opset_version",
    "value_info_shape", "io_type", "subgraph", "constant_value", "sparse_initializer", "op_type", "ir_version",
)
_ELEM_TYPES = [t for t in TensorProto.DataType.values()] + [0, 99, -1]
_OPS = ["Relu", "Conv", "Gemm", "Reshape", "Cast", "If", "Loop", "Add", "QuantizeLinear", "Foo"]


def _graphs(graph: GraphProto, depth: int = 0) -> list[GraphProto]:
    found = [graph]
    if depth > 8:
        return found
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                found += _graphs(attr.g, depth + 1)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    found += _graphs(sub, depth + 1)
    return found


def _tensors(model: ModelProto) -> list[TensorProto]:
    """Initializers and tensor attributes (Constant values), in every graph."""
    found = []
    for graph in _graphs(model.graph):
        found += list(graph.initializer)
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == AttributeProto.TENSOR:
                    found.append(attr.t)
    return found


def _nodes(model: ModelProto) -> list:
    return [node for graph in _graphs(model.graph) for node in graph.node]


def _names(model: ModelProto) -> list[str]:
    names = [v.name for graph in _graphs(model.graph) for v in list(graph.input) + list(graph.initializer)]
    names += [out for node in _nodes(model) for out in node.output]
    return names or ["x"]


def _to_typed(tensor: TensorProto) -> None:
    """Move a tensor's raw bytes into its typed field (where onnx has one), as older exporters write."""
    if not tensor.HasField("raw_data"):
        return
    try:
        values = onnx.numpy_helper.to_array(tensor).flatten().tolist()
        typed = helper.make_tensor(tensor.name, tensor.data_type, list(tensor.dims), values)
    except Exception:  # noqa: BLE001 - a type helper.make_tensor cannot write typed: keep it raw
        return
    tensor.CopyFrom(typed)


def _mutate_tensor(tensor: TensorProto, kind: str, rng: random.Random, model_name: str) -> None:
    if kind == "tensor_dims":
        if tensor.dims and rng.random() < 0.8:
            index = rng.randrange(len(tensor.dims))
            tensor.dims[index] = rng.choice([0, 1, tensor.dims[index] + 1, max(tensor.dims[index] - 1, 0),
                                             tensor.dims[index] * 2, -1, 2**31, 2**62])
        elif rng.random() < 0.5:
            tensor.dims.append(rng.choice([1, 2, 3]))
        else:
            del tensor.dims[:]
    elif kind == "tensor_data_type":
        tensor.data_type = rng.choice(_ELEM_TYPES) if rng.random() < 0.5 else rng.choice(
            [TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT4, TensorProto.STRING,
             TensorProto.BOOL, TensorProto.UINT2, TensorProto.FLOAT8E4M3FN])
    elif kind == "raw_truncate" and tensor.HasField("raw_data"):
        tensor.raw_data = tensor.raw_data[: rng.randrange(len(tensor.raw_data) or 1)]
    elif kind == "raw_extend" and tensor.data_type != TensorProto.STRING:
        if not tensor.HasField("raw_data"):
            try:
                tensor.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor), tensor.name))
            except Exception:  # noqa: BLE001 - a tensor numpy cannot hold: leave it
                return
        tensor.raw_data = tensor.raw_data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
    elif kind == "typed_count":
        _to_typed(tensor)
        for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
            values = getattr(tensor, field)
            if len(values):
                if rng.random() < 0.5:
                    del values[rng.randrange(len(values)):]
                else:
                    values.extend([values[0]] * rng.randint(1, 5))
                break
    elif kind == "wrong_typed_field":
        count = max(1, min(4096, _count(tensor)))
        tensor.ClearField("raw_data")
        for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
            tensor.ClearField(field)
        field = rng.choice(["float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"])
        getattr(tensor, field).extend([b"s" if field == "string_data" else 1] * count)
    elif kind == "external_entries":
        tensor.data_location = TensorProto.EXTERNAL
        tensor.ClearField("raw_data")
        del tensor.external_data[:]
        size = _count(tensor) * 4
        location = rng.choice([model_name, model_name, "missing.bin", "../escape.bin", "/etc/passwd", "", "a/../" +
                               model_name, "\u00b2.bin"])
        entries = [("location", location)] if location or rng.random() < 0.5 else []
        entries.append(("offset", rng.choice(["0", "0", "16", "-4", "x", "\u00b2", str(2**40), ""])))
        entries.append(("length", rng.choice([str(size), str(size + 4), "0", "abc", str(2**40), "\u00b3"])))
        if rng.random() < 0.2:
            entries.append(("checksum", "nonsense"))
        for key, value in entries:
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value


def _count(tensor: TensorProto) -> int:
    count = 1
    for dim in tensor.dims:
        count *= max(dim, 0)
    return min(count, 1 << 20)


def _mutate_attribute(node, kind: str, rng: random.Random) -> None:
    if not node.attribute:
        node.attribute.append(helper.make_attribute(rng.choice(["axis", "alpha", "to", "perm"]), rng.randint(-9, 9)))
        return
    attr = node.attribute[rng.randrange(len(node.attribute))]
    if kind == "attribute_type":
        attr.type = rng.choice([t for t in AttributeProto.AttributeType.values() if t != attr.type])
    elif attr.type == AttributeProto.INT:
        attr.i = rng.choice([-1, 0, 2**31, -(2**40), 99, 2**63 - 1])
    elif attr.type == AttributeProto.INTS:
        del attr.ints[rng.randrange(len(attr.ints) + 1):]
        attr.ints.extend(rng.choice([[-1], [0], [2**31], [99, 99], []]))
    elif attr.type == AttributeProto.FLOAT:
        attr.f = rng.choice([float("nan"), float("inf"), -1e30, 0.0])
    elif attr.type == AttributeProto.STRING:
        attr.s = rng.choice([b"", b"NOTAMODE", b"\xff\xfe", b"x" * 300])
    elif attr.type == AttributeProto.TENSOR:
        _mutate_tensor(attr.t, rng.choice(["tensor_dims", "tensor_data_type", "raw_truncate", "raw_extend"]), rng, "")
    elif attr.type == AttributeProto.GRAPH:
        del attr.g.output[rng.randrange(len(attr.g.output) + 1):]
    else:
        attr.name = rng.choice(["", "value", "axis", "unknown_attribute"])


def _mutate_graph_level(model: ModelProto, kind: str, rng: random.Random) -> None:
    graph = model.graph
    nodes = _nodes(model)
    if kind == "node_io_names" and nodes:
        node = rng.choice(nodes)
        names = _names(model)
        choice = rng.randrange(5)
        if choice == 0 and node.input:
            node.input[rng.randrange(len(node.input))] = rng.choice(names + [""])
        elif choice == 1 and node.output:
            node.output[rng.randrange(len(node.output))] = rng.choice(names + ["", "fresh_name"])
        elif choice == 2 and node.input:
            del node.input[rng.randrange(len(node.input)):]
        elif choice == 3:
            node.output.append(rng.choice(names + ["extra_output"]))
        else:
            node.input.append(rng.choice(names + [""]))
    elif kind == "opset_version":
        if model.opset_import and rng.random() < 0.8:
            entry = model.opset_import[rng.randrange(len(model.opset_import))]
            entry.version = rng.choice([1, 6, 7, 9, 10, 11, 13, 14, 17, 18, 19, 20, 21, 22, 23, 24, 30, 0])
        else:
            del model.opset_import[:]
    elif kind == "value_info_shape":
        values = list(graph.value_info) + list(graph.output) + list(graph.input)
        if values:
            _mutate_value_type(rng.choice(values), rng, shape_only=True)
    elif kind == "io_type":
        values = list(graph.input) + list(graph.output)
        if values:
            _mutate_value_type(rng.choice(values), rng, shape_only=False)
    elif kind == "subgraph":
        holders = [n for n in nodes if any(a.type == AttributeProto.GRAPH for a in n.attribute)]
        if holders:
            attr = rng.choice([a for a in rng.choice(holders).attribute if a.type == AttributeProto.GRAPH])
            _mutate_subgraph(attr, rng)
        elif nodes:  # give a node a subgraph it does not expect
            rng.choice(nodes).attribute.append(helper.make_attribute("body", helper.make_graph([], "empty", [], [])))
    elif kind == "op_type" and nodes:
        rng.choice(nodes).op_type = rng.choice(_OPS)
    elif kind == "ir_version":
        model.ir_version = rng.choice([1, 3, 4, 7, 9, 10, 11, 12, 99])
    elif kind == "sparse_initializer" and graph.initializer:
        index = rng.randrange(len(graph.initializer))
        dense = graph.initializer[index]
        values = TensorProto()
        values.CopyFrom(dense)
        count = _count(dense)
        del values.dims[:]
        values.dims.append(count if rng.random() < 0.6 else count + 1)
        indices = helper.make_tensor(dense.name + "_idx", TensorProto.INT64, [min(count, 4)],
                                     [rng.choice([0, 1, -1, 2**40]) for _ in range(min(count, 4))])
        sparse = helper.make_sparse_tensor(values, indices, list(dense.dims))
        del graph.initializer[index]
        graph.sparse_initializer.append(sparse)


def _mutate_value_type(value, rng: random.Random, shape_only: bool) -> None:
    tensor_type = value.type.tensor_type
    if shape_only:
        dims = tensor_type.shape.dim
        choice = rng.randrange(4)
        if choice == 0 and dims:
            dims[rng.randrange(len(dims))].dim_value = rng.choice([0, 1, 3, 7, 2**40])
        elif choice == 1 and dims:
            dims[rng.randrange(len(dims))].dim_param = rng.choice(["batch", "n", ""])
        elif choice == 2:
            tensor_type.shape.dim.add().dim_value = rng.choice([1, 2])
        else:
            tensor_type.ClearField("shape")
        return
    choice = rng.randrange(3)
    if choice == 0:
        tensor_type.elem_type = rng.choice(_ELEM_TYPES)
    elif choice == 1:
        value.type.sequence_type.elem_type.tensor_type.elem_type = TensorProto.FLOAT
    else:
        value.ClearField("type")


def _mutate_subgraph(attr, rng: random.Random) -> None:
    sub = attr.g
    choice = rng.randrange(5)
    if choice == 0:
        del sub.output[rng.randrange(len(sub.output) + 1):]
    elif choice == 1:
        del sub.node[rng.randrange(len(sub.node) + 1):]
    elif choice == 2:
        sub.input.append(helper.make_tensor_value_info("extra_in", TensorProto.FLOAT, [1]))
    elif choice == 3 and sub.output:
        sub.output[0].type.tensor_type.elem_type = rng.choice([TensorProto.INT64, TensorProto.STRING, 0])
    else:
        attr.name = rng.choice(["then_branch", "else_branch", "body", "unknown"])


def mutate_fields(seed_bytes: bytes, case: int) -> tuple[str, bytes]:
    """(mutation names joined by '+', model bytes) for case ``case`` of a seed model: one field
    mutation, or two in a quarter of the cases."""
    rng = random.Random(case * 7919 + 17)
    model = onnx.load_from_string(seed_bytes)
    kinds = [FIELD_MUTATIONS[case % len(FIELD_MUTATIONS)]]
    if rng.random() < 0.25:
        kinds.append(rng.choice(FIELD_MUTATIONS))
    for kind in kinds:
        try:
            _apply(model, kind, rng, f"case{case}.onnx")
        except (ValueError, TypeError, IndexError):  # protobuf refused the value: the case runs without it
            pass
    return "+".join(kinds), model.SerializeToString()


def _apply(model: ModelProto, kind: str, rng: random.Random, model_name: str) -> None:
    tensor_kinds = ("tensor_dims", "tensor_data_type", "raw_truncate", "raw_extend", "typed_count",
                    "wrong_typed_field", "external_entries")
    if kind in tensor_kinds:
        tensors = _tensors(model)
        if tensors:
            _mutate_tensor(rng.choice(tensors), kind, rng, model_name)
    elif kind in ("attribute_type", "attribute_value"):
        nodes = _nodes(model)
        if nodes:
            _mutate_attribute(rng.choice(nodes), kind, rng)
    elif kind == "constant_value":
        constants = [n for n in _nodes(model) if n.op_type == "Constant" and n.attribute]
        if constants:
            _mutate_attribute(rng.choice(constants), "attribute_value", rng)
        else:  # add one whose value is damaged, feeding nothing
            value = onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(
                helper.make_tensor("c", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])), "c")
            value.raw_data = value.raw_data[: rng.choice([3, 5, 15])]
            model.graph.node.insert(0, helper.make_node("Constant", [], ["fuzz_const"], value=value))
    else:
        _mutate_graph_level(model, kind, rng)
