"""Child process of tools/probe_ep_ops.py: create a session for each single-op model on one EP,
see whether the EP claimed the op's node, and run it once.

    python -m ortprep.runtime.op_probe_worker REQUEST.json

One JSON line per model goes to the results file as soon as it is known, so a crash inside the
EP loses only the model it happened on (the parent starts a new child after it).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from ortprep.runtime.load_worker import _options, _session


def probe(ort, request: dict, model: dict) -> dict:
    options = _options(ort, request, record="default")
    try:
        session = _session(ort, request, options, with_cpu=True)
    except Exception as exc:  # noqa: BLE001 - the refusal is the result
        return {"id": model["id"], "claimed": False, "ran": False, "error": " ".join(str(exc).split())[:400]}
    # By op type, not name: an EP's layout pass (QNN prefers NHWC) replaces the node with a renamed one.
    placed = [(subgraph.ep_name, node.op_type) for subgraph in session.get_provider_graph_assignment_info()
              for node in subgraph.get_nodes()]
    claimed = any(ep == request["provider"] and op == model["op"] for ep, op in placed) and not any(
        ep != request["provider"] and op == model["op"] for ep, op in placed)
    result = {"id": model["id"], "claimed": claimed, "ran": False, "error": None}
    try:
        with np.load(model["inputs"], allow_pickle=False) as data:
            feeds = {key: data[key] for key in data.files}
        session.run(None, feeds)
        result["ran"] = True
    except Exception as exc:  # noqa: BLE001
        result["error"] = " ".join(str(exc).split())[:400]
    return result


def main(request_path: str) -> int:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    import onnxruntime as ort

    if request.get("plugin"):
        ort.register_execution_provider_library(request["provider"], request["plugin"]["library"])
    with open(request["results"], "a", encoding="utf-8") as out:
        for model in request["models"]:
            out.write(json.dumps({"id": model["id"], "started": True}) + "\n")
            out.flush()
            request["model"] = model["path"]
            out.write(json.dumps(probe(ort, request, model)) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    main(sys.argv[1])  # a child entry point: its results go back through the results file
