"""Activations as elementwise ops most EPs take: the hard (piecewise linear) ones as Mul/Add/Clip, the
exponential ones around Exp of a value clamped to at most 0 (so nothing overflows), Softplus in its
safe form max(x, 0) + log(1 + exp(-|x|))."""

from __future__ import annotations

import numpy as np
from onnx import NodeProto

from ortprep.transforms.decompose.base import Decomposition, Emitter, attr

SOFTPLUS_OPS = ("Relu", "Abs", "Neg", "Exp", "Add", "Log")


def _hard_sigmoid(node: NodeProto, emit: Emitter) -> bool:
    scaled = emit.node("Mul", [node.input[0], emit.const(attr(node, "alpha", 0.2))])
    emit.clip01(emit.node("Add", [scaled, emit.const(attr(node, "beta", 0.5))]), out=node.output[0])
    return True


def _hard_swish_by_hard_sigmoid(node: NodeProto, emit: Emitter) -> bool:
    gate = emit.node("HardSigmoid", [node.input[0]], alpha=1.0 / 6.0, beta=0.5)
    emit.node("Mul", [node.input[0], gate], out=node.output[0])
    return True


def _hard_swish_by_clip(node: NodeProto, emit: Emitter) -> bool:
    scaled = emit.node("Mul", [node.input[0], emit.const(1.0 / 6.0)])
    gate = emit.clip01(emit.node("Add", [scaled, emit.const(0.5)]))
    emit.node("Mul", [node.input[0], gate], out=node.output[0])
    return True


def safe_softplus(x: str, emit: Emitter, out: str | None = None) -> str:
    """log(1 + exp(x)) as max(x, 0) + log(1 + exp(-|x|)): Exp never sees a positive value."""
    tail = emit.node("Exp", [emit.node("Neg", [emit.node("Abs", [x])])])
    soft = emit.node("Log", [emit.node("Add", [tail, emit.const(1.0)])])
    return emit.node("Add", [emit.node("Relu", [x]), soft], out=out)


def _softplus(node: NodeProto, emit: Emitter) -> bool:
    safe_softplus(node.input[0], emit, out=node.output[0])
    return True


def _mish_by_softplus(node: NodeProto, emit: Emitter) -> bool:
    soft = emit.node("Softplus", [node.input[0]])
    emit.node("Mul", [node.input[0], emit.node("Tanh", [soft])], out=node.output[0])
    return True


def _mish_safe(node: NodeProto, emit: Emitter) -> bool:
    soft = safe_softplus(node.input[0], emit)
    emit.node("Mul", [node.input[0], emit.node("Tanh", [soft])], out=node.output[0])
    return True


def _negative_part(x: str, emit: Emitter, alpha: float, divide: float | None = None) -> str:
    """alpha * (exp(min(x, 0) [/ divide]) - 1): zero for x >= 0, Exp of a value <= 0."""
    low = emit.node("Min", [x, emit.const(0.0)])
    if divide is not None and divide != 1.0:
        low = emit.node("Div", [low, emit.const(divide)])
    part = emit.node("Sub", [emit.node("Exp", [low]), emit.const(1.0)])
    return part if alpha == 1.0 else emit.node("Mul", [part, emit.const(alpha)])


def _elu(node: NodeProto, emit: Emitter) -> bool:
    x = node.input[0]
    emit.node("Add", [emit.node("Relu", [x]), _negative_part(x, emit, attr(node, "alpha", 1.0))], out=node.output[0])
    return True


def _celu(node: NodeProto, emit: Emitter) -> bool:
    x, alpha = node.input[0], attr(node, "alpha", 1.0)
    emit.node("Add", [emit.node("Relu", [x]), _negative_part(x, emit, alpha, divide=alpha)], out=node.output[0])
    return True


def _selu(node: NodeProto, emit: Emitter) -> bool:
    x = node.input[0]
    alpha, gamma = attr(node, "alpha", 1.67326319217681884765625), attr(node, "gamma", 1.05070102214813232421875)
    inner = emit.node("Add", [emit.node("Relu", [x]), _negative_part(x, emit, alpha)])
    emit.node("Mul", [inner, emit.const(gamma)], out=node.output[0])
    return True


def _thresholded_relu(node: NodeProto, emit: Emitter) -> bool:
    x = node.input[0]
    above = emit.node("Greater", [x, emit.const(attr(node, "alpha", 1.0))])
    emit.node("Where", [above, x, emit.const(0.0)], out=node.output[0])
    return True


def _softsign(node: NodeProto, emit: Emitter) -> bool:
    x = node.input[0]
    emit.node("Div", [x, emit.node("Add", [emit.node("Abs", [x]), emit.const(1.0)])], out=node.output[0])
    return True


