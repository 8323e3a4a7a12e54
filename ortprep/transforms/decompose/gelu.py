"""Gelu (ONNX opset 20, and ORT's com.microsoft Gelu and FastGelu, which its optimizer fuses from the
Erf and Tanh patterns) written back as those patterns."""

from __future__ import annotations

import math

from onnx import NodeProto

from ortprep.transforms.decompose.base import Decomposition, Emitter, attr


def _erf_form(x: str, emit: Emitter, out: str) -> None:
    """0.5 * x * (1 + Erf(x / sqrt 2))."""
    erf = emit.node("Erf", [emit.node("Mul", [x, emit.const(1.0 / math.sqrt(2.0))])])
    half = emit.node("Mul", [x, emit.const(0.5)])
    emit.node("Mul", [half, emit.node("Add", [erf, emit.const(1.0)])], out=out)


def _tanh_form(x: str, emit: Emitter, out: str) -> None:
    """0.5 * x * (1 + Tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))."""
    cube = emit.node("Mul", [emit.node("Mul", [x, x]), x])
    inner = emit.node("Add", [x, emit.node("Mul", [cube, emit.const(0.044715)])])
    tanh = emit.node("Tanh", [emit.node("Mul", [inner, emit.const(math.sqrt(2.0 / math.pi))])])
    half = emit.node("Mul", [x, emit.const(0.5)])
    emit.node("Mul", [half, emit.node("Add", [tanh, emit.const(1.0)])], out=out)


def _gelu_erf(node: NodeProto, emit: Emitter) -> bool:
    if attr(node, "approximate", "none") != "none":
        return False
    _erf_form(node.input[0], emit, node.output[0])
    return True


def _gelu_tanh(node: NodeProto, emit: Emitter) -> bool:
    if attr(node, "approximate", "none") != "tanh":
        return False
    _tanh_form(node.input[0], emit, node.output[0])
    return True


def _ms_gelu(node: NodeProto, emit: Emitter) -> bool:
    _erf_form(node.input[0], emit, node.output[0])
    return True


def _ms_fast_gelu(node: NodeProto, emit: Emitter) -> bool:
    x = node.input[0]
    if len(node.input) > 1 and node.input[1]:
        x = emit.node("Add", [x, node.input[1]])
    _tanh_form(x, emit, node.output[0])
    return True


GELU_ERF_OPS = ("Mul", "Erf", "Add")
GELU_TANH_OPS = ("Mul", "Add", "Tanh")

GELUS = (
    Decomposition("gelu-erf", "Gelu", GELU_ERF_OPS, (20, None), _gelu_erf, "0.5 * x * (1 + Erf(x / sqrt 2))"),
    Decomposition("gelu-tanh", "Gelu", GELU_TANH_OPS, (20, None), _gelu_tanh,
                  "0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 x^3))) (approximate='tanh')"),
    Decomposition("ms-gelu-erf", "Gelu", GELU_ERF_OPS, (9, None), _ms_gelu, "0.5 * x * (1 + Erf(x / sqrt 2))",
                  domain="com.microsoft"),
    Decomposition("ms-fastgelu-tanh", "FastGelu", GELU_TANH_OPS, (9, None), _ms_fast_gelu,
                  "0.5 * y * (1 + Tanh(sqrt(2/pi) * (y + 0.044715 y^3))), y = x + bias", domain="com.microsoft"),
)
