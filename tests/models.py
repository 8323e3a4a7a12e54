"""Tiny models for tests, built with onnx.helper. Each passes check_model(full_check=True)
unless its name says it is broken."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def make(
    graph: onnx.GraphProto, opset: int = OPSET, ir_version: int = 8, extra_opsets=(), check=True
) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
    if check:
        onnx.checker.check_model(model, full_check=True)
    return model


def relu(opset: int = OPSET, ir_version: int = 8) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    return make(graph, opset=opset, ir_version=ir_version, check=False)


def matmul_weights(rows: int = 32, cols: int = 16, seed: int = 0) -> onnx.ModelProto:
    """y = x @ W with W an initializer big enough to go to external data (> 1 KB)."""
    weight = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul")],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, cols])],
        initializer=[numpy_helper.from_array(weight, "W")],
    )
    return make(graph)


def contrib_op() -> onnx.ModelProto:
    """A com.microsoft FusedMatMul: runs on ORT only."""
    graph = helper.make_graph(
        [helper.make_node("FusedMatMul", ["a", "b"], ["y"], name="fused", domain="com.microsoft", alpha=1.0)],
        "contrib",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    return make(graph, extra_opsets=(("com.microsoft", 1),))


def broken_undefined_input() -> onnx.ModelProto:
    """Fails onnx.checker: the node reads a tensor nothing produces."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return make(graph, check=False)


def save_external(model: onnx.ModelProto, path: Path, location: str | None = None) -> Path:
    """Save with all tensors over 1 KB in one data file (named ``location``)."""
    location = location or f"{path.name}.data"
    data_path = path.parent / location
    if data_path.exists():
        data_path.unlink()
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=1024,
    )
    return path


def repoint_external(path: Path, new_location: str) -> None:
    """Rewrite every external-data location of a saved model (to build unsafe models)."""
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = new_location
    path.write_bytes(model.SerializeToString())


def symlink_supported(tmp: Path) -> bool:
    try:
        os.symlink(tmp, tmp / ".probe-link")
    except OSError:
        return False
    (tmp / ".probe-link").unlink()
    return True


def single_node(
    op: str,
    inputs: list[tuple[str, int, list]],
    outputs: list[tuple[str, int, list]],
    opset: int = OPSET,
    initializers=(),
    domain: str = "",
    check: bool = True,
    **attrs,
) -> onnx.ModelProto:
    """One node ``op`` reading graph inputs (name, elem type, shape) and writing graph outputs."""
    graph = helper.make_graph(
        [
            helper.make_node(
                op,
                [i[0] for i in inputs] + [t.name for t in initializers],
                [o[0] for o in outputs],
                name=op.lower(),
                domain=domain,
                **attrs,
            )
        ],
        op.lower(),
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
        initializer=list(initializers),
    )
    extra = ((domain, 1),) if domain else ()
    return make(graph, opset=opset, extra_opsets=extra, check=check)


def maxpool(storage_order: int = 0) -> onnx.ModelProto:
    return single_node(
        "MaxPool",
        [("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [("y", TensorProto.FLOAT, [1, 1, 2, 2])],
        kernel_shape=[2, 2],
        strides=[2, 2],
        storage_order=storage_order,
    )


def shape_then_cast() -> onnx.ModelProto:
    """Shape (never fused by DirectML) feeding a Cast; the batch dimension is dynamic, so ORT
    cannot fold the Shape away."""
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["s"], name="shape"),
            helper.make_node("Cast", ["s"], ["y"], name="cast", to=TensorProto.FLOAT),
        ],
        "shape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return make(graph)


def qdq_relu() -> onnx.ModelProto:
    """QuantizeLinear -> DequantizeLinear -> Relu: a QDQ-quantized graph."""
    scale = numpy_helper.from_array(np.array(0.1, dtype=np.float32), "scale")
    zero = numpy_helper.from_array(np.array(0, dtype=np.uint8), "zero")
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], name="quant"),
            helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["dq"], name="dequant"),
            helper.make_node("Relu", ["dq"], ["y"], name="relu"),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        initializer=[scale, zero],
    )
    return make(graph)


def diamond(middle_op: str = "Det") -> onnx.ModelProto:
    """a = Relu(x); b = middle(a); c = Add(a, b): the Relu and the Add both run on an EP that
    lacks ``middle_op``, but may not share a partition (the path through the CPU node would
    make a cycle)."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"], name="first"),
            helper.make_node(middle_op, ["a"], ["b0"], name="middle"),
            helper.make_node("Reshape", ["b0", "shape"], ["b"], name="reshape"),
            helper.make_node("Add", ["a", "b"], ["y"], name="last"),
        ],
        "diamond",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        initializer=[numpy_helper.from_array(np.array([1, 1], dtype=np.int64), "shape")],
    )
    return make(graph)


# ---------------------------------------------------------------- shapes that break naive FP16


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model17(graph):
    return make(graph)


def fp16_cast_in_attention() -> onnx.ModelProto:
    """Attention whose scores are Cast to float before Softmax (as exporters write it)."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["q"], name="q_proj"),
            helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1], name="transpose"),
            helper.make_node("MatMul", ["q", "qt"], ["scores"], name="qk"),
            helper.make_node("Cast", ["scores"], ["scores_f"], to=TensorProto.FLOAT, name="cast_scores"),
            helper.make_node("Softmax", ["scores_f"], ["probs"], axis=-1, name="softmax"),
            helper.make_node("MatMul", ["probs", "q"], ["y"], name="attend"),
        ],
        "cast_attention",
        [_vi("x", TensorProto.FLOAT, [1, 4, 8])],
        [_vi("y", TensorProto.FLOAT, [1, 4, 8])],
        [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32) * 0.3, "W")],
    )
    return _model17(graph)