def _prelu_as_leaky(node: NodeProto, emit: Emitter) -> bool:
    """Only where the slope is a constant with one value (a per-channel slope stays PRelu)."""
    slope = emit.values(node.input[1])
    if slope is None or slope.size == 0 or not np.all(slope == slope.flat[0]):
        return False
    emit.node("LeakyRelu", [node.input[0]], out=node.output[0], alpha=float(slope.flat[0]))
    return True


def _swish(node: NodeProto, emit: Emitter) -> bool:
    x, alpha = node.input[0], attr(node, "alpha", 1.0)
    scaled = x if alpha == 1.0 else emit.node("Mul", [x, emit.const(alpha)])
    emit.node("Mul", [x, emit.node("Sigmoid", [scaled])], out=node.output[0])
    return True


def _clip_by_max_min(node: NodeProto, emit: Emitter) -> bool:
    """Clip(x, low, high) as Min(Max(x, low), high), for an EP that takes Clip only with constant
    bounds (QNN: its 80-dB floor, a ReduceMax less 80, leaves openWakeWord's mel front end's Clip
    on the CPU EP) but Max and Min of two tensors."""
    low = node.input[1] if len(node.input) > 1 and node.input[1] else None
    high = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if low is None and high is None:
        return False  # no bounds: nothing a Max or Min would do
    if high is None:
        emit.node("Max", [node.input[0], low], out=node.output[0])
    elif low is None:
        emit.node("Min", [node.input[0], high], out=node.output[0])
    else:
        emit.node("Min", [emit.node("Max", [node.input[0], low]), high], out=node.output[0])
    return True


ACTIVATIONS = (
    Decomposition("clip-max-min", "Clip", ("Max", "Min"), (11, None), _clip_by_max_min, "Min(Max(x, low), high)"),
    Decomposition("hardsigmoid-clip", "HardSigmoid", ("Mul", "Add", "Clip"), (11, None), _hard_sigmoid,
                  "Clip(alpha * x + beta, 0, 1)"),
    Decomposition("hardswish-hardsigmoid", "HardSwish", ("HardSigmoid", "Mul"), (14, None),
                  _hard_swish_by_hard_sigmoid, "x * HardSigmoid(x; alpha 1/6, beta 0.5)"),
    Decomposition("hardswish-clip", "HardSwish", ("Mul", "Add", "Clip"), (14, None), _hard_swish_by_clip,
                  "x * Clip(x / 6 + 0.5, 0, 1)"),
    Decomposition("softplus-safe", "Softplus", SOFTPLUS_OPS, (7, None), _softplus,
                  "Relu(x) + Log(1 + Exp(-Abs(x)))"),
    Decomposition("mish-softplus", "Mish", ("Softplus", "Tanh", "Mul"), (18, None), _mish_by_softplus,
                  "x * Tanh(Softplus(x))"),
    Decomposition("mish-safe", "Mish", (*SOFTPLUS_OPS, "Tanh", "Mul"), (18, None), _mish_safe,
                  "x * Tanh(Relu(x) + Log(1 + Exp(-Abs(x))))"),
    Decomposition("elu-exp", "Elu", ("Relu", "Min", "Exp", "Sub", "Mul", "Add"), (8, None), _elu,
                  "Relu(x) + alpha * (Exp(Min(x, 0)) - 1)"),
    Decomposition("celu-exp", "Celu", ("Relu", "Min", "Div", "Exp", "Sub", "Mul", "Add"), (12, None), _celu,
                  "Relu(x) + alpha * (Exp(Min(x, 0) / alpha) - 1)"),
    Decomposition("selu-exp", "Selu", ("Relu", "Min", "Exp", "Sub", "Mul", "Add"), (8, None), _selu,
                  "gamma * (Relu(x) + alpha * (Exp(Min(x, 0)) - 1))"),
    Decomposition("thresholdedrelu-where", "ThresholdedRelu", ("Greater", "Where"), (10, None), _thresholded_relu,
                  "Where(x > alpha, x, 0)"),
    Decomposition("softsign-div", "Softsign", ("Abs", "Add", "Div"), (7, None), _softsign, "x / (1 + Abs(x))"),
    Decomposition("prelu-leakyrelu", "PRelu", ("LeakyRelu",), (7, None), _prelu_as_leaky,
                  "LeakyRelu(x; alpha = the slope), where the slope is one constant"),
    Decomposition("swish-sigmoid", "Swish", ("Sigmoid", "Mul"), (24, None), _swish, "x * Sigmoid(alpha * x)"),
)
