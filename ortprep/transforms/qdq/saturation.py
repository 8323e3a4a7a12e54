"""Activation encodings cut to the range their readers can tell apart, on a QDQ model's protos.

HardSwish is 0 for every input at or below -3, HardSigmoid is flat past both of its knees, and Relu
and Clip are flat past their bounds: an encoding that spends grid steps on values such a reader
maps to one output spends them on nothing. ORT's quantizer folds a Relu or Clip that follows a
Conv into the Conv's output range; it keeps a HardSwish's input on its calibrated range (a
PP-LCNet's Conv outputs reach -29 where HardSwish reads nothing below -3). Cutting the range to the
readers' knees (both ends kept on the grid past them) gives the readers the same outputs at every
value they distinguish, at a finer step; no calibration run. :func:`reader_bounds` also tells the
search's diagnostics which values of a tensor its readers tell apart. Measurements:
docs/decisions/acc-reader-ranges.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from ortprep.graphops import node_dependencies
from ortprep.transforms.qdq.encodings import BOUNDED_OUTPUT_OPS, VALUE_MOVES

# zero point types whose encodings this edits (activations; a per-tensor scale)
_ZERO_TYPES = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8,
               TensorProto.UINT16: np.uint16, TensorProto.INT16: np.int16}
# a cut that narrows the range by less than this share is left alone (nothing to gain)
MIN_GAIN = 0.01
_QDQ = ("QuantizeLinear", "DequantizeLinear")


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


@dataclass
class _Facts:
    """What the passes read of a graph: initializers, who reads each name (a node that captures it
    in a subgraph counts as a reader), who writes it, the graph outputs."""

    inits: dict
    readers: dict = field(default_factory=dict)
    producers: dict = field(default_factory=dict)
    outputs: set = field(default_factory=set)

    @classmethod
    def of(cls, graph: onnx.GraphProto) -> _Facts:
        facts = cls({t.name: t for t in graph.initializer}, outputs={v.name for v in graph.output})
        for node in graph.node:
            for name in node_dependencies(node):
                facts.readers.setdefault(name, []).append(node)
            for name in node.output:
                facts.producers[name] = node
        return facts

    def through(self, name: str, moves: bool = False) -> onnx.NodeProto | None:
        """The node that computes ``name``, looking back through Q/DQ (and value moves)."""
        node = self.producers.get(name)
        for _ in range(32):
            if node is None or not (node.op_type in _QDQ or moves and node.op_type in VALUE_MOVES):
                return node
            node = self.producers.get(node.input[0])
        return None


def _written_out_hard_swish(node: onnx.NodeProto, read: set[str], facts: _Facts) -> tuple[float, float] | None:
    """A Mul of the tensor and its own HardSigmoid (HardSwish written out, as ORT's pre-processing
    leaves it): 0 wherever the HardSigmoid is, so flat below its lower knee; None otherwise.
    ``read``: the names under which the tensor reaches its readers."""
    if node.op_type != "Mul" or len(node.input) != 2 or sum(name in read for name in node.input) != 1:
        return None
    other = node.input[1] if node.input[0] in read else node.input[0]
    gate = facts.through(other)
    if gate is None or gate.op_type != "HardSigmoid" or gate.input[0] not in read:
        return None
    bounds = knees(gate, facts.inits)
    return (bounds[0], math.inf) if bounds is not None else None


def _bounds_of(quantizer: onnx.NodeProto, facts: _Facts) -> tuple[float, float] | None:
    """The range the readers of ``quantizer``'s pair tell apart, or None where any reader (or a
    graph output, or a subgraph) takes every value."""
    dequantizers = facts.readers.get(quantizer.output[0], [])
    if not dequantizers or quantizer.output[0] in facts.outputs or any(
            d.op_type != "DequantizeLinear" or d.input[0] != quantizer.output[0] or d.output[0] in facts.outputs
            for d in dequantizers):
        return None
    read = {d.output[0] for d in dequantizers}
    users = [u for d in dequantizers for u in facts.readers.get(d.output[0], [])]
    bounds = [_written_out_hard_swish(u, read, facts) or knees(u, facts.inits) for u in users]
    if not users or any(b is None for b in bounds):
        return None
    low, high = min(b[0] for b in bounds), max(b[1] for b in bounds)
    return (low, high) if math.isfinite(low) or math.isfinite(high) else None


def reader_bounds(proto: onnx.ModelProto) -> dict[str, tuple[float, float]]:
    """tensor (the input of its QuantizeLinear) -> the range its readers tell apart, for every
    activation whose dequantized readers are all flat past known bounds (:func:`knees`; a Mul by
    its own HardSigmoid): the values a comparison of that tensor should hold the encoding to."""
    facts = _Facts.of(proto.graph)
    found = {}
    for node in proto.graph.node:
        if node.op_type == "QuantizeLinear" and node.input and node.input[0] not in facts.inits:
            bounds = _bounds_of(node, facts)
            if bounds is not None:
                found[node.input[0]] = bounds
    return found


def _cut(step: float, point: int, dtype, low: float, high: float) -> tuple[np.float32, int] | None:
    """The encoding (step, zero point) whose range is the old one cut to [low, high], each end at
    or past its bound (a value at a knee still reads as the knee) and 0 on the grid; None where the
    cut gains less than MIN_GAIN."""
    info = np.iinfo(dtype)
    old_low, old_high = (info.min - point) * step, (info.max - point) * step
    new_low, new_high = max(old_low, low), min(old_high, high)
    if not new_high > new_low or new_high - new_low > (1.0 - MIN_GAIN) * (old_high - old_low):
        return None
    new_low, new_high = min(new_low, 0.0), max(new_high, 0.0)  # 0 stays on the grid
    new_step = (new_high - new_low) / (info.max - info.min)
    new_point = int(np.clip(math.ceil(info.min - new_low / new_step - 1e-9), info.min, info.max))
    if new_point < info.max:  # the zero point rounded up lowered the top end: widen the step to cover it
        new_step = max(new_step, new_high / (info.max - new_point))
    # stored in float32: rounded up, so that both ends stay at or past their bounds
    return np.nextafter(np.float32(new_step), np.float32(np.inf)), new_point


def _symmetric(point: int, dtype) -> bool:
    """A zero point at the grid's middle: an encoding written symmetric (CUDA's, TensorRT's presets,
    NNCF's performance preset), which the cut would make asymmetric."""
    info = np.iinfo(dtype)
    return point == (0 if info.min < 0 else (info.max + 1) // 2)


def cut_to_readers(path: Path, symmetric: bool = False) -> list[str]:
    """Cut, in place, each activation encoding of :func:`reader_bounds` to its readers' range.
    Left as they are: every encoding where the preset asks symmetric ones (``symmetric``) and each
    symmetric one, per-channel ones, a scale or zero point another pair or op shares, the fixed
    encodings of bounded ops' outputs (Sigmoid, Tanh, Softmax, HardSigmoid: QNN imposes them).
    Returns the tensors cut. No reader is a weighted op, so no bias's scale changes."""
    if symmetric:
        return []
    proto = onnx.load(str(path), load_external_data=False)
    facts = _Facts.of(proto.graph)
    cut = []
    for node in proto.graph.node:
        if node.op_type != "QuantizeLinear" or len(node.input) < 3 or node.input[0] in facts.inits:
            continue
        scale_name, zero_name = node.input[1], node.input[2]
        scale_t, zero_t = facts.inits.get(scale_name), facts.inits.get(zero_name)
        if scale_t is None or zero_t is None or zero_t.data_type not in _ZERO_TYPES \
                or scale_t.data_type != TensorProto.FLOAT \
                or any(t.data_location == TensorProto.EXTERNAL for t in (zero_t, scale_t)):
            continue
        bounds = _bounds_of(node, facts)
        if bounds is None:
            continue
        dequantizers = facts.readers[node.output[0]]
        if any(list(d.input[1:3]) != [scale_name, zero_name] for d in dequantizers):
            continue
        pair = {id(node), *(id(d) for d in dequantizers)}
        if any(id(r) not in pair for name in (scale_name, zero_name) for r in facts.readers.get(name, [])):
            continue  # shared: another pair (or op) would move with it
        maker = facts.through(node.input[0], moves=True)
        if maker is not None and maker.op_type in BOUNDED_OUTPUT_OPS:
            continue  # its encoding is fixed by the EP (presets' fixed_output_encodings)
        scale, zero = onnx.numpy_helper.to_array(scale_t), onnx.numpy_helper.to_array(zero_t)
        dtype = _ZERO_TYPES[zero_t.data_type]
        if scale.size != 1 or zero.size != 1 or not float(scale.ravel()[0]) > 0 \
                or _symmetric(int(zero.ravel()[0]), dtype):
            continue
        edited = _cut(float(scale.ravel()[0]), int(zero.ravel()[0]), dtype, *bounds)
        if edited is None:
            continue
        step, point = edited
        scale_t.CopyFrom(onnx.numpy_helper.from_array(np.array(step, np.float32).reshape(scale.shape), scale_name))
        zero_t.CopyFrom(onnx.numpy_helper.from_array(np.array(point, dtype).reshape(zero.shape), zero_name))
        cut.append(node.input[0])
    if cut:
        onnx.save(proto, str(path))
    return cut