def fp16_if_float_branches() -> onnx.ModelProto:
    """An If whose branches compute in float on an outer-scope tensor."""
    then_graph = helper.make_graph(
        [helper.make_node("Mul", ["h", "two"], ["a"], name="then_mul")],
        "then",
        [],
        [_vi("a", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array([2.0], np.float32), "two")],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Add", ["h", "one"], ["b"], name="else_add")],
        "else",
        [],
        [_vi("b", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array([1.0], np.float32), "one")],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["h"], name="relu"),
            helper.make_node("If", ["cond"], ["r"], then_branch=then_graph, else_branch=else_graph, name="branch"),
            helper.make_node("Sigmoid", ["r"], ["y"], name="sigmoid"),
        ],
        "if_float",
        [_vi("x", TensorProto.FLOAT, [4]), _vi("cond", TensorProto.BOOL, [])],
        [_vi("y", TensorProto.FLOAT, [4])],
    )
    return _model17(graph)


def fp16_resize_float_scales() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Resize", ["c", "", "scales"], ["r"], mode="linear", name="resize"),
            helper.make_node("Relu", ["r"], ["y"], name="relu"),
        ],
        "resize",
        [_vi("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [_vi("y", TensorProto.FLOAT, [1, 2, 8, 8])],
        [
            numpy_helper.from_array(rng.standard_normal((2, 2, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
        ],
    )
    return _model17(graph)


def fp16_lstm_then_matmul_gemm(hidden: int = 8) -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    graph = helper.make_graph(
        [
            helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y", "Y_h"], hidden_size=hidden, name="lstm"),
            helper.make_node("Squeeze", ["Y_h", "axis0"], ["h"], name="squeeze"),
            helper.make_node("MatMul", ["h", "M"], ["m"], name="matmul"),
            helper.make_node("Gemm", ["m", "G", "g_bias"], ["y"], name="gemm"),
        ],
        "lstm",
        [_vi("x", TensorProto.FLOAT, [5, 1, 4])],
        [_vi("y", TensorProto.FLOAT, [1, 3])],
        [
            numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, 4)).astype(np.float32) * 0.3, "W"),
            numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32) * 0.3, "R"),
            numpy_helper.from_array(np.zeros((1, 8 * hidden), np.float32), "B"),
            numpy_helper.from_array(np.array([0], np.int64), "axis0"),
            numpy_helper.from_array(rng.standard_normal((hidden, 6)).astype(np.float32), "M"),
            numpy_helper.from_array(rng.standard_normal((6, 3)).astype(np.float32), "G"),
            numpy_helper.from_array(np.zeros(3, np.float32), "g_bias"),
        ],
    )
    return _model17(graph)


