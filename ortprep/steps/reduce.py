"""Reducing a session that an EP refuses to the nodes that cause it (check --prove).

Each probe is a model of its own holding some of the main graph's nodes, built on a worker as
the failing session was; the search keeps the smallest set that still fails."""

from __future__ import annotations

from typing import Any

from ortprep.analysis import skeleton
from ortprep.model import ModelHandle


# At most this many probe sessions when a session is reduced to its culprit (each 0.2-0.4 s on the
# QNN simulator, measured): two binary searches over the node order need 2 * log2(nodes).
MAX_PROBES = 40


def window_model(proto, start: int, end: int, shapes: dict[str, Any]):
    """The main graph's nodes start..end (inclusive, node order) as a model of their own: what
    they read from outside becomes a graph input (typed from shape inference), what they make and
    something after them (or the graph) reads becomes an output. None when a value's type is unknown."""
    from onnx import ModelProto, helper

    nodes = list(proto.graph.node)[start:end + 1]
    made = {out for node in nodes for out in node.output if out}
    initializers = {t.name: t for t in proto.graph.initializer}
    needed, inputs = [], []
    for node in nodes:
        for name in node.input:
            if name and name not in made and name not in needed:
                needed.append(name)
    for name in needed:
        if name in initializers:
            continue
        if name not in shapes:
            return None
        inputs.append(shapes[name])
    later = {name for node in list(proto.graph.node)[end + 1:] for name in node.input} | {o.name for o in proto.graph.output}
    outputs = [shapes[name] if name in shapes else helper.make_empty_tensor_value_info(name)
               for node in nodes for name in node.output if name and name in later]
    if not outputs:
        outputs = [shapes.get(nodes[-1].output[0]) or helper.make_empty_tensor_value_info(nodes[-1].output[0])]
    graph = helper.make_graph(nodes, "window", inputs, outputs, [initializers[n] for n in needed if n in initializers])
    model = ModelProto()
    model.CopyFrom(helper.make_model(graph, opset_imports=list(proto.opset_import), ir_version=proto.ir_version))
    return model


def reduce_failure(handle: ModelHandle, fails) -> dict[str, Any] | None:
    """The shortest run of nodes (in node order) whose own session still fails, found by two
    binary searches: the first end at which a prefix fails, then the last start at which the
    window up to that end still fails. ``fails(model_path)`` builds the session and answers
    (failed?, message). Bounded by MAX_PROBES sessions; None when the graph cannot be cut
    (control flow, values of unknown type) or no window fails alone."""
    import tempfile
    import time

    import onnx

    proto = handle.proto
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in proto.graph.node for a in n.attribute):
        return None
    inferred = onnx.shape_inference.infer_shapes(skeleton(proto))  # types only: no weight bytes copied
    shapes = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    weights = {t.name: onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in proto.graph.initializer}
    count = len(proto.graph.node)
    started, probes, messages = time.perf_counter(), [0], {}
    with tempfile.TemporaryDirectory(prefix="ortprep-reduce-") as tmp:

        def probe(start: int, end: int) -> bool:
            if probes[0] >= MAX_PROBES:
                raise TimeoutError
            model = window_model(proto, start, end, shapes)
            if model is None:
                return False
            path = f"{tmp}/w{start}_{end}.onnx"
            onnx.save(model, path)
            probes[0] += 1
            failed, message = fails(path)
            if failed:
                messages[(start, end)] = message
            return failed

        try:
            low, high = 0, count - 1  # the first end whose prefix fails
            if not probe(0, high):
                return None
            while low < high:
                middle = (low + high) // 2
                if probe(0, middle):
                    high = middle
                else:
                    low = middle + 1
            end = high
            low, high = 0, end  # the last start whose window to `end` still fails
            while low < high:
                middle = (low + high + 1) // 2
                if probe(middle, end):
                    low = middle
                else:
                    high = middle - 1
            start = low
        except TimeoutError:
            return {"nodes": [], "probes": probes[0], "seconds": round(time.perf_counter() - started, 2),
                    "stopped": f"after {MAX_PROBES} probe sessions"}
    nodes = list(proto.graph.node)[start:end + 1]
    described = []
    for node in nodes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        described.append({"name": node.name, "op_type": node.op_type,
                          "attributes": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in attrs.items()
                                         if isinstance(v, (int, float, str, list, tuple))},
                          "inputs": [_describe(shapes.get(name) or weights.get(name)) for name in node.input if name]})
    message = messages.get((start, end)) or next(iter(messages.values()), "")
    return {"nodes": described, "probes": probes[0], "seconds": round(time.perf_counter() - started, 2), "message": message}


def _describe(value) -> str:
    """dtype[dims] of a value_info, or "?"."""
    if value is None or not value.type.HasField("tensor_type"):
        return "?"
    import onnx

    tensor = value.type.tensor_type
    dims = ",".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim)
    return f"{onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else '?'}[{dims}]"
