"""What the graph says about an output: the op that makes it, the range it is bounded to, the
quantization grid it lies on. Each walks back from a graph output through ops that move values
without changing them: PASS_THROUGH, the one set, plus what each question may also look through."""

from __future__ import annotations

import numpy as np

# Ops that move values without changing them: every walk below looks through these.
PASS_THROUGH = frozenset({"Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"})
# ... a range is also kept by ops that pick, repeat or cast values (a Sigmoid's [0, 1] stays [0, 1]),
RANGE_KEEPING = PASS_THROUGH | {"Cast", "Slice", "Gather", "Split", "Expand", "Tile", "MaxPool", "Resize", "Upsample"}
# ... a DequantizeLinear's grid by ops that pick values, join them or clip them to the grid,
GRID_KEEPING = PASS_THROUGH | {"Slice", "Gather", "Split", "Concat", "MaxPool", "Relu", "Clip"}
# ... and the op that makes an output is read through casts and Q/DQ (a QDQ model's Softmax is still one).
MAKER_HIDING = PASS_THROUGH | {"Cast", "DequantizeLinear", "QuantizeLinear"}

# Ops whose output range is bounded whatever the input.
BOUNDED = {"Sigmoid": (0.0, 1.0), "HardSigmoid": (0.0, 1.0), "Softmax": (0.0, 1.0), "Tanh": (-1.0, 1.0)}


def producers(proto) -> dict:
    return {out: node for node in proto.graph.node for out in node.output}


def walk_back(made_by: dict, name: str, through: frozenset | set, hops: int | None = None):
    """The first node behind ``name`` whose op is not in ``through`` (None: none, or the walk ran
    out of ``hops``); each step follows a node's first input."""
    node, seen = made_by.get(name), 0
    while node is not None:
        if hops is not None and seen >= hops:
            return None
        if node.op_type not in through or not node.input:
            return node
        node, seen = made_by.get(node.input[0]), seen + 1
    return None


def maker(proto, name: str) -> str | None:
    """The op that makes ``name``, looking through reshapes, transposes, casts and Q/DQ."""
    node = walk_back(producers(proto), name, MAKER_HIDING, hops=16)
    return node.op_type if node is not None else None


def output_bounds(proto) -> dict[str, tuple[float, float]]:
    """Graph outputs whose range the graph bounds: made by Sigmoid/Softmax/Tanh (through ops that
    only move or pick values)."""
    made_by = producers(proto)
    bounds = {}
    for value in proto.graph.output:
        node = walk_back(made_by, value.name, RANGE_KEEPING)
        if node is not None and node.op_type in BOUNDED and node.domain in ("", "ai.onnx"):
            bounds[value.name] = BOUNDED[node.op_type]
    return bounds


def output_ranges(proto) -> dict[str, float]:
    """Each graph output's calibrated range (scale x number of levels), from the DequantizeLinear
    that makes it (directly, or through GRID_KEEPING ops); outputs without one are absent."""
    from onnx import numpy_helper

    weights = {t.name: t for t in proto.graph.initializer}
    constants = {n.output[0]: n for n in proto.graph.node if n.op_type == "Constant" and n.output}

    def array(name: str):
        if name in weights:
            try:
                return numpy_helper.to_array(weights[name])
            except Exception:  # noqa: BLE001 - a scale kept in external data that is not loaded: no range
                return None
        node = constants.get(name)
        if node is not None:
            for attribute in node.attribute:
                if attribute.name == "value":
                    return numpy_helper.to_array(attribute.t)
        return None

    def levels(node) -> int:
        zero = array(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        data = array(node.input[0])
        kind = zero.dtype if zero is not None else (data.dtype if data is not None else np.dtype(np.uint8))
        return int(2 ** (8 * np.dtype(kind).itemsize) - 1)

    made_by = producers(proto)
    ranges = {}
    for output in proto.graph.output:
        node = walk_back(made_by, output.name, GRID_KEEPING, hops=8)
        if node is not None and node.op_type == "DequantizeLinear":
            scale = array(node.input[1])
            if scale is not None and scale.size:
                ranges[output.name] = float(np.max(np.abs(scale))) * levels(node)
    return ranges
