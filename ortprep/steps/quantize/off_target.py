"""Keeping off the target EP the nodes it computes otherwise than the CPU EP (quantize --ep, with
the gate judged on the EP, where the CPU EP passes and the EP alone fails).

Keeping such a node in float does not help where the EP computes float itself (QNN's HTP runs it
in float16, through the same kernels); keeping it off the EP does: :func:`keep_off_ep` moves it
into an If that ORT runs on the CPU EP, which computes it as the CPU side of the gate did.

The move (moves.keep_off_ep_move) tries, in order, each while the gate still fails: the node
where the EP first parts; the nodes alike to it (same op, their inputs made by the same ops) on
maps of its size; where it reads activations only, every node of its op that does; the alike
nodes on maps of any size. Each is one trial, judged on both EPs like every other trial.
Measurements behind this order: docs/decisions/reduce-quantize-off-ep.md.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from ortprep.analysis import skeleton
from ortprep.model import ModelHandle
from ortprep.transforms.off_ep import QDQ_OPS, CutError, keep_off_ep


def movable(proto: onnx.ModelProto) -> bool:
    """Whether nodes of this QDQ model can be kept off the EP: not in a model with external data."""
    return not any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)


def move_off_ep(path: Path, names: list[str]) -> str | None:
    """Keep ``names`` of the QDQ model at ``path`` (a trial's own file) off the EP, in place; the
    error where it cannot (a model with external data, a graph that cannot be cut there)."""
    proto = onnx.load(str(path), load_external_data=False)
    if not movable(proto):
        return "nodes are kept off the EP only in a model without external data"
    try:
        moved, _ = keep_off_ep(ModelHandle(proto=proto, path=None), names)
    except CutError as exc:
        return f"keeping {', '.join(names[:3])} off the EP: {exc}"
    onnx.save(moved, str(path))
    return None


def _real_producers(graph) -> dict[str, str]:
    """Value -> the op that computes it, looking through activation Q/DQ pairs (a DQ of a Q of X
    is X's producer); initializers and graph inputs: 'const' / 'input'."""
    producers = {out: node for node in graph.node for out in node.output}
    constants = {t.name for t in graph.initializer}

    def source(name: str) -> str:
        seen = 0
        while seen < 4:
            node = producers.get(name)
            if node is None:
                return "const" if name in constants else "input"
            if node.op_type not in QDQ_OPS:
                return node.op_type
            if node.input[0] in constants:
                return "const"
            name, seen = node.input[0], seen + 1
        return "?"

    return {value: source(value) for node in graph.node for value in node.input if value}


# what a node reads that is no activation (_real_producers' words)
WEIGHTS = ("const", "Constant")


def _shape_key(dims: list[int] | None) -> tuple | None:
    """A tensor's size without its channels (axis 1 of a rank >= 3 tensor): alike kernels on maps
    of the same size."""
    if dims is None:
        return None
    return tuple(dims[:1] + dims[2:]) if len(dims) >= 3 else tuple(dims)


def candidate_sets(model: Path, first: str, limit: int, where: str | None = None) -> list[tuple[str, list[str]]]:
    """(label, node names) for the move's trials, from the node ``first`` where the EP first parts
    in the QDQ model at ``model``: it alone; the nodes alike to it on maps of its size; where it
    reads two or more activations and no weight (an attention MatMul), every node of its op that
    does; the alike nodes on any maps. A set larger than ``limit`` nodes, or one already tried, is
    left out. ``where``: how ``first`` was found, in its set's label (where it first parts)."""
    proto = onnx.load(str(model), load_external_data=False)
    graph = proto.graph
    nodes = {node.name: node for node in graph.node}
    if first not in nodes:
        return []
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton(proto), strict_mode=False).graph
    except Exception:  # noqa: BLE001 - onnx raises several types; then sizes are unknown
        inferred = graph
    dims = {}
    for value in list(inferred.value_info) + list(inferred.output):
        shape = value.type.tensor_type.shape
        if value.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in shape.dim):
            dims[value.name] = [d.dim_value for d in shape.dim]
    made_by = _real_producers(graph)

    def signature(node) -> tuple:
        return node.op_type, node.domain, tuple(sorted(made_by.get(name, "?") for name in node.input if name))

    def size(node) -> tuple | None:  # that of the float value it computes (its output's Q reads it)
        return _shape_key(dims.get(node.output[0])) if node.output else None

    def computed_only(node) -> bool:  # every input an activation: no weight, no constant
        return all(made_by.get(name, "?") not in WEIGHTS for name in node.input if name)

    anchor = nodes[first]
    alike = [node.name for node in graph.node if node.op_type not in QDQ_OPS and signature(node) == signature(anchor)]
    same_size = [name for name in alike if size(nodes[name]) == size(anchor) and size(anchor) is not None]
    shown = "x".join(str(d) for d in (size(anchor) or ())[1:]) or "?"
    reads = " and ".join(signature(anchor)[2]) or "nothing computed"
    activations = ([node.name for node in graph.node if node.op_type == anchor.op_type and node.domain == anchor.domain
                    and computed_only(node)] if computed_only(anchor) and len(anchor.input) > 1 else [])
    sets = [(f"{first}, {where or 'where it first parts from the CPU EP'}", [first]),
            (f"the {len(same_size)} {anchor.op_type} node(s) alike to {first} (reading {reads}) on {shown} maps",
             same_size),
            (f"the {len(activations)} {anchor.op_type} node(s) that, as {first}, read activations only (no weight)",
             activations),
            (f"the {len(alike)} {anchor.op_type} node(s) alike to {first} (reading {reads}), any size", alike)]
    chosen: list[tuple[str, list[str]]] = []
    for label, names in sets:
        if names and len(names) <= limit and all(set(names) != set(other) for _, other in chosen):
            chosen.append((label, names))
    return chosen
