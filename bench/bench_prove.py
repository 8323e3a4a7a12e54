"""check --prove on the QNN HTP simulator: the time to reduce a session that is not created to
its culprit, on chains of 100 to 1,000 nodes with one node the simulator's default SoC cannot
finalize (a depthwise Conv with strides [2, 1]) at a varying place, against plain check and
against one bare session of the same model.
Run: .venv/bin/python bench/bench_prove.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import ROOT

sys.path.insert(0, str(ROOT))


def chain(path: Path, nodes: int, culprit_at: float) -> Path:
    """Conv/Relu pairs over 8 channels at 16x16, with the strided depthwise Conv placed at
    ``culprit_at`` of the way (a share of the node order), then a Relu to the output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph_nodes, inits, current, width = [], [], "x", 16
    place = int((nodes - 2) * culprit_at) // 2 * 2
    index = 0
    while len(graph_nodes) < nodes - 1:
        if len(graph_nodes) == place:
            inits.append(numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "dw_w"))
            graph_nodes.append(helper.make_node("Conv", [current, "dw_w"], ["dw_out"], group=8, strides=[2, 1],
                                                pads=[1, 1, 1, 1], name="culprit_dw"))
            current, width = "dw_out", width // 2
            continue
        inits.append(numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32) * 0.3, f"w{index}"))
        graph_nodes.append(helper.make_node("Conv", [current, f"w{index}"], [f"c{index}"], name=f"conv{index}"))
        graph_nodes.append(helper.make_node("Relu", [f"c{index}"], [f"r{index}"], name=f"relu{index}"))
        current, index = f"r{index}", index + 1
    graph_nodes.append(helper.make_node("Relu", [current], ["y"], name="out"))
    graph = helper.make_graph(graph_nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def main() -> None:
    import onnxruntime as ort
    import onnxruntime_qnn

    import ortprep

    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    with tempfile.TemporaryDirectory(prefix="bench-prove-") as tmp:
        # A first QNN session before the table: the simulator prints a line of its own on stdout then.
        warm = ort.SessionOptions()
        warm.log_severity_level = 3
        warm.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path()})
        ort.InferenceSession(str(ROOT / "sample_models" / "cnn.onnx"), warm)
        sys.stdout.flush()
        print("\n| nodes | culprit at | bare session (s) | check (s) | check --prove (s) | probe sessions | "
              "reduction (s) | culprit named |\n|---:|---:|---:|---:|---:|---:|---:|---|")
        for nodes in (100, 300, 1000):
            for at in (0.1, 0.5, 0.9):
                path = chain(Path(tmp) / f"chain{nodes}_{at}.onnx", nodes, at)
                options = ort.SessionOptions()
                options.log_severity_level = 3
                options.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path()})
                started = time.perf_counter()
                try:
                    ort.InferenceSession(str(path), options)
                except Exception:  # noqa: BLE001 - failing is what this model does on the default SoC
                    pass
                bare = time.perf_counter() - started
                started = time.perf_counter()
                ortprep.check(path, eps=["qnn"])
                plain = time.perf_counter() - started
                started = time.perf_counter()
                result = ortprep.run_step("check", path, eps=["qnn"], prove=True)
                proved = time.perf_counter() - started
                culprit = result.data["results"][0]["proof"].get("culprit") or {}
                named = ", ".join(n["name"] for n in culprit.get("nodes", [])) or culprit.get("stopped", "none")
                print(f"| {nodes} | {at:.0%} | {bare:.2f} | {plain:.2f} | {proved:.2f} | {culprit.get('probes', 0)} | "
                      f"{culprit.get('seconds', 0):.2f} | {named} |")


if __name__ == "__main__":
    main()
