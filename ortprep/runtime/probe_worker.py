"""Child process that asks an ONNX Runtime what it can run, so that nothing which can crash in
native code (plugin registration, the kernel registry of some builds) runs in ortprep's process.

    python -m ortprep.runtime.probe_worker REQUEST.json

Reports the ORT version, its built-in providers, each known plugin package found in this
environment (registered, with the devices it offers), and on request the CPU kernel registry.
Needs only onnxruntime and the standard library, so it runs under any environment's Python.
"""

from __future__ import annotations

import importlib
import json
import sys


def _plugin(ort, entry: dict) -> dict:
    found: dict = {"distribution": entry["distribution"], "provider": entry["provider"], "module": entry["module"]}
    try:
        module = importlib.import_module(entry["module"])
    except Exception as exc:  # noqa: BLE001 - not installed here, or broken
        found["installed"] = False
        found["error"] = f"{type(exc).__name__}: {exc}"
        return found
    found["installed"] = True
    found["version"] = getattr(module, "__version__", None)
    try:
        library = getattr(module, entry["library_function"])()
        found["library"] = library
        functions = {name: getattr(module, name)() for name in dir(module)
                     if name.startswith("get_") and name.endswith("_path") and callable(getattr(module, name))}
        found["paths"] = {name: value for name, value in functions.items() if isinstance(value, str)}
        ort.register_execution_provider_library(entry["provider"], library)
        found["registered"] = True
    except Exception as exc:  # noqa: BLE001 - the reason is the result
        found["registered"] = False
        found["error"] = f"{type(exc).__name__}: {exc}"
        return found
    devices = []
    for device in ort.get_ep_devices():
        if device.ep_name != entry["provider"]:
            continue
        devices.append({
            "ep_vendor": device.ep_vendor,
            "type": str(device.device.type).rsplit(".", 1)[-1],
            "vendor": device.device.vendor,
            "ep_metadata": dict(device.ep_metadata),
            "device_metadata": dict(device.device.metadata),
        })
    found["devices"] = devices
    return found


def main(request_path: str) -> int:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    status: dict = {"ok": False}
    try:
        import onnxruntime as ort

        status["version"] = getattr(ort, "__version__", None)
        status["providers"] = [p for p in ort.get_available_providers() if p != "AzureExecutionProvider"]
        status["plugins"] = [_plugin(ort, entry) for entry in request.get("plugins", [])] \
            if hasattr(ort, "register_execution_provider_library") else []
        if request.get("kernels"):
            from onnxruntime.capi import onnxruntime_pybind11_state as state

            status["kernels"] = [
                [k.domain, k.op_name, list(k.version_range), {n: list(t) for n, t in k.type_constraints.items()}]
                for k in state.get_all_opkernel_def() if k.provider == "CPUExecutionProvider"
            ]
        status["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        status["error"] = f"{type(exc).__name__}: {exc}"
    with open(request["status"], "w", encoding="utf-8") as out:
        json.dump(status, out)
    return 0


if __name__ == "__main__":
    main(sys.argv[1])  # a child entry point: its result goes back through the status file
