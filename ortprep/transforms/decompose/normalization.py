"""LayerNormalization and GroupNormalization as reductions: mean, centred square mean, divide by
sqrt(var + epsilon), then scale and bias. Float32 only: the ops compute in float32 whatever their
input (stash_type), so a float16 decomposition would not be the same function."""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, TensorProto

from ortprep.transforms.decompose.base import Decomposition, Emitter, attr, schema_since

NORM_OPS = ("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div")


def _normalize(x: str, axes: list[int], epsilon: float, emit: Emitter) -> str:
    centred = emit.node("Sub", [x, emit.reduce_mean(x, axes)])
    variance = emit.reduce_mean(emit.node("Mul", [centred, centred]), axes)
    deviation = emit.node("Sqrt", [emit.node("Add", [variance, emit.const(epsilon)])])
    return emit.node("Div", [centred, deviation])


def _layer_norm(node: NodeProto, emit: Emitter) -> bool:
    facts = emit.facts(node.input[0])
    if facts.elem_type != TensorProto.FLOAT or any(name for name in node.output[1:]):
        return False  # float32 only; Mean / InvStdDev outputs read by something: left as it is
    axis = attr(node, "axis", -1)
    if axis < 0:
        axes = list(range(axis, 0))
    elif facts.shape is not None:
        axes = list(range(axis, len(facts.shape)))
    else:
        return False
    normalized = _normalize(node.input[0], axes, attr(node, "epsilon", 1e-5), emit)
    has_bias = len(node.input) > 2 and node.input[2]
    scaled = emit.node("Mul", [normalized, node.input[1]], out=None if has_bias else node.output[0])
    if has_bias:
        emit.node("Add", [scaled, node.input[2]], out=node.output[0])
    return True


def _rms_norm(node: NodeProto, emit: Emitter) -> bool:
    """x / Sqrt(mean(x^2) + epsilon) * scale, over the axes from ``axis`` on."""
    facts = emit.facts(node.input[0])
    if facts.elem_type != TensorProto.FLOAT:
        return False
    axis = attr(node, "axis", -1)
    if axis < 0:
        axes = list(range(axis, 0))
    elif facts.shape is not None:
        axes = list(range(axis, len(facts.shape)))
    else:
        return False
    x = node.input[0]
    square_mean = emit.reduce_mean(emit.node("Mul", [x, x]), axes)
    root = emit.node("Sqrt", [emit.node("Add", [square_mean, emit.const(attr(node, "epsilon", 1e-5))])])
    emit.node("Mul", [emit.node("Div", [x, root]), node.input[1]], out=node.output[0])
    return True


def _group_norm(node: NodeProto, emit: Emitter) -> bool:
    """Reshape to (N, groups, -1), normalize over the last axis, reshape back, then the per-channel
    scale and bias (opset 18's per-group ones repeated over each group's channels)."""
    facts = emit.facts(node.input[0])
    shape = facts.shape
    if facts.elem_type != TensorProto.FLOAT or shape is None or len(shape) < 3 or shape[1] is None:
        return False
    groups, channels = attr(node, "num_groups", None), shape[1]
    if not groups or channels % groups:
        return False
    per_group = schema_since("GroupNormalization", emit.opset) == 18
    gathered = emit.node("Reshape", [node.input[0], emit.const([0, groups, -1], np.int64)])
    normalized = _normalize(gathered, [2], attr(node, "epsilon", 1e-5), emit)
    if all(d is not None for d in shape[1:]):
        back = emit.const([0, *shape[1:]], np.int64)
    else:
        back = emit.node("Shape", [node.input[0]])
    restored = emit.node("Reshape", [normalized, back])
    ones = [1] * (len(shape) - 2)
    affine = []
    for name in node.input[1:3]:
        value = emit.values(name)
        if value is None:
            if per_group:
                return False  # a per-group tensor computed at run time: not repeated here
            affine.append(emit.node("Reshape", [name, emit.const([channels, *ones], np.int64)]))
            continue
        value = np.repeat(value, channels // groups) if per_group else value
        affine.append(emit.const(value.reshape(channels, *ones), value.dtype))
    emit.node("Add", [emit.node("Mul", [restored, affine[0]]), affine[1]], out=node.output[0])
    return True


NORMALIZATIONS = (
    Decomposition("layernorm-reduce", "LayerNormalization", NORM_OPS, (17, None), _layer_norm,
                  "(x - mean) / Sqrt(var + epsilon) * scale + bias, the means by ReduceMean"),
    Decomposition("rmsnorm-reduce", "RMSNormalization", ("ReduceMean", "Mul", "Add", "Sqrt", "Div"), (23, None),
                  _rms_norm, "x / Sqrt(mean(x^2) + epsilon) * scale, the mean by ReduceMean"),
    Decomposition("groupnorm-reduce", "GroupNormalization", ("Reshape", "Shape", *NORM_OPS), (18, None),
                  _group_norm, "Reshape to (N, groups, -1), normalize over it, Reshape back, * scale + bias"),
)
