"""Small graph utilities that understand subgraphs (If/Loop/Scan bodies read outer-scope values)."""

from __future__ import annotations

import heapq

import numpy as np
from onnx import GraphProto, NodeProto, TensorProto, helper, numpy_helper

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


class Constants:
    """A graph's constant values by name, read when first asked: initializers, and Constant nodes'
    ``value``, ``value_float(s)`` or ``value_int(s)``. An initializer also listed as a graph input
    is one a caller may feed: a constant only where ``fed_are_constant`` (ORT folds it as one when
    nothing is fed). Weights stored outside the file are not read (None)."""

    _ATTRIBUTES = ("value", "value_float", "value_floats", "value_int", "value_ints")

    def __init__(self, graph: GraphProto, fed_are_constant: bool = False) -> None:
        fed = set() if fed_are_constant else {value.name for value in graph.input}
        self._tensors = {t.name: t for t in graph.initializer if t.name not in fed}
        self._nodes = {node.output[0]: node for node in graph.node
                       if node.op_type == "Constant" and len(node.attribute) == 1
                       and node.attribute[0].name in self._ATTRIBUTES and node.output}
        self._read: dict[str, np.ndarray | None] = {}

    def get(self, name: str) -> np.ndarray | None:
        if name not in self._read:
            self._read[name] = self._value(name)
        return self._read[name]

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None

    def __getitem__(self, name: str) -> np.ndarray:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def _value(self, name: str) -> np.ndarray | None:
        tensor = self._tensors.get(name)
        if tensor is not None:
            return None if tensor.data_location == TensorProto.EXTERNAL else numpy_helper.to_array(tensor)
        node = self._nodes.get(name)
        if node is None:
            return None
        attribute = node.attribute[0]
        found = helper.get_attribute_value(attribute)
        if attribute.name == "value":
            return None if found.data_location == TensorProto.EXTERNAL else numpy_helper.to_array(found)
        return np.asarray(found, np.float32 if attribute.name.startswith("value_float") else np.int64)


def has_unnamed_nodes(graph: GraphProto) -> bool:
    """A main-graph node without a name: ORT's graph assignment cannot tell such nodes apart, so a
    session whose placement is read gets them labelled (SessionSpec.label_unnamed)."""
    return any(not node.name for node in graph.node)


def fresh_name(base: str, used: set[str]) -> str:
    """``base``, or ``base_2``, ``base_3``... the first not in ``used``; added to ``used``."""
    name, number = base, 1
    while name in used:
        number += 1
        name = f"{base}_{number}"
    used.add(name)
    return name


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


# ORT keeps an initializer larger than this many bytes as an OrtValue with an in-memory address
# marker (its utils::kSmallTensorExternalDataThreshold, 127), which its compile API then writes into
# a body's initializers and refuses to read back (onnxruntime issue 28158;
# docs/decisions/docs-epcontext-body-initializers.md).
SMALL_INITIALIZER_BYTES = 127


def tensor_bytes(tensor) -> int:
    """A TensorProto's size in bytes, from its dims and type (no data read)."""
    from onnx import helper

    count = 1
    for dim in tensor.dims:
        count *= dim
    try:
        return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return count * 8


def localize_body_initializers(graph: GraphProto, max_bytes: int | None = SMALL_INITIALIZER_BYTES) -> list[str]:
    """Copy into each If/Loop/Scan body of ``graph``'s nodes the initializers of ``graph`` it reads,
    of at most ``max_bytes`` each (under fresh names, its reads renamed, nested bodies included),
    and drop from ``graph`` the initializers nothing there reads any more. In place; returns the
    initializers copied.

    Why: ORT's EP-context writer (compile) keeps only the initializers that main-graph nodes read
    by name, so an If whose branches read a scale that the EP's partition shares was written
    without it and the compiled model did not load (docs/decisions/docs-epcontext-body-initializers.md).
    Larger ones (a Loop body's Conv weight) it fails on either way: read from the main graph
    they are dropped, copied into the body they are written as in-memory markers
    (SMALL_INITIALIZER_BYTES); they are left where they are."""
    inits = {t.name: t for t in graph.initializer if max_bytes is None or tensor_bytes(t) <= max_bytes}
    taken = set(inits) | {v.name for v in graph.input} | {v.name for v in graph.output}
    for node in graph.node:
        taken.update(node.input)
        taken.update(node.output)
    copied: list[str] = []
    for body, reads in _bodies_reading(graph, set(inits)):
        renamed = {}
        for name in reads:
            fresh, number = f"{name}_body", 1
            while fresh in taken:
                number += 1
                fresh = f"{name}_body{number}"
            taken.add(fresh)
            renamed[name] = fresh
            tensor = body.initializer.add()
            tensor.CopyFrom(inits[name])
            tensor.name = fresh
        _rename_reads(body, renamed)
        copied.extend(name for name in reads if name not in copied)
    if copied:
        read = {name for node in graph.node for name in node_dependencies(node)} | {v.name for v in graph.output}
        for tensor in [t for t in graph.initializer if t.name in copied and t.name not in read]:
            graph.initializer.remove(tensor)
    return copied


def body_weights(graph: GraphProto, min_bytes: int = SMALL_INITIALIZER_BYTES + 1) -> list[str]:
    """Initializers of ``graph`` of at least ``min_bytes`` that If/Loop/Scan bodies read from it
    (what ORT's EP-context writer cannot keep: localize_body_initializers)."""
    return _read_by_bodies(graph, lambda tensor: tensor_bytes(tensor) >= min_bytes)