def fp16_overflowing_activations() -> onnx.ModelProto:
    """An L2 normalisation of x*1000: the squares reach millions, beyond FP16's 65504."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "big"], ["b"], name="scale_up"),
            helper.make_node("Mul", ["b", "b"], ["sq"], name="square"),
            helper.make_node("ReduceSum", ["sq", "axes"], ["s"], keepdims=1, name="sum"),
            helper.make_node("Sqrt", ["s"], ["n"], name="norm"),
            helper.make_node("Div", ["b", "n"], ["y"], name="normalize"),
        ],
        "overflow",
        [_vi("x", TensorProto.FLOAT, [1, 64])],
        [_vi("y", TensorProto.FLOAT, [1, 64])],
        [
            numpy_helper.from_array(np.array(1000.0, np.float32), "big"),
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
        ],
    )
    return _model17(graph)


def fp16_batchnorm_huge_variance() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("BatchNormalization", ["c", "s", "bb", "mean", "var"], ["y"], name="bn"),
        ],
        "bn_variance",
        [_vi("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [_vi("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [
            numpy_helper.from_array(rng.standard_normal((2, 2, 3, 3)).astype(np.float32) * 1000, "w"),
            numpy_helper.from_array(np.zeros(2, np.float32), "cb"),
            numpy_helper.from_array(np.ones(2, np.float32), "s"),
            numpy_helper.from_array(np.zeros(2, np.float32), "bb"),
            numpy_helper.from_array(np.zeros(2, np.float32), "mean"),
            numpy_helper.from_array(np.array([4e6, 9e6], np.float32), "var"),
        ],
    )
    return _model17(graph)


def fp16_cancellation() -> onnx.ModelProto:
    """y = x @ W1 - x @ W2 with W1 and W2 nearly equal: FP16 weights lose the difference."""
    rng = np.random.default_rng(4)
    w1 = rng.standard_normal((16, 16)).astype(np.float32)
    w2 = w1 + rng.standard_normal((16, 16)).astype(np.float32) * 1e-3
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W1"], ["a"], name="mm1"),
            helper.make_node("MatMul", ["x", "W2"], ["b"], name="mm2"),
            helper.make_node("Sub", ["a", "b"], ["y"], name="difference"),
        ],
        "cancellation",
        [_vi("x", TensorProto.FLOAT, [2, 16])],
        [_vi("y", TensorProto.FLOAT, [2, 16])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")],
    )
    return _model17(graph)


def tiny_weights() -> onnx.ModelProto:
    """A weight with values below FP16's smallest subnormal."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "eps"], ["y"], name="add_eps")],
        "tiny",
        [_vi("x", TensorProto.FLOAT, [1, 4])],
        [_vi("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array([1e-9, 2e-9, 0.5, 1.0], np.float32), "eps")],
    )
    return _model17(graph)


def outlier_sensitive(width: int = 64) -> onnx.ModelProto:
    """An MLP in which h = relu(x @ W0) @ W1 + bias carries one huge channel (bias 1000): a
    per-tensor 8-bit range for h has no room for the small values, and the readout W2 ignores
    the outlier channel, so its output depends on exactly those values. "readout" is the
    outlier-sensitive node; the layers around it quantize well."""
    rng = np.random.default_rng(6)

    def weight(rows, cols, scale):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    bias = np.zeros(width, np.float32)
    bias[0] = 1000.0
    w2 = weight(width, width, 0.1)
    w2[0, :] = 0.0
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W0"], ["a"], name="embed"),
            helper.make_node("Relu", ["a"], ["a_act"], name="embed_relu"),
            helper.make_node("MatMul", ["a_act", "W1"], ["m"], name="project"),
            helper.make_node("Add", ["m", "bias"], ["h"], name="add_outlier"),
            helper.make_node("MatMul", ["h", "W2"], ["r"], name="readout"),
            helper.make_node("Relu", ["r"], ["r_act"], name="readout_relu"),
            helper.make_node("MatMul", ["r_act", "W3"], ["y"], name="head"),
        ],
        "outlier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [
            numpy_helper.from_array(weight(width, width, 0.2), "W0"),
            numpy_helper.from_array(weight(width, width, 0.1), "W1"),
            numpy_helper.from_array(bias, "bias"),
            numpy_helper.from_array(w2, "W2"),
            numpy_helper.from_array(weight(width, 8, 0.2), "W3"),
        ],
    )
    return make(graph)


def zipmap_classifier() -> onnx.ModelProto:
    """What skl2onnx writes for a classifier: LinearClassifier, then ZipMap into a sequence of
    maps {class: probability} (a non-tensor output)."""
    nodes = [
        helper.make_node("LinearClassifier", ["X"], ["label", "scores"], domain="ai.onnx.ml", name="linear",
                         classlabels_ints=[0, 1, 2], coefficients=[0.5, -0.2, 0.1, 0.3] * 3,
                         intercepts=[0.1, -0.1, 0.0], multi_class=0, post_transform="SOFTMAX"),
        helper.make_node("ZipMap", ["scores"], ["probabilities"], domain="ai.onnx.ml", name="zipmap",
                         classlabels_int64s=[0, 1, 2]),
    ]
    map_type = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    graph = helper.make_graph(
        nodes, "classifier", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
         helper.make_value_info("probabilities", helper.make_sequence_type_proto(map_type))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
                              ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def fp16_loop_gemm_body() -> onnx.ModelProto:
    """A Loop whose body ends in a Gemm reading outer-scope weights (an RNN cell written as a Loop)."""
    rng = np.random.default_rng(7)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond"], ["cond_out"], name="body/cond"),
            helper.make_node("Tanh", ["v_in"], ["t"], name="body/tanh"),
            helper.make_node("Gemm", ["t", "W", "b"], ["v_out"], name="/fc/Gemm"),
        ],
        "body",
        [_vi("i", TensorProto.INT64, []), _vi("cond", TensorProto.BOOL, []), _vi("v_in", TensorProto.FLOAT, [1, 8])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("v_out", TensorProto.FLOAT, [1, 8])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "Win"], ["h"], name="embed"),
            helper.make_node("Loop", ["trip", "", "h"], ["v"], body=body, name="loop"),
            helper.make_node("Gemm", ["v", "Wout", "bout"], ["y"], name="head"),
        ],
        "loop_gemm",
        [_vi("x", TensorProto.FLOAT, [1, 4])],
        [_vi("y", TensorProto.FLOAT, [1, 3])],
        [
            numpy_helper.from_array(np.array(3, np.int64), "trip"),
            numpy_helper.from_array((rng.standard_normal((4, 8)) * 0.5).astype(np.float32), "Win"),
            numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.4).astype(np.float32), "W"),
            numpy_helper.from_array(np.zeros(8, np.float32), "b"),
            numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "Wout"),
            numpy_helper.from_array(np.zeros(3, np.float32), "bout"),
        ],
    )
    return _model17(graph)


