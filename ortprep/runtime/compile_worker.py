"""Child process for `ortprep compile`: ORT's compile API writes an EPContext model, which is then
reloaded on the same EP and run next to the source model on the CPU EP.

    python -m ortprep.runtime.compile_worker REQUEST.json
"""

from __future__ import annotations

import json
import sys

import numpy as np

from ortprep.runtime.load_worker import add_plugin_ep
from ortprep.runtime.values import portable


def _session_options(ort, request: dict):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if request.get("plugin"):
        add_plugin_ep(ort, request, options)
    else:
        options.add_provider(request["provider"], request.get("provider_options") or {})
    return options


def main(request_path: str) -> int:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    status: dict = {"ok": False, "stage": "import"}
    try:
        import onnxruntime as ort

        if request.get("plugin"):
            ort.register_execution_provider_library(request["provider"], request["plugin"]["library"])
        status["stage"] = "compile"
        compiler = ort.ModelCompiler(_session_options(ort, request), request["model"], embed_compiled_data_into_model=True,
                                     flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
        compiler.compile_to_file(request["output"])
        status["stage"] = "reload"
        compiled = ort.InferenceSession(request["output"], sess_options=_session_options(ort, request))
        status["session_providers"] = compiled.get_providers()
        status["stage"] = "run"
        with np.load(request["inputs"], allow_pickle=False) as data:
            feeds = {key: data[key] for key in data.files}
        names = [o.name for o in compiled.get_outputs()]
        values = compiled.run(names, feeds)
        reference = ort.InferenceSession(request["model"], providers=["CPUExecutionProvider"]).run(names, feeds)
        np.savez(request["results"], **{f"c{i}": portable(v) for i, v in enumerate(values)},
                 **{f"r{i}": portable(v) for i, v in enumerate(reference)})
        status["output_names"] = names
        status["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        status["error"] = " ".join(str(exc).split()) or type(exc).__name__
    with open(request["status"], "w", encoding="utf-8") as out:
        json.dump(status, out)
    return 0


if __name__ == "__main__":
    main(sys.argv[1])  # a child entry point: its result goes back through the status file
