"""Child process for `ortprep load`: one execution provider, one model.

    python -m ortprep.runtime.load_worker REQUEST.json

1. a session with the EP alone and CPU fallback disabled: does the whole model run there?
2. sessions with CPU fallback and ORT's graph assignment record, at the optimization level a
   user's session gets by default (and, on request, with optimizations off): which node went
   where, in how many EP subgraphs;
3. runs on the inputs: outputs, NaN/Inf, latency after a warm-up; optionally ORT's profiler.
A crash or a hang ends only this process; the parent reports it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import defaultdict

import numpy as np

from ortprep.runtime.values import is_tensor, portable


def _clean(message: str) -> str:
    text = message.strip().removeprefix("[ONNXRuntimeError] : ")
    text = re.sub(r"^\d+ : [A-Z_]+ : ", "", text)
    text = re.sub(r"/onnxruntime_src/\S+:\d+ ", "", text)  # build paths say nothing to the user
    return " ".join(text.split())


def _options(ort, request: dict, *, strict: bool = False, record: str | None = None, profile_prefix: str | None = None,
             verbose: bool = False):
    options = ort.SessionOptions()
    options.log_severity_level = 0 if verbose else 3
    if request.get("custom_op_library"):
        options.register_custom_ops_library(request["custom_op_library"])
    if strict and request["provider"] != "CPUExecutionProvider":
        # (ORT refuses the flag when the CPU EP itself is the one asked for.)
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if record is not None:
        if record == "off":
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    if request.get("plugin"):
        add_plugin_ep(ort, request, options)
    return options


def add_plugin_ep(ort, request: dict, options) -> None:
    """Add a registered plugin EP to session options through its devices: a providers= entry
    would silently give a CPU-only session."""
    wanted = request["plugin"].get("device_metadata") or {}
    devices = [d for d in ort.get_ep_devices() if d.ep_name == request["provider"]
               and all(d.ep_metadata.get(k) == v for k, v in wanted.items())]
    if not devices:
        raise RuntimeError(f"{request['provider']} offers no device matching {wanted or 'any'} here")
    options.add_provider_for_devices(devices, request.get("provider_options") or {})


def _session(ort, request: dict, options, *, with_cpu: bool):
    if request.get("plugin"):
        return ort.InferenceSession(request["model"], sess_options=options)
    provider = request["provider"]
    entry = (provider, request.get("provider_options") or {})
    providers = [entry] if provider == "CPUExecutionProvider" or not with_cpu else [entry, "CPUExecutionProvider"]
    return ort.InferenceSession(request["model"], options, providers=providers)


def _record(ort, request: dict, level: str) -> dict:
    """Which EP took which node, and in how many subgraphs, at one optimization level."""
    verbose = bool(request.get("verbose_record")) and level == "default"
    if verbose:
        sys.stderr.write("ORTPREP-VERBOSE-BEGIN\n")
        sys.stderr.flush()
    try:
        session = _session(ort, request, _options(ort, request, record=level, verbose=verbose), with_cpu=True)
    finally:
        if verbose:
            sys.stderr.flush()
            sys.stderr.write("ORTPREP-VERBOSE-END\n")
            sys.stderr.flush()
    assignment, subgraphs = {}, []
    for subgraph in session.get_provider_graph_assignment_info():
        names = [node.name for node in subgraph.get_nodes()]
        subgraphs.append([subgraph.ep_name, len(names)])
        for name in names:
            assignment[name] = subgraph.ep_name
    return {"assignment": assignment, "subgraphs": subgraphs}


def _top_ops(profile_path: str, limit: int = 10) -> list[dict]:
    with open(profile_path, encoding="utf-8") as handle:
        events = json.load(handle)
    per_op: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_op[event.get("args", {}).get("op_name", "?")] += event.get("dur", 0)
    total = sum(per_op.values()) or 1.0
    ranked = sorted(per_op.items(), key=lambda item: -item[1])[:limit]
    return [{"op_type": op, "microseconds": us, "share": round(us / total, 4)} for op, us in ranked]


def main(request_path: str) -> int:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    status: dict = {"stage": "import"}
    try:
        hook = os.environ.get("ORTPREP_TEST_LOAD_HOOK", "")
        if hook == f"crash:{request['provider']}":
            os.abort()  # test hook: a child that dies
        if hook == f"hang:{request['provider']}":
            time.sleep(3600)  # test hook: a child that hangs
        import onnxruntime as ort

        plugin = request.get("plugin")
        if plugin:
            ort.register_execution_provider_library(request["provider"], plugin["library"])
        status["stage"] = "session"
        strict_session = None
        try:
            strict_session = _session(ort, request, _options(ort, request, strict=True), with_cpu=False)
            status["strict"] = {"ok": True}
        except Exception as exc:  # noqa: BLE001 - the message is the result
            message = _clean(str(exc))
            # ORT's Python adds the CPU EP after TensorRT itself, which the no-fallback flag refuses:
            # the strict session cannot be asked for such an EP (ok: None, "not testable").
            status["strict"] = {"ok": None if "Conflicting session configuration" in message else False, "error": message}
        status["placement"] = {}
        for level in request.get("levels", ["default"]):
            try:
                status["placement"][level] = _record(ort, request, level)
            except Exception as exc:  # noqa: BLE001
                status["placement"][level] = {"error": _clean(str(exc))}
        profile_prefix = os.path.join(request["workdir"], "profile") if request.get("profile") else None
        if strict_session is not None and not profile_prefix:
            session = strict_session
        else:
            session = _session(ort, request, _options(ort, request, profile_prefix=profile_prefix),
                               with_cpu=not status["strict"]["ok"])
        status["session_providers"] = session.get_providers()
        status["stage"] = "run"
        with np.load(request["inputs"], allow_pickle=False) as data:
            feeds = {key: data[key] for key in data.files}
        names = [o.name for o in session.get_outputs()]
        values = raw_values = session.run(names, feeds)  # also the warm-up
        timings = []
        for _ in range(max(1, request.get("runs", 10))):
            started = time.perf_counter()
            session.run(names, feeds)
            timings.append((time.perf_counter() - started) * 1000.0)
        status["latency_ms"] = timings
        values = [portable(v) for v in values]
        status["non_tensor_outputs"] = [name for name, value in zip(names, raw_values) if not is_tensor(value)]
        status["nonfinite"] = [
            name for name, value in zip(names, values) if value.dtype.kind == "f" and not np.isfinite(value).all()
        ]
        np.savez(request["results"], **{f"o{i}": v for i, v in enumerate(values)})
        status["output_names"] = names
        if profile_prefix:
            status["profile"] = _top_ops(session.end_profiling())
        status["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        status["ok"] = False
        status["error"] = _clean(str(exc)) or type(exc).__name__
    with open(request["status"], "w", encoding="utf-8") as out:
        json.dump(status, out)
    return 0


if __name__ == "__main__":
    main(sys.argv[1])  # a child entry point: its result goes back through the status file
