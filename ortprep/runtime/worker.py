"""Child-process entry point that runs a model in ONNX Runtime.

    python -m ortprep.runtime.worker REQUEST.json

The request names the model, the providers, an .npz of inputs and where to write the outputs
and a status JSON. A crash in ORT kills only this process; the parent reads the signal.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

import numpy as np

from ortprep.runtime.values import portable


def _clean(message: str) -> str:
    # ORT prefixes errors with its error code and a source path; keep the useful part.
    text = message.strip().removeprefix("[ONNXRuntimeError] : ")
    text = re.sub(r"^\d+ : [A-Z_]+ : ", "", text)
    return " ".join(text.split())[:1000]


def _test_crash_requested(model_path: str) -> bool:
    """ORTPREP_TEST_CRASH_WORKER=1 crashes every run; =fp16 only runs of models holding float16;
    =fp16:OP only runs where an OP node computes on float16 (its first input is float16)."""
    wanted = os.environ.get("ORTPREP_TEST_CRASH_WORKER", "")
    if wanted == "1":
        return True
    if not wanted.startswith("fp16"):
        return False
    import onnx

    model = onnx.load(model_path, load_external_data=False)
    if wanted == "fp16":
        return any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
    op_type = wanted.partition(":")[2]
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(inferred.graph.input)}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    return any(node.op_type == op_type and types.get(node.input[0]) == onnx.TensorProto.FLOAT16 for node in model.graph.node)


def main(request_path: str) -> int:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    status: dict = {"stage": "import"}

    def write_status() -> None:
        with open(request["status"], "w", encoding="utf-8") as out:
            json.dump(status, out)

    try:
        import onnxruntime as ort

        if _test_crash_requested(request["model"]):
            os.abort()  # test hook: lets tests prove a crash becomes a status, not the tool's death
        options = ort.SessionOptions()
        options.log_severity_level = 3
        levels = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }
        if request.get("optimization") in levels:
            options.graph_optimization_level = levels[request["optimization"]]
        if request.get("optimized_model"):
            # Offline optimization: ORT writes the optimized graph (and its weights) while creating the session.
            options.optimized_model_filepath = request["optimized_model"]
            if request.get("optimized_data"):
                options.add_session_config_entry(
                    "session.optimized_model_external_initializers_file_name", request["optimized_data"]
                )
                options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        status["stage"] = "session"
        started = time.perf_counter()
        session = ort.InferenceSession(request["model"], options, providers=request["providers"])
        status["session_seconds"] = time.perf_counter() - started
        status["providers"] = session.get_providers()
        if request.get("optimized_model"):
            status["ok"] = True
            write_status()
            return 0
        names = request.get("outputs") or [o.name for o in session.get_outputs()]
        status["stage"] = "run"
        results = {}
        for sample, inputs_path in enumerate(request["inputs_list"]):
            with np.load(inputs_path, allow_pickle=False) as data:
                feeds = {key: data[key] for key in data.files}
            started = time.perf_counter()
            values = session.run(names, feeds)
            status["run_seconds"] = time.perf_counter() - started
            results.update({f"s{sample}_o{i}": portable(v) for i, v in enumerate(values)})
            if sample == 0 and request.get("latency_runs"):
                timings = []
                for _ in range(request["latency_runs"]):
                    started = time.perf_counter()
                    session.run(names, feeds)
                    timings.append((time.perf_counter() - started) * 1000.0)
                status["latency_ms"] = timings
        np.savez(request["results"], **results)
        status["output_names"] = names
        status["samples"] = len(request["inputs_list"])
        status["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        status["ok"] = False
        status["error"] = _clean(str(exc)) or type(exc).__name__
    write_status()
    return 0


if __name__ == "__main__":
    main(sys.argv[1])  # a child entry point: its result goes back through the status file
