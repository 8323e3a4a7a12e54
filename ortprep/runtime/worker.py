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


def _clean(message: str) -> str:
    # ORT prefixes errors with its error code and a source path; keep the useful part.
    text = message.strip().removeprefix("[ONNXRuntimeError] : ")
    text = re.sub(r"^\d+ : [A-Z_]+ : ", "", text)
    return " ".join(text.split())[:1000]


def main(request_path: str) -> int:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    status: dict = {"stage": "import"}

    def write_status() -> None:
        with open(request["status"], "w", encoding="utf-8") as out:
            json.dump(status, out)

    try:
        import onnxruntime as ort

        if os.environ.get("ORTPREP_TEST_CRASH_WORKER"):
            os.abort()  # test hook: lets tests prove a crash becomes a status, not the tool's death
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if request.get("optimization") == "disable":
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        status["stage"] = "session"
        started = time.perf_counter()
        session = ort.InferenceSession(request["model"], options, providers=request["providers"])
        status["session_seconds"] = time.perf_counter() - started
        status["providers"] = session.get_providers()
        with np.load(request["inputs"], allow_pickle=False) as data:
            feeds = {key: data[key] for key in data.files}
        names = request.get("outputs") or [o.name for o in session.get_outputs()]
        status["stage"] = "run"
        started = time.perf_counter()
        values = session.run(names, feeds)
        status["run_seconds"] = time.perf_counter() - started
        np.savez(request["results"], **{f"o{i}": np.asarray(v) for i, v in enumerate(values)})
        status["output_names"] = names
        status["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        status["ok"] = False
        status["error"] = _clean(str(exc)) or type(exc).__name__
    write_status()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
