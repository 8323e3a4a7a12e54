"""Tiny models for tests, built with onnx.helper. Each passes check_model(full_check=True)
unless its name says it is broken."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def make(graph: onnx.GraphProto, opset: int = OPSET, ir_version: int = 8, extra_opsets=(), check=True) -> onnx.ModelProto:
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
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=1024
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
