"""Activation encodings cut to the range their readers can tell apart, on a QDQ model's protos.

HardSwish is 0 for every input at or below -3, HardSigmoid is flat past both of its knees, and Relu
and Clip are flat past their bounds: an encoding that spends grid steps on values such a reader
maps to one output spends them on nothing. ORT's quantizer folds a Relu or Clip that follows a
Conv into the Conv's output range; it keeps a HardSwish's input on its calibrated range (a
PP-LCNet's Conv outputs reach -29 where HardSwish reads nothing below -3). Cutting the range to the
readers' knees gives the same outputs at every value and a finer step: exact, no calibration run.
Measurements: docs/decisions/acc-reader-ranges.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

# zero point types whose encodings this edits (activations; a per-tensor scale)
_ZERO_TYPES = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8,
               TensorProto.UINT16: np.uint16, TensorProto.INT16: np.int16}
# a cut that narrows the range by less than this share is left alone (nothing to gain)
MIN_GAIN = 0.01


def _attribute(node: onnx.NodeProto, name: str, default: float) -> float:
    return next((a.f for a in node.attribute if a.name == name), default)


def _constant(name: str, inits: dict) -> float | None:
    if not name or name not in inits:
        return None
    value = onnx.numpy_helper.to_array(inits[name])
    return float(value.ravel()[0]) if value.size == 1 else None


def knees(node: onnx.NodeProto, inits: dict) -> tuple[float, float] | None:
    """The input range outside which ``node``'s output no longer changes: (low, high), either
    infinite where it never saturates; None for an op that is not flat past a bound."""
    if node.op_type == "HardSwish":  # x * max(0, min(1, x / 6 + 1 / 2)): 0 at and below -3
        return -3.0, math.inf
    if node.op_type == "HardSigmoid":  # max(0, min(1, alpha * x + beta))
        alpha, beta = _attribute(node, "alpha", 0.2), _attribute(node, "beta", 0.5)
        if alpha <= 0:
            return None
        return -beta / alpha, (1.0 - beta) / alpha
    if node.op_type == "Relu":
        return 0.0, math.inf
    if node.op_type == "Clip":
        if any(a.name in ("min", "max") for a in node.attribute):  # opset < 11
            return _attribute(node, "min", -math.inf), _attribute(node, "max", math.inf)
        low = _constant(node.input[1], inits) if len(node.input) > 1 else None
        high = _constant(node.input[2], inits) if len(node.input) > 2 else None
        if (len(node.input) > 1 and node.input[1] and low is None) or \
                (len(node.input) > 2 and node.input[2] and high is None):
            return None  # a bound computed at run time
        return (-math.inf if low is None else low), (math.inf if high is None else high)
    return None


def _through_qdq(name: str, producers: dict) -> onnx.NodeProto | None:
    """The node that computes ``name``, looking back through QuantizeLinear/DequantizeLinear."""
    node = producers.get(name)
    for _ in range(8):
        if node is None or node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            return node
        node = producers.get(node.input[0])
    return None


def _written_out_hard_swish(node: onnx.NodeProto, read: set[str], producers: dict, inits: dict
                            ) -> tuple[float, float] | None:
    """A Mul of the tensor and its own HardSigmoid (HardSwish written out, as ORT's pre-processing
    leaves it): 0 wherever the HardSigmoid is, so flat below its lower knee; None otherwise.
    ``read``: the names under which the tensor reaches its readers."""
    if node.op_type != "Mul" or len(node.input) != 2 or sum(name in read for name in node.input) != 1:
        return None
    other = node.input[1] if node.input[0] in read else node.input[0]
    gate = _through_qdq(other, producers)
    if gate is None or gate.op_type != "HardSigmoid" or gate.input[0] not in read:
        return None
    bounds = knees(gate, inits)
    return (bounds[0], math.inf) if bounds is not None else None


def _cut(step: float, point: int, dtype, low: float, high: float) -> tuple[float, int] | None:
    """The encoding (step, zero point) whose range is the old one cut to [low, high], its lower
    end at or below ``low`` (so a value at the knee still reads as the knee) and 0 on the grid;
    None where the cut gains less than MIN_GAIN."""
    info = np.iinfo(dtype)
    old_low, old_high = (info.min - point) * step, (info.max - point) * step
    new_low, new_high = max(old_low, low), min(old_high, high)
    if not new_high > new_low or new_high - new_low > (1.0 - MIN_GAIN) * (old_high - old_low):
        return None
    new_low, new_high = min(new_low, 0.0), max(new_high, 0.0)  # 0 stays on the grid
    new_step = (new_high - new_low) / (info.max - info.min)
    new_point = int(np.clip(math.ceil(info.min - new_low / new_step - 1e-9), info.min, info.max))
    return new_step, new_point


def cut_to_readers(path: Path, symmetric: bool = False) -> list[str]:
    """Cut, in place, each activation encoding whose every reader (past its DequantizeLinear) is
    flat beyond known bounds (:func:`knees`: HardSwish, HardSigmoid, Relu, Clip; a Mul by the
    tensor's own HardSigmoid, HardSwish written out) to the widest of their ranges. Left as they
    are: symmetric encodings (``symmetric``: the preset asks zero points at 0), per-channel ones, a
    scale or zero point another pair or op shares, a tensor a graph output or any other op reads
    through the pair. Returns the tensors cut (the inputs of their QuantizeLinear nodes). No reader
    is a weighted op, so no bias's scale changes."""
    if symmetric:
        return []
    proto = onnx.load(str(path), load_external_data=False)
    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    outputs = {v.name for v in graph.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    producers = {out: node for node in graph.node for out in node.output}
    cut = []
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or len(node.input) < 3 or node.input[0] in inits:
            continue
        scale_name, zero_name = node.input[1], node.input[2]
        if scale_name not in inits or zero_name not in inits or node.output[0] in outputs:
            continue
        zero_t, scale_t = inits[zero_name], inits[scale_name]
        if zero_t.data_type not in _ZERO_TYPES or scale_t.data_type != TensorProto.FLOAT or any(
                t.data_location == TensorProto.EXTERNAL for t in (zero_t, scale_t)):
            continue
        dequantizers = readers.get(node.output[0], [])
        if not dequantizers or any(d.op_type != "DequantizeLinear" or list(d.input[1:3]) != [scale_name, zero_name]
                                   for d in dequantizers):
            continue
        pair = {id(node), *(id(d) for d in dequantizers)}
        if any(id(r) not in pair for name in (scale_name, zero_name) for r in readers.get(name, [])):
            continue  # shared: another pair (or op) would move with it
        users = [u for d in dequantizers for u in readers.get(d.output[0], [])]
        if not users or any(d.output[0] in outputs for d in dequantizers):
            continue
        read = {d.output[0] for d in dequantizers}
        bounds = [_written_out_hard_swish(u, read, producers, inits) or knees(u, inits) for u in users]
        if any(b is None for b in bounds):
            continue
        scale = onnx.numpy_helper.to_array(scale_t)
        zero = onnx.numpy_helper.to_array(zero_t)
        if scale.size != 1 or zero.size != 1 or not float(scale.ravel()[0]) > 0:
            continue
        dtype = _ZERO_TYPES[zero_t.data_type]
        edited = _cut(float(scale.ravel()[0]), int(zero.ravel()[0]), dtype,
                      min(b[0] for b in bounds), max(b[1] for b in bounds))
        if edited is None:
            continue
        step, point = edited
        scale_t.CopyFrom(onnx.numpy_helper.from_array(np.array(step, np.float32).reshape(scale.shape), scale_name))
        zero_t.CopyFrom(onnx.numpy_helper.from_array(np.array(point, dtype).reshape(zero.shape), zero_name))
        cut.append(node.input[0])
    if cut:
        onnx.save(proto, str(path))
    return cut