def fp16_batchnorm_far_beyond_range() -> onnx.ModelProto:
    """A detector-style head: Conv -> Relu -> BatchNormalization whose mean and variance are far
    beyond FP16 (as Paddle exports carry) -> Sigmoid. onnxconverter-common clamps both to 65504,
    which drives every logit far negative: its FP16 output is all zeros."""
    rng = np.random.default_rng(8)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("BatchNormalization", ["r", "s", "bb", "mean", "var"], ["n"], name="bn"),
            helper.make_node("Sigmoid", ["n"], ["y"], name="head"),
        ],
        "bn_beyond",
        [_vi("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [_vi("y", TensorProto.FLOAT, [1, 2, 16, 16])],
        [
            numpy_helper.from_array((rng.standard_normal((2, 3, 3, 3)) * 3000).astype(np.float32), "w"),
            numpy_helper.from_array(np.zeros(2, np.float32), "cb"),
            numpy_helper.from_array(np.full(2, 40.0, np.float32), "s"),
            numpy_helper.from_array(np.full(2, 36.0, np.float32), "bb"),
            numpy_helper.from_array(np.array([2e5, 3e5], np.float32), "mean"),
            numpy_helper.from_array(np.array([4e10, 9e10], np.float32), "var"),
        ],
    )
    return _model17(graph)


def near_zero_detector() -> onnx.ModelProto:
    """A score map whose Sigmoid sits near 0 unless the input has strong structure: on random
    noise the output barely moves (about 1e-5), so cosine against it means nothing."""
    rng = np.random.default_rng(9)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Sigmoid", ["c"], ["y"], name="head"),
        ],
        "near_zero",
        [_vi("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [_vi("y", TensorProto.FLOAT, [1, 1, 16, 16])],
        [
            numpy_helper.from_array((rng.standard_normal((1, 3, 3, 3)) * 0.05).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([-12.0], np.float32), "b"),
        ],
    )
    return _model17(graph)


def fp16_cast_pair_output() -> onnx.ModelProto:
    """An output rounded through float16 and back (Cast to float16, Cast to float), as exports of
    mixed-precision models write it: onnxconverter-common raises on it when the I/O becomes FP16."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Cast", ["r"], ["h"], to=TensorProto.FLOAT16, name="to_half"),
            helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT, name="to_float"),
        ],
        "cast_pair",
        [_vi("x", TensorProto.FLOAT, [1, 4])],
        [_vi("y", TensorProto.FLOAT, [1, 4])],
    )
    return _model17(graph)


def conv_classifier(width: int = 32) -> onnx.ModelProto:
    """A small image classifier whose file is mostly Conv weights (about 60 KB)."""
    rng = np.random.default_rng(10)

    def weight(*shape):
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
            helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
            helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"),
            helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
            helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], name="conv3"),
            helper.make_node("GlobalAveragePool", ["c3"], ["p"], name="pool"),
            helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
            helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1, name="fc"),
        ],
        "conv_classifier",
        [_vi("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [_vi("logits", TensorProto.FLOAT, [1, 10])],
        [
            numpy_helper.from_array(weight(width // 2, 3, 3, 3), "w1"),
            numpy_helper.from_array(np.zeros(width // 2, np.float32), "b1"),
            numpy_helper.from_array(weight(width, width // 2, 3, 3), "w2"),
            numpy_helper.from_array(np.zeros(width, np.float32), "b2"),
            numpy_helper.from_array(weight(width, width, 3, 3), "w3"),
            numpy_helper.from_array(np.zeros(width, np.float32), "b3"),
            numpy_helper.from_array(weight(10, width), "wf"),
            numpy_helper.from_array(np.zeros(10, np.float32), "bf"),
        ],
    )
    return _model17(graph)


def vit_like(layers: int = 4, hidden: int = 64, tokens: int = 16, seed: int = 11, outliers: float = 60.0,
             sharpness: float = 2.0, decomposed_norm: bool = False) -> onnx.ModelProto:
    """A small ViT-style encoder: patch embedding, `layers` pre-norm blocks (LayerNormalization,
    single-head attention with a sharp Softmax, a Relu MLP, residual Adds), a final norm and a
    classifier head. Like trained ViTs, the residual stream carries a few outlier channels (large
    constant offsets) that LayerNormalization removes again: a per-tensor 8-bit range for the
    residual has little room left for the other channels. With ``decomposed_norm`` each
    LayerNormalization is written out (ReduceMean, Sub, Mul, Sqrt, Div...) as exports below opset 17
    write it."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []

    def add(name, values):
        inits.append(numpy_helper.from_array(np.asarray(values, np.float32), name))
        return name

    def weight(name, rows, cols, scale=1.0):
        return add(name, rng.standard_normal((rows, cols)) * scale / np.sqrt(rows))

    outlier = np.zeros(hidden, np.float32)
    outlier[[3, 17]] = [outliers, -0.75 * outliers]
    # LayerNormalization weights nearly zero on the outlier channels (as trained ViTs learn them)
    norm_weight = np.ones(hidden, np.float32)
    norm_weight[[3, 17]] = 0.01
    def norm(source: str, out: str, name: str) -> list[onnx.NodeProto]:
        w, b = add(f"{out}.w", norm_weight), add(f"{out}.b", np.zeros(hidden))
        if not decomposed_norm:
            return [helper.make_node("LayerNormalization", [source, w, b], [out], axis=-1, name=name)]
        eps = add(f"{out}.eps", np.array(1e-5))
        return [
            helper.make_node("ReduceMean", [source], [f"{out}.mu"], axes=[-1], name=f"{name}/mean"),
            helper.make_node("Sub", [source, f"{out}.mu"], [f"{out}.d"], name=f"{name}/sub"),
            helper.make_node("Mul", [f"{out}.d", f"{out}.d"], [f"{out}.d2"], name=f"{name}/square"),
            helper.make_node("ReduceMean", [f"{out}.d2"], [f"{out}.var"], axes=[-1], name=f"{name}/var"),
            helper.make_node("Add", [f"{out}.var", eps], [f"{out}.ve"], name=f"{name}/add_eps"),
            helper.make_node("Sqrt", [f"{out}.ve"], [f"{out}.sd"], name=f"{name}/sqrt"),
            helper.make_node("Div", [f"{out}.d", f"{out}.sd"], [f"{out}.n"], name=f"{name}/div"),
            helper.make_node("Mul", [f"{out}.n", w], [f"{out}.nw"], name=f"{name}/scale"),
            helper.make_node("Add", [f"{out}.nw", b], [out], name=f"{name}/shift"),
        ]

    nodes = [
        helper.make_node("MatMul", ["patches", weight("embed.w", 48, hidden)], ["e"], name="embed"),
        helper.make_node("Add", ["e", add("embed.b", outlier)], ["h0"], name="embed_bias"),
    ]
    stream = "h0"
    for i in range(layers):
        p = f"l{i}"
        nodes += [
            *norm(stream, f"{p}.ln1", f"{p}/ln1"),
            helper.make_node(
                "MatMul", [f"{p}.ln1", weight(f"{p}.q.w", hidden, hidden, sharpness)], [f"{p}.q"], name=f"{p}/q"
            ),
            helper.make_node(
                "MatMul", [f"{p}.ln1", weight(f"{p}.k.w", hidden, hidden, sharpness)], [f"{p}.k"], name=f"{p}/k"
            ),
            helper.make_node("MatMul", [f"{p}.ln1", weight(f"{p}.v.w", hidden, hidden)], [f"{p}.v"], name=f"{p}/v"),
            helper.make_node("Transpose", [f"{p}.k"], [f"{p}.kt"], perm=[0, 2, 1], name=f"{p}/kt"),
            helper.make_node("MatMul", [f"{p}.q", f"{p}.kt"], [f"{p}.s"], name=f"{p}/qk"),
            helper.make_node("Softmax", [f"{p}.s"], [f"{p}.a"], axis=-1, name=f"{p}/softmax"),
            helper.make_node("MatMul", [f"{p}.a", f"{p}.v"], [f"{p}.c"], name=f"{p}/attend"),
            helper.make_node("MatMul", [f"{p}.c", weight(f"{p}.o.w", hidden, hidden)], [f"{p}.o"], name=f"{p}/o"),
            helper.make_node("Add", [stream, f"{p}.o"], [f"{p}.r1"], name=f"{p}/residual1"),
            *norm(f"{p}.r1", f"{p}.ln2", f"{p}/ln2"),
            helper.make_node(
                "MatMul", [f"{p}.ln2", weight(f"{p}.f1.w", hidden, 2 * hidden)], [f"{p}.f1"], name=f"{p}/ffn1"
            ),
            helper.make_node("Relu", [f"{p}.f1"], [f"{p}.g"], name=f"{p}/relu"),
            helper.make_node(
                "MatMul", [f"{p}.g", weight(f"{p}.f2.w", 2 * hidden, hidden)], [f"{p}.f2"], name=f"{p}/ffn2"
            ),
            helper.make_node("Add", [f"{p}.r1", f"{p}.f2"], [f"{p}.out"], name=f"{p}/residual2"),
        ]
        stream = f"{p}.out"
    nodes += [
        *norm(stream, "final", "final_norm"),
        helper.make_node("ReduceMean", ["final"], ["pooled"], axes=[1], keepdims=0, name="pool"),
        helper.make_node("MatMul", ["pooled", weight("head.w", hidden, 10)], ["logits"], name="head"),
    ]
    graph = helper.make_graph(
        nodes, "vit_like",
        [_vi("patches", TensorProto.FLOAT, [1, tokens, 48])],
        [_vi("logits", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    return _model17(graph)



def conv_bn_uneven_channels(channels: int = 64) -> onnx.ModelProto:
    """Conv -> BatchNormalization whose per-channel scales span 1e-3 to 1 -> Relu -> a Mul that
    undoes the spread -> a 1x1 Conv. ORT's pre-processing folds the BN into the first Conv, whose
    weights then span 1000x: 8-bit per-tensor weights wipe out the small channels. Quantized as
    given, the first Conv's weights are even and the BN, Relu and Mul stay float (dynamic
    quantization only quantizes Conv and MatMul)."""
    rng = np.random.default_rng(12)
    spread = np.geomspace(1e-3, 1.0, channels).astype(np.float32)
    weight = (rng.standard_normal((channels, 3, 3, 3)) / np.sqrt(27)).astype(np.float32)
    mix = (rng.standard_normal((channels, channels, 1, 1)) / np.sqrt(channels)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("BatchNormalization", ["c", "s", "bb", "mean", "var"], ["n"], name="bn"),
            helper.make_node("Relu", ["n"], ["r"], name="relu"),
            helper.make_node("Mul", ["r", "undo"], ["u"], name="undo_scale"),
            helper.make_node("Conv", ["u", "w2", "b2"], ["y"], name="mix"),
        ],
        "conv_bn_uneven",
        [_vi("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [_vi("y", TensorProto.FLOAT, [1, channels, 16, 16])],
        [
            numpy_helper.from_array(weight, "w"),
            numpy_helper.from_array(np.zeros(channels, np.float32), "b"),
            numpy_helper.from_array(spread, "s"),
            numpy_helper.from_array(np.zeros(channels, np.float32), "bb"),
            numpy_helper.from_array(np.zeros(channels, np.float32), "mean"),
            numpy_helper.from_array(np.ones(channels, np.float32), "var"),
            numpy_helper.from_array((1.0 / spread).reshape(channels, 1, 1), "undo"),
            numpy_helper.from_array(mix, "w2"),
            numpy_helper.from_array(np.zeros(channels, np.float32), "b2"),
        ],
    )
    return _model17(graph)


def bias_after_conv_transpose(folder: Path, identity_after: bool = False) -> tuple[Path, Path]:
    """x -> ConvTranspose (8 -> 8, 2x2, stride 2, no bias) -> Identity -> Add [1, 8, 1, 1]
    [-> Identity] -> Relu -> Conv -> y, as Paddle exports a detector head (PP-OCR's), and 16
    calibration samples in folder/calib."""
    rng = np.random.default_rng(0)
    after = [helper.make_node("Identity", ["ab"], ["abi"], name="id2")] if identity_after else []
    graph = helper.make_graph(
        [helper.make_node("ConvTranspose", ["x", "w1"], ["a"], strides=[2, 2], name="up"),
         helper.make_node("Identity", ["a"], ["ai"], name="id"),
         helper.make_node("Add", ["ai", "b"], ["ab"], name="bias"),
         *after,
         helper.make_node("Relu", ["abi" if identity_after else "ab"], ["r"], name="relu"),
         helper.make_node("Conv", ["r", "w2"], ["y"], name="head")],
        "bias_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 32, 32])],
        [numpy_helper.from_array((rng.standard_normal((8, 8, 2, 2)) * 0.3).astype(np.float32), "w1"),
         numpy_helper.from_array((rng.standard_normal((1, 8, 1, 1)) * 0.1).astype(np.float32), "b"),
         numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32), "w2")])
    return saved_with_samples(make(graph, opset=17, ir_version=8), Path(folder) / "bias_head.onnx",
                              [{"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)} for _ in range(16)])


def conv_batch_norm(folder: Path) -> tuple[Path, Path]:
    """x [1, 16, 1, 40] -> Conv (16 -> 48, 1x1) -> BatchNormalization -> Relu -> y, as Paddle exports
    a recogniser's neck (PP-OCR's), and 16 calibration samples in folder/calib."""
    rng = np.random.default_rng(0)
    channels = 48
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"], name="bn"),
         helper.make_node("Relu", ["n"], ["y"], name="relu")],
        "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 1, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 1, 40])],
        [numpy_helper.from_array((rng.standard_normal((channels, 16, 1, 1)) * 0.3).astype(np.float32), "w"),
         numpy_helper.from_array(rng.uniform(1.1, 4.6, channels).astype(np.float32), "gamma"),
         numpy_helper.from_array(rng.uniform(0.3, 3.0, channels).astype(np.float32), "beta"),
         numpy_helper.from_array(rng.uniform(-0.4, 0.4, channels).astype(np.float32), "mean"),
         numpy_helper.from_array(rng.uniform(0.2, 2.0, channels).astype(np.float32), "var")])
    return saved_with_samples(make(graph, opset=17, ir_version=8), Path(folder) / "conv_bn.onnx",
                              [{"x": rng.standard_normal((1, 16, 1, 40)).astype(np.float32)} for _ in range(16)])


def lstm_keywords(folder: Path, hidden: int = 64, features: int = 40, frames: int = 48, samples: int = 24
                  ) -> tuple[Path, Path]:
    """A keyword spotter at fixed shapes: band energies [1, frames, 40] -> Transpose -> ONNX LSTM ->
    last hidden state -> Reshape -> Gemm -> 8 logits; and ``samples`` calibration samples (smooth
    positive energies, as log bands are). QNN's HTP computes the LSTM a little otherwise than the
    CPU EP (cosine 0.99994 against the CPU EP's run of the same QDQ file, the logits at 0.998)."""
    rng = np.random.default_rng(21)
    bound = 1 / np.sqrt(hidden)
    bias = np.zeros((1, 8 * hidden), np.float32)
    bias[0, hidden:2 * hidden] = 1.0  # the forget gate opens at the start, as trained LSTMs do
    weights = [
        numpy_helper.from_array(rng.uniform(-bound, bound, (1, 4 * hidden, features)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.uniform(-bound, bound, (1, 4 * hidden, hidden)).astype(np.float32), "R"),
        numpy_helper.from_array(bias, "B"),
        numpy_helper.from_array(np.array([1, hidden], np.int64), "flat"),
        numpy_helper.from_array((rng.standard_normal((8, hidden)) * np.sqrt(2 / hidden)).astype(np.float32), "head.w"),
        numpy_helper.from_array(np.zeros(8, np.float32), "head.b"),
    ]
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["features"], ["time_major"], perm=[1, 0, 2], name="to_time_major"),
         helper.make_node("LSTM", ["time_major", "W", "R", "B"], ["", "last"], hidden_size=hidden, name="lstm"),
         helper.make_node("Reshape", ["last", "flat"], ["h"], name="flatten"),
         helper.make_node("Gemm", ["h", "head.w", "head.b"], ["logits"], transB=1, name="head")],
        "lstm_keywords", [_vi("features", TensorProto.FLOAT, [1, frames, features])],
        [_vi("logits", TensorProto.FLOAT, [1, 8])], weights)
    energies = [
        np.cumsum(rng.standard_normal((1, frames, features)) * 0.3, axis=1) + rng.uniform(2, 6, (1, 1, features))
        for _ in range(samples)
    ]
    return saved_with_samples(make(graph, opset=17, ir_version=9), Path(folder) / "lstm.onnx",
                              [{"features": energy.astype(np.float32)} for energy in energies])


def saved_with_samples(model: onnx.ModelProto, path: Path, samples: list[dict[str, np.ndarray]]) -> tuple[Path, Path]:
    """``model`` saved at ``path``, and ``samples`` as 000.npz, 001.npz ... in a calib folder beside it."""
    onnx.save_model(model, str(path))
    calib = path.parent / "calib"
    calib.mkdir()
    for index, sample in enumerate(samples):
        np.savez(calib / f"{index:03d}.npz", **sample)
    return path, calib


def variance_written_out(width: int = 32, rows: int = 64, clamp: bool = True) -> onnx.ModelProto:
    """A normalisation written out as a framework exports a LayerNorm: var = E[x^2] - E[x]^2, then
    (x - E[x]) / sqrt(var + eps), then a readout MatMul. Its inputs sit at an offset of about 10 with
    a spread of 0.3 (write with ``variance_inputs``): E[x^2] and E[x]^2 are both near 100 and their
    difference near 0.09, so 8-bit steps of either (about 0.4) swamp the variance, while each
    tensor's own rounding error is a fraction of a percent of its values. ``clamp=False``: no Relu
    before the square root, as most exports write it (a variance rounded below zero gives NaN)."""
    rng = np.random.default_rng(8)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], name="mean"),
            helper.make_node("Mul", ["mean", "mean"], ["mean_sq"], name="mean_square"),
            helper.make_node("Mul", ["x", "x"], ["x_sq"], name="square"),
            helper.make_node("ReduceMean", ["x_sq"], ["ex2"], axes=[-1], name="mean_of_squares"),
            helper.make_node("Sub", ["ex2", "mean_sq"], ["var"], name="variance"),
            helper.make_node("Relu" if clamp else "Identity", ["var"], ["var_pos"], name="clamp"),
            helper.make_node("Add", ["var_pos", "eps"], ["var_eps"], name="add_eps"),
            helper.make_node("Sqrt", ["var_eps"], ["std"], name="std"),
            helper.make_node("Sub", ["x", "mean"], ["centred"], name="centre"),
            helper.make_node("Div", ["centred", "std"], ["normed"], name="normalise"),
            helper.make_node("MatMul", ["normed", "W"], ["y"], name="readout"),
        ],
        "variance_written_out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, 8])],
        [
            numpy_helper.from_array(np.array(1e-3, np.float32), "eps"),
            numpy_helper.from_array((rng.standard_normal((width, 8)) * 0.3).astype(np.float32), "W"),
        ],
    )
    return make(graph, opset=13)


