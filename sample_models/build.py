"""Build the sample models in this folder, deterministically, with onnx.helper only.

    .venv/bin/python sample_models/build.py [OUT_DIR]

Every run writes byte-identical files (fixed seeds, fixed producer). Each model passes
onnx.checker.check_model(full_check=True). Together they stay well under 2 MB.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # loadable by every ORT release that supports opset 17
PRODUCER = "ortprep-sample-models"


def _model(graph: onnx.GraphProto, extra_opsets: tuple[tuple[str, int], ...] = ()) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name=PRODUCER)
    model.producer_version = "1"
    onnx.checker.check_model(model, full_check=True)
    return model


class Weights:
    """Seeded initializers, named in creation order."""

    def __init__(self, seed: int, dtype: type = np.float32) -> None:
        self.rng = np.random.default_rng(seed)
        self.dtype = dtype
        self.tensors: list[onnx.TensorProto] = []

    def add(self, name: str, shape: tuple[int, ...], scale: float = 0.1, offset: float = 0.0) -> str:
        values = (self.rng.standard_normal(shape) * scale + offset).astype(self.dtype)
        self.tensors.append(numpy_helper.from_array(values, name))
        return name

    def positive(self, name: str, shape: tuple[int, ...]) -> str:
        values = (self.rng.uniform(0.5, 1.5, shape)).astype(self.dtype)
        self.tensors.append(numpy_helper.from_array(values, name))
        return name

    def const(self, name: str, values: np.ndarray) -> str:
        self.tensors.append(numpy_helper.from_array(values, name))
        return name


def build_cnn(elem_type: int = TensorProto.FLOAT, dtype: type = np.float32) -> onnx.ModelProto:
    """Image classifier: Conv-BN-Relu twice, GlobalAveragePool, Flatten, Gemm. Static 1x3x32x32."""
    w = Weights(seed=1, dtype=dtype)
    nodes = []
    channels = [(3, 8, 1), (8, 16, 2)]
    x = "image"
    for index, (cin, cout, stride) in enumerate(channels, start=1):
        nodes.append(
            helper.make_node(
                "Conv",
                [x, w.add(f"conv{index}.weight", (cout, cin, 3, 3)), w.add(f"conv{index}.bias", (cout,))],
                [f"conv{index}"],
                name=f"conv{index}",
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[stride, stride],
            )
        )
        nodes.append(
            helper.make_node(
                "BatchNormalization",
                [
                    f"conv{index}",
                    w.positive(f"bn{index}.scale", (cout,)),
                    w.add(f"bn{index}.bias", (cout,)),
                    w.add(f"bn{index}.mean", (cout,)),
                    w.positive(f"bn{index}.var", (cout,)),
                ],
                [f"bn{index}"],
                name=f"bn{index}",
                epsilon=1e-5,
            )
        )
        nodes.append(helper.make_node("Relu", [f"bn{index}"], [f"relu{index}"], name=f"relu{index}"))
        x = f"relu{index}"
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["pooled"], name="gap"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten", axis=1),
        helper.make_node(
            "Gemm", ["flat", w.add("fc.weight", (10, 16)), w.add("fc.bias", (10,))], ["logits"], name="fc", transB=1
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("image", elem_type, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", elem_type, [1, 10])],
        initializer=w.tensors,
    )
    return _model(graph)


def build_conv1d_audio() -> onnx.ModelProto:
    """Audio-style classifier over 1-D signals: Conv1D, MaxPool1D, Conv1D, GlobalAveragePool, Gemm.
    Dynamic batch ("batch"); 1024 samples, 1 channel."""
    w = Weights(seed=2)
    nodes = [
        helper.make_node(
            "Conv",
            ["audio", w.add("conv1.weight", (8, 1, 9)), w.add("conv1.bias", (8,))],
            ["conv1"],
            name="conv1",
            kernel_shape=[9],
            pads=[4, 4],
            strides=[2],
        ),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("MaxPool", ["relu1"], ["pool1"], name="pool1", kernel_shape=[2], strides=[2]),
        helper.make_node(
            "Conv",
            ["pool1", w.add("conv2.weight", (16, 8, 5)), w.add("conv2.bias", (16,))],
            ["conv2"],
            name="conv2",
            kernel_shape=[5],
            pads=[2, 2],
        ),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["relu2"], ["pooled"], name="gap"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten", axis=1),
        helper.make_node(
            "Gemm", ["flat", w.add("fc.weight", (4, 16)), w.add("fc.bias", (4,))], ["scores"], name="fc", transB=1
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "conv1d_audio",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", 1, 1024])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4])],
        initializer=w.tensors,
    )
    return _model(graph)


def build_transformer_block(hidden: int = 64, ffn: int = 128) -> onnx.ModelProto:
    """One pre-norm transformer block, single head: LayerNormalization, attention with MatMul and
    Softmax, a Relu feed-forward, residual Adds. Dynamic "batch" and "sequence"."""
    w = Weights(seed=3)
    w.const("scale", np.array(1.0 / np.sqrt(hidden), dtype=np.float32))
    nodes = [
        helper.make_node(
            "LayerNormalization",
            ["hidden", w.positive("ln1.weight", (hidden,)), w.add("ln1.bias", (hidden,))],
            ["ln1"],
            name="ln1",
            axis=-1,
            epsilon=1e-5,
        )
    ]
    for proj in ("q", "k", "v"):
        nodes.append(
            helper.make_node(
                "MatMul", ["ln1", w.add(f"{proj}.weight", (hidden, hidden))], [f"{proj}_mm"], name=f"{proj}_proj"
            )
        )
        nodes.append(
            helper.make_node("Add", [f"{proj}_mm", w.add(f"{proj}.bias", (hidden,))], [proj], name=f"{proj}_bias")
        )
    nodes += [
        helper.make_node("Transpose", ["k"], ["k_t"], name="k_transpose", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "k_t"], ["scores"], name="qk"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale_scores"),
        helper.make_node("Softmax", ["scaled"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"], name="attend"),
        helper.make_node("MatMul", ["context", w.add("o.weight", (hidden, hidden))], ["attn_out"], name="o_proj"),
        helper.make_node("Add", ["hidden", "attn_out"], ["resid1"], name="residual1"),
        helper.make_node(
            "LayerNormalization",
            ["resid1", w.positive("ln2.weight", (hidden,)), w.add("ln2.bias", (hidden,))],
            ["ln2"],
            name="ln2",
            axis=-1,
            epsilon=1e-5,
        ),
        helper.make_node("MatMul", ["ln2", w.add("ffn1.weight", (hidden, ffn))], ["ffn1_mm"], name="ffn1"),
        helper.make_node("Add", ["ffn1_mm", w.add("ffn1.bias", (ffn,))], ["ffn1_out"], name="ffn1_bias"),
        helper.make_node("Relu", ["ffn1_out"], ["ffn_act"], name="ffn_relu"),
        helper.make_node("MatMul", ["ffn_act", w.add("ffn2.weight", (ffn, hidden))], ["ffn2_mm"], name="ffn2"),
        helper.make_node("Add", ["ffn2_mm", w.add("ffn2.bias", (hidden,))], ["ffn2_out"], name="ffn2_bias"),
        helper.make_node("Add", ["resid1", "ffn2_out"], ["output"], name="residual2"),
    ]
    graph = helper.make_graph(
        nodes,
        "transformer_block",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "sequence", hidden])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "sequence", hidden])],
        initializer=w.tensors,
    )
    return _model(graph)


def build_control_flow() -> onnx.ModelProto:
    """If (add 1 or double, chosen by a bool input) followed by a Loop that adds x three times."""
    vec = [4]
    then_graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["then_y"], name="then_add")],
        "then_branch",
        [],
        [helper.make_tensor_value_info("then_y", TensorProto.FLOAT, vec)],
        initializer=[numpy_helper.from_array(np.array([1.0], dtype=np.float32), "one")],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["else_y"], name="else_mul")],
        "else_branch",
        [],
        [helper.make_tensor_value_info("else_y", TensorProto.FLOAT, vec)],
        initializer=[numpy_helper.from_array(np.array([2.0], dtype=np.float32), "two")],
    )
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
            helper.make_node("Add", ["acc_in", "x"], ["acc_out"], name="body_add"),
        ],
        "loop_body",
        [
            helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, vec),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, vec),
        ],
    )
    nodes = [
        helper.make_node(
            "If", ["use_add"], ["branch_out"], name="choose", then_branch=then_graph, else_branch=else_graph
        ),
        helper.make_node("Loop", ["trip_count", "keep_going", "branch_out"], ["y"], name="repeat", body=body),
    ]
    graph = helper.make_graph(
        nodes,
        "control_flow",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, vec),
            helper.make_tensor_value_info("use_add", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, vec)],
        initializer=[
            numpy_helper.from_array(np.array(3, dtype=np.int64), "trip_count"),
            numpy_helper.from_array(np.array(True), "keep_going"),
        ],
    )
    return _model(graph)


CUSTOM_DOMAIN = "com.example.ortprep"


def build_custom_op() -> onnx.ModelProto:
    """Relu followed by an op from a custom domain that no ORT build implements."""
    nodes = [
        helper.make_node("Relu", ["x"], ["relu"], name="relu"),
        helper.make_node("FancyActivation", ["relu"], ["y"], name="fancy", domain=CUSTOM_DOMAIN, alpha=0.5),
    ]
    graph = helper.make_graph(
        nodes,
        "custom_op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    return _model(graph, extra_opsets=((CUSTOM_DOMAIN, 1),))


def build_mlp() -> onnx.ModelProto:
    """A two-layer MLP, saved with its weights in an external data file."""
    w = Weights(seed=4)
    nodes = [
        helper.make_node(
            "Gemm", ["x", w.add("fc1.weight", (128, 64)), w.add("fc1.bias", (128,))], ["h"], name="fc1", transB=1
        ),
        helper.make_node("Relu", ["h"], ["h_act"], name="relu"),
        helper.make_node(
            "Gemm", ["h_act", w.add("fc2.weight", (10, 128)), w.add("fc2.bias", (10,))], ["y"], name="fc2", transB=1
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        initializer=w.tensors,
    )
    return _model(graph)


def build_all(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in (
        ("cnn.onnx", build_cnn()),
        ("cnn_fp16.onnx", build_cnn(TensorProto.FLOAT16, np.float16)),
        ("conv1d_audio.onnx", build_conv1d_audio()),
        ("transformer_block.onnx", build_transformer_block()),
        ("control_flow.onnx", build_control_flow()),
        ("custom_op.onnx", build_custom_op()),
    ):
        onnx.save_model(model, str(out_dir / name))
        written.append(out_dir / name)
    external_dir = out_dir / "external_data"
    external_dir.mkdir(exist_ok=True)
    # onnx appends to an existing data file instead of replacing it; start from nothing.
    (external_dir / "mlp.onnx.data").unlink(missing_ok=True)
    onnx.save_model(
        build_mlp(),
        str(external_dir / "mlp.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="mlp.onnx.data",
        size_threshold=1024,
    )
    written += [external_dir / "mlp.onnx", external_dir / "mlp.onnx.data"]
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    for path in build_all(target):
        print(f"{path}  {path.stat().st_size} bytes")