def feed_body_weights(graph: GraphProto, min_bytes: int = SMALL_INITIALIZER_BYTES + 1) -> list[str]:
    """For each initializer of ``graph`` of at least ``min_bytes`` that If/Loop/Scan bodies read
    (body_weights), an Identity node first in ``graph`` that reads it, and the bodies read its output
    instead. In place; returns the initializers fed so.

    Why: ORT's EP-context writer keeps only the initializers that main-graph nodes read by name,
    and a large one copied into a body it writes as an in-memory marker (localize_body_initializers).
    Read by a main-graph node, it is kept (measured: docs/decisions/docs-epcontext-body-initializers.md)."""
    from onnx import helper

    names = body_weights(graph, min_bytes)
    if not names:
        return []
    used = {t.name for t in graph.initializer} | {v.name for v in graph.input} | {v.name for v in graph.output}
    for node in graph.node:
        used.update(node.input)
        used.update(node.output)
        used.add(node.name)
    renamed = {name: fresh_name(f"{name}_feed", used) for name in names}
    for body, reads in _bodies_reading(graph, set(names)):
        _rename_reads(body, {name: renamed[name] for name in reads})
    nodes = [helper.make_node("Identity", [name], [renamed[name]], name=renamed[name]) for name in names]
    nodes += list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return names


def small_body_reads(graph: GraphProto, max_bytes: int = SMALL_INITIALIZER_BYTES) -> list[str]:
    """What localize_body_initializers would copy (graph only: no weight is read)."""
    return _read_by_bodies(graph, lambda tensor: tensor_bytes(tensor) <= max_bytes)


def _read_by_bodies(graph: GraphProto, keep) -> list[str]:
    """Initializers of ``graph`` that ``keep(tensor)`` selects and If/Loop/Scan bodies read, in order."""
    names = {t.name for t in graph.initializer if keep(t)}
    found: list[str] = []
    for _, reads in _bodies_reading(graph, names):
        found.extend(name for name in reads if name not in found)
    return found


def _bodies_reading(graph: GraphProto, names: set[str]):
    """(body, the ``names`` it reads from ``graph``, sorted) for each If/Loop/Scan body of ``graph``'s
    nodes that reads any."""
    for node in graph.node:
        for _, body in subgraphs_of(node):
            reads = sorted(outer_scope_names(body) & names)
            if reads:
                yield body, reads


def _rename_reads(graph: GraphProto, renamed: dict[str, str]) -> None:
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        for _, body in subgraphs_of(node):
            _rename_reads(body, renamed)


# Initializers up to this size keep their values in the shape-inference skeleton (shape constants
# a Reshape reads); larger ones keep their dims only, so that no weight is copied.
_SKELETON_VALUES = 1024
_FLOAT_TYPES = (1, 10, 11, 16)  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


def intermediate_bytes(proto, input_shapes: dict[str, list[int]] | None = None, names: list[str] | None = None,
                       float_only: bool = False) -> dict[str, int | None]:
    """Bytes of each top-level node output (``names``, default all, in graph order) for one sample
    with the graph inputs set to ``input_shapes``, from onnx's shape inference (with data
    propagation) on a skeleton of the graph: weights reduced to their dims, so none is read or
    copied. None where a size is not known; 0 for a tensor that is not float where ``float_only``."""
    import numpy as np
    import onnx
    from onnx import helper

    graph = onnx.GraphProto(name=proto.graph.name)
    graph.node.extend(proto.graph.node)
    for value in proto.graph.input:
        shape = (input_shapes or {}).get(value.name)
        elem = value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0
        graph.input.append(helper.make_tensor_value_info(value.name, elem, [int(d) for d in shape])
                           if shape is not None and elem else value)
    for tensor in proto.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL and tensor_bytes(tensor) <= _SKELETON_VALUES:
            graph.initializer.append(tensor)
        else:
            graph.initializer.append(onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims))
    # onnx does not refine a graph output's declared type: each is read by an Identity that writes a
    # new output, so that its size is inferred like the others'
    for value in proto.graph.output:
        graph.node.append(helper.make_node("Identity", [value.name], [value.name + "__sized"]))
        graph.output.append(onnx.ValueInfoProto(name=value.name + "__sized"))
    skeleton = helper.make_model(graph, opset_imports=proto.opset_import, ir_version=proto.ir_version)
    wanted = [out for node in proto.graph.node for out in node.output if out] if names is None else names
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, data_prop=True)
    except Exception:  # noqa: BLE001 - no sizes known
        return {name: None for name in wanted}
    infos = {v.name: v for v in inferred.graph.value_info}
    sizes: dict[str, int | None] = {}
    for name in wanted:
        info = infos.get(name)
        if info is None or not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
            sizes[name] = None
            continue
        tensor = info.type.tensor_type
        if float_only and tensor.elem_type not in _FLOAT_TYPES:
            sizes[name] = 0
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        try:
            itemsize = helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
        except (KeyError, TypeError, ValueError):
            sizes[name] = None
            continue
        sizes[name] = None if any(d is None for d in dims) else int(np.prod(dims, dtype=np.int64)) * itemsize
    return sizes