def variance_inputs(rng: np.random.Generator, count: int, width: int = 32, rows: int = 64) -> list[np.ndarray]:
    """Inputs for ``variance_written_out``: rows at an offset of 9-11 with a spread of 0.3."""
    return [(rng.uniform(9, 11, (1, rows, 1)) + 0.3 * rng.standard_normal((1, rows, width))).astype(np.float32)
            for _ in range(count)]


def power_spectrum_db(frames: int = 16) -> onnx.ModelProto:
    """An STFT-like front end in dB, as openWakeWord's mel model: two strided Convs (cosine and
    sine kernels), each squared, summed, a positive filter bank, a Clip floor, Log, dB. Fed audio
    in int16's scale, its power reaches ~1e11, beyond FP16's 65504."""
    taps, bins, bands, hop = 32, 9, 4, 16
    t = np.arange(taps)
    window = np.hanning(taps)
    real = np.stack([window * np.cos(2 * np.pi * k * t / taps) for k in range(bins)])[:, None, :].astype(np.float32)
    imag = np.stack([-window * np.sin(2 * np.pi * k * t / taps) for k in range(bins)])[:, None, :].astype(np.float32)
    bank = np.abs(np.random.default_rng(4).normal(size=(bins, bands))).astype(np.float32)
    samples = taps + hop * (frames - 1)
    graph = helper.make_graph(
        [
            helper.make_node("Unsqueeze", ["audio", "one"], ["a3"], name="channel"),
            helper.make_node("Conv", ["a3", "w_real"], ["re"], strides=[hop], name="stft_real"),
            helper.make_node("Conv", ["a3", "w_imag"], ["im"], strides=[hop], name="stft_imag"),
            helper.make_node("Pow", ["re", "two"], ["re2"], name="re_squared"),
            helper.make_node("Pow", ["im", "two"], ["im2"], name="im_squared"),
            helper.make_node("Add", ["re2", "im2"], ["power"], name="power"),
            helper.make_node("Transpose", ["power"], ["power_t"], perm=[0, 2, 1], name="frames_first"),
            helper.make_node("MatMul", ["power_t", "bank"], ["mel"], name="filter_bank"),
            helper.make_node("Clip", ["mel", "floor"], ["mel_floor"], name="floor"),
            helper.make_node("Log", ["mel_floor"], ["ln"], name="log"),
            helper.make_node("Mul", ["ln", "db"], ["out"], name="to_db"),
        ],
        "power_spectrum_db",
        [_vi("audio", TensorProto.FLOAT, [1, samples])],
        [_vi("out", TensorProto.FLOAT, [1, frames, bands])],
        [
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(real, "w_real"),
            numpy_helper.from_array(imag, "w_imag"),
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
            numpy_helper.from_array(bank, "bank"),
            numpy_helper.from_array(np.array(1e-10, np.float32), "floor"),
            numpy_helper.from_array(np.array(10 / np.log(10), np.float32), "db"),
        ],
    )
    return _model17(graph)


