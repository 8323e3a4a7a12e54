"""Probe (what an ORT environment can run: version, providers, plugin EPs and their devices) and
OpProbe (does an EP claim and run a single-op model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ortprep.runtime.protocol import Reply, Request, WorkerState
from ortprep.runtime.requests.sessions import (
    SessionSpec,
    build_session,
)


@dataclass
class ProbeReply(Reply):
    version: str | None = None
    providers: list[str] = field(default_factory=list)
    plugins: list[dict] = field(default_factory=list)
    kernels: list | None = None


@dataclass
class Probe(Request):
    """What this worker's ORT can run: version, built-in providers, each known plugin package found
    in its environment (registered, with its devices), and on request the CPU kernel registry."""

    reply_type = ProbeReply

    plugins: list[dict] = field(default_factory=list)  # eps.json's plugin table
    kernels: bool = False

    def handle(self, state: WorkerState) -> ProbeReply:
        reply = ProbeReply(status="failed")
        try:
            ort = state.ort
            reply.version = getattr(ort, "__version__", None)
            # Built in only: a plugin this worker registered before (a probe, a load) is listed there too.
            reply.providers = [p for p in ort.get_available_providers()
                               if p != "AzureExecutionProvider" and p not in state.registered]
            if hasattr(ort, "register_execution_provider_library"):
                reply.plugins = [_plugin(state, entry) for entry in self.plugins]
            if self.kernels:
                from onnxruntime.capi import onnxruntime_pybind11_state as pybind

                reply.kernels = [
                    [k.domain, k.op_name, list(k.version_range), {n: list(t) for n, t in k.type_constraints.items()}]
                    for k in pybind.get_all_opkernel_def() if k.provider == "CPUExecutionProvider"
                ]
            reply.status = "ok"
        except Exception as exc:  # noqa: BLE001 - reported to the parent as data
            reply.message = f"{type(exc).__name__}: {exc}"
        return reply


def _plugin(state: WorkerState, entry: dict) -> dict:
    import importlib

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
        state.register_plugin(entry["provider"], library)
        found["registered"] = True
    except Exception as exc:  # noqa: BLE001 - the reason is the result
        found["registered"] = False
        found["error"] = f"{type(exc).__name__}: {exc}"
        return found
    found["devices"] = [{
        "ep_vendor": device.ep_vendor,
        "type": str(device.device.type).rsplit(".", 1)[-1],
        "vendor": device.device.vendor,
        "ep_metadata": dict(device.ep_metadata),
        "device_metadata": dict(device.device.metadata),
    } for device in state.ort.get_ep_devices() if device.ep_name == entry["provider"]]
    return found


@dataclass
class OpProbeReply(Reply):
    claimed: bool = False
    ran: bool = False
    error: str | None = None


@dataclass
class OpProbe(Request):
    """Does ``provider`` claim the single ``op`` node of ``model`` (CPU fallback allowed, ORT's
    assignment recorded), and does the session run on ``feeds``."""

    reply_type = OpProbeReply

    model: str
    op: str
    feeds: dict[str, Any]
    provider: str
    provider_options: dict[str, str] = field(default_factory=dict)
    plugin: dict[str, Any] | None = None

    def handle(self, state: WorkerState) -> OpProbeReply:
        plugin = self.plugin or {}
        spec = SessionSpec(self.model, self.provider, tuple(sorted(self.provider_options.items())),
                           plugin_library=plugin.get("library"),
                           device_metadata=tuple(sorted((plugin.get("device_metadata") or {}).items())))
        try:
            session = build_session(state, spec).session
        except Exception as exc:  # noqa: BLE001 - the refusal is the result
            return OpProbeReply(error=" ".join(str(exc).split())[:400])
        # By op type, not name: an EP's layout pass (QNN prefers NHWC) replaces the node with a renamed one.
        placed = [
            (sub.ep_name, node.op_type)
            for sub in session.get_provider_graph_assignment_info()
            for node in sub.get_nodes()
        ]
        claimed = any(ep == self.provider and op == self.op for ep, op in placed) and not any(
            ep != self.provider and op == self.op for ep, op in placed)
        reply = OpProbeReply(claimed=claimed)
        try:
            session.run(None, self.feeds)
            reply.ran = True
        except Exception as exc:  # noqa: BLE001
            reply.error = " ".join(str(exc).split())[:400]
        return reply
