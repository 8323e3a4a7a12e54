"""What QNN's HTP computes otherwise than the CPU EP in a QDQ model, found from the model's
encodings alone (no weights are read): used by check (a QDQ model made elsewhere) and by quantize
(which raises the scales, transforms/qdq/encodings.floor_weight_scales)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import ModelProto

# QNN's HTP requantizes a Conv/MatMul output channel by the multiplier input_scale * weight_scale[c] /
# output_scale; below 2**-24 it puts out large values where the CPU EP gives 0
# (docs/decisions/docs-htp-min-multiplier.md).
HTP_MIN_MULTIPLIER = 2.0 ** -24
HTP_MULTIPLIER_FLOOR = 2.0 ** -23  # what the edit raises to: a factor 2 above the edge
WEIGHTED_OPS = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2, "MatMul": None}  # op -> index of its bias input


# QNN's HTP computes a MatMul of two 16-bit activations (A16 QDQ on both inputs, no weight) far less
# precisely than its 16-bit encodings carry; in FP16 it is close (docs/decisions/docs-htp-a16-matmul.md).
SIXTEEN_BIT = (onnx.TensorProto.UINT16, onnx.TensorProto.INT16)

# QNN's HTP computes an Add of a per-channel constant that reads a quantized ConvTranspose's output
# wrongly; folded into the ConvTranspose's bias it is right (docs/decisions/docs-htp-convtranspose-bias.md).


def conv_transpose_bias_adds(proto: ModelProto) -> list[str]:
    """The Add nodes of a QDQ model that add a constant per channel (or one value) to a quantized
    ConvTranspose's output (through its Q/DQ pair and any Identity), by name (why: the comment above)."""
    inits = {t.name: t for t in proto.graph.initializer}
    producers = {out: node for node in proto.graph.node for out in node.output}

    def source(name: str):
        node = producers.get(name)
        while node is not None and node.op_type in ("DequantizeLinear", "QuantizeLinear", "Identity"):
            if node.input[0] in inits:
                return "constant", inits[node.input[0]]
            node = producers.get(node.input[0])
        if node is None:
            return ("constant", inits[name]) if name in inits else ("input", None)
        return node.op_type, node

    found = []
    for node in proto.graph.node:
        if node.op_type != "Add" or len(node.input) != 2:
            continue
        kinds = [source(name) for name in node.input]
        ops = sorted(kind for kind, _ in kinds)
        if ops != ["ConvTranspose", "constant"]:
            continue
        conv = next(value for kind, value in kinds if kind == "ConvTranspose")
        maker = producers.get(conv.input[0])
        if maker is None or maker.op_type != "DequantizeLinear":
            continue  # a float ConvTranspose: the HTP computes it in FP16, unaffected
        constant = next(value for kind, value in kinds if kind == "constant")
        dims = [d for d in constant.dims if d != 1]
        if len(dims) <= 1:
            found.append(node.name)
    return found


# QNN's HTP computes a BatchNormalization quantized on its own (not folded into the Conv before it)
# wrongly (docs/decisions/docs-htp-batchnorm.md).


def quantized_batch_norms(proto: ModelProto) -> list[str]:
    """The BatchNormalization nodes of a QDQ model that read a DequantizeLinear (quantized on their
    own), by name (why: the comment above)."""
    producers = {out: node for node in proto.graph.node for out in node.output}
    return [node.name for node in proto.graph.node if node.op_type == "BatchNormalization" and node.input
            and (maker := producers.get(node.input[0])) is not None and maker.op_type == "DequantizeLinear"]


def sixteen_bit_activation_matmuls(proto: ModelProto) -> list[str]:
    """The MatMul nodes of a QDQ model whose two inputs are 16-bit activations (each the output of a
    DequantizeLinear of a computed tensor, with a 16-bit zero point), by name, in graph order."""
    inits = {t.name: t for t in proto.graph.initializer}
    producers = {out: node for node in proto.graph.node for out in node.output}

    def sixteen_bit_activation(name: str) -> bool:
        dq = producers.get(name)
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] in inits:
            return False
        zero = inits.get(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
        return zero is not None and zero.data_type in SIXTEEN_BIT

    return [node.name for node in proto.graph.node
            if node.op_type == "MatMul" and len(node.input) == 2 and all(map(sixteen_bit_activation, node.input))]


def _array(inits: dict, name: str) -> np.ndarray | None:
    """An initializer's values, or None where they are not here (not an initializer, or weights
    left out: external data, a check's skeleton)."""
    tensor = inits.get(name)
    if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    return onnx.numpy_helper.to_array(tensor)


def _scalar(inits: dict, name: str) -> float | None:
    value = _array(inits, name)
    return float(value.ravel()[0]) if value is not None and value.size == 1 else None


def small_multipliers(proto: ModelProto, bound: float = HTP_MIN_MULTIPLIER) -> list[dict]:
    """The weights of a QDQ model whose requantization multiplier (input scale x weight scale /
    output scale) falls below ``bound`` on some channel: [{"node", "weight", "channels", "smallest"}]
    with the weight DQ's node, its initializer, the channels below and the smallest multiplier."""
    return [{k: v for k, v in found.items() if not k.startswith("_")} for found in weight_multipliers(proto, bound)]


def weight_multipliers(proto: ModelProto, bound: float) -> list[dict]:
    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found = []
    for node in graph.node:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2:
            continue
        x_dq, w_dq = producers.get(node.input[0]), producers.get(node.input[1])
        readers = consumers.get(node.output[0], [])
        if (
            x_dq is None
            or w_dq is None
            or x_dq.op_type != "DequantizeLinear"
            or w_dq.op_type != "DequantizeLinear"
            or w_dq.input[0] not in inits
            or len(w_dq.input) < 2
            or w_dq.input[1] not in inits
            or len(readers) != 1
            or readers[0].op_type != "QuantizeLinear"
            or len(consumers.get(node.input[1], [])) != 1
        ):
            continue
        x_scale, y_scale = _scalar(inits, x_dq.input[1]), _scalar(inits, readers[0].input[1])
        if not x_scale or not y_scale:
            continue
        w_scale = _array(inits, w_dq.input[1])
        if w_scale is None:
            continue
        w_scale = w_scale.astype(np.float64)
        multipliers = x_scale * w_scale / y_scale
        low = multipliers < bound
        if not low.any():
            continue
        found.append({"node": node.name or node.output[0], "weight": w_dq.input[0], "channels": int(low.sum()),
                      "smallest": float(multipliers.min()), "_op": node, "_w_dq": w_dq, "_x_scale": x_scale,
                      "_y_scale": y_scale})
    return found