def conv_bn_beyond_fp16(channels: int = 8, size: int = 16, matmul: bool = False
                        ) -> tuple[onnx.ModelProto, np.ndarray]:
    """A float Conv (``matmul``: a MatMul of a [4, C] input) then a BatchNormalization of tiny
    variance (scale ~95), with its input: each alone stays within FP16, but ORT's ConvBNFusion
    (MatMul_BatchNormalization_Fusion) folds the scale into weights of 500-1000, past FP16's 65504.
    QNN's HTP computes a float model in FP16: with the fold its output saturates; without it
    (optimizations off, or the fusion left out) it matches the CPU EP."""
    rng = np.random.default_rng(0)
    shape = [4, channels] if matmul else [1, channels, size, size]
    weights = rng.uniform(500.0, 1000.0, (channels, channels) if matmul else (channels, channels, 3, 3))
    zeros, ones = np.zeros(channels, np.float32), np.ones(channels, np.float32)
    first = (helper.make_node("MatMul", ["x", "w"], ["c"], name="matmul") if matmul
             else helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"))
    graph = helper.make_graph(
        [first,
         helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["y"], epsilon=1e-5,
                          name="bn")],
        "conv_bn_beyond_fp16",
        [_vi("x", TensorProto.FLOAT, shape)],
        [_vi("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(weights.astype(np.float32), "w"), numpy_helper.from_array(ones, "gamma"),
         numpy_helper.from_array(zeros, "beta"), numpy_helper.from_array(zeros, "mean"),
         numpy_helper.from_array(np.full(channels, 1e-4, np.float32), "var")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = (rng.uniform(0.5, 1.0, shape) * 1e-3).astype(np.float32)
    return model, x


def erf_gelu(order: str = "half_first", divisor: float = float(np.sqrt(2.0)), dtype=np.float32,
             erf_alone: bool = False, scale: float | None = None) -> onnx.ModelProto:
    """A MatMul then GELU written out as PyTorch exports it: x * 0.5 * (1 + Erf(x / divisor)) (or
    Erf(x * scale)); ``order``: "half_first" ((x * 0.5) * (1 + erf)), "half_last" (x * (1 + erf) *
    0.5) or "root_last" ((1 + erf) * 0.5 * x); ``erf_alone``: MatMul, Erf only."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    rng = np.random.default_rng(2)
    if erf_alone:
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["h"], name="dense"),
             helper.make_node("Erf", ["h"], ["y"], name="gelu/erf")], "erf_alone",
            [_vi("x", elem, [1, 8, 16])], [_vi("y", elem, [1, 8, 16])],
            [numpy_helper.from_array(rng.normal(size=(16, 16)).astype(dtype), "w")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    tail = {"half_first": [helper.make_node("Mul", ["h", "half"], ["h_half"], name="gelu/half"),
                           helper.make_node("Mul", ["h_half", "e1"], ["y"], name="gelu/mul")],
            "half_last": [helper.make_node("Mul", ["h", "e1"], ["h_e1"], name="gelu/mul"),
                          helper.make_node("Mul", ["h_e1", "half"], ["y"], name="gelu/half")],
            "root_last": [helper.make_node("Mul", ["e1", "half"], ["e_half"], name="gelu/half"),
                          helper.make_node("Mul", ["e_half", "h"], ["y"], name="gelu/mul")]}[order]
    first = (helper.make_node("Div", ["h", "root2"], ["d"], name="gelu/div") if scale is None
             else helper.make_node("Mul", ["h", "root2"], ["d"], name="gelu/scale"))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="dense"), first,
         helper.make_node("Erf", ["d"], ["e"], name="gelu/erf"),
         helper.make_node("Add", ["e", "one"], ["e1"], name="gelu/add"), *tail],
        "erf_gelu",
        [_vi("x", elem, [1, 8, 16])],
        [_vi("y", elem, [1, 8, 16])],
        [numpy_helper.from_array(rng.normal(size=(16, 16)).astype(dtype), "w"),
         numpy_helper.from_array(np.array(divisor if scale is None else scale, dtype), "root2"),
         numpy_helper.from_array(np.array(1.0, dtype), "one"),
         numpy_helper.from_array(np.array(0.5, dtype), "half")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
