"""The repository gate on 20 models: `ortprep run -j 1` against `-j 2`, in one run.

    .venv/bin/python -m bench.suite.bench_repo

The repository: 20 models (the four sample models and 16 small MLPs and CNNs built here, static
shapes), two targets (cpu, qnn on the HTP simulator), steps check and load (every pair loads and
runs on its EP in a child process). Peak RSS is the largest of the process tree.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.common import OUT, ROOT, VENV_BIN, measure, table
from bench.paths import test_models

CONFIG = """output_dir = "build"

[[models]]
path = "models/*.onnx"

[targets.cpu]
ep = "cpu"
load_must_pass = true

[targets.npu]
ep = "qnn"
min_node_share = 0.5
load_must_pass = true

[[steps]]
run = "check"

[[steps]]
run = "load"
"""


def mlp(seed: int, width: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["a"], name="act"),
         helper.make_node("MatMul", ["a", "W2"], ["y"], name="fc2")],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), "W1"),
         numpy_helper.from_array(rng.standard_normal((width, 10)).astype(np.float32), "W2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def build(folder: Path) -> None:
    models = folder / "models"
    models.mkdir(parents=True, exist_ok=True)
    built = test_models()  # tests/models.py

    shutil.copy(ROOT / "sample_models" / "cnn.onnx", models / "cnn.onnx")
    for index in range(12):
        onnx.save_model(mlp(index, 64 * (1 + index % 4)), str(models / f"mlp{index:02d}.onnx"))
    for index in range(7):
        onnx.save_model(built.conv_classifier(width=16 * (1 + index % 3)), str(models / f"conv{index:02d}.onnx"))
    (folder / "ortprep.toml").write_text(CONFIG)


def main() -> None:
    folder = OUT / "repo20"
    shutil.rmtree(folder, ignore_errors=True)
    build(folder)
    ortprep = str(VENV_BIN / "ortprep")
    rows = []
    for jobs in (1, 2):
        argv = [ortprep, "run", str(folder), "-j", str(jobs), "--json"]
        rows.append(("20 models x 2 targets (check, load)", measure(f"ortprep run -j {jobs}", argv, runs=3)))
    print(table(rows))
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
