"""Which ONNX Runtime is installed, and what it can do, without clobbering anything.

ORT ships as several distributions (onnxruntime, onnxruntime-gpu, -directml, -openvino, ...)
that all install the same ``onnxruntime`` import package. Two of them side by side overwrite
each other's files, so ortprep never installs one itself: it detects what is there.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import re
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ortprep.errors import EnvironmentMissingError

log = logging.getLogger(__name__)

# distribution name (normalized) -> the ortprep extra that installs it
ORT_FLAVOURS: dict[str, str] = {
    "onnxruntime": "cpu",
    "onnxruntime-gpu": "gpu",
    "onnxruntime-directml": "directml",
    "onnxruntime-openvino": "openvino",
    "onnxruntime-qnn": "qnn",
    "onnxruntime-training": "training",
    "onnxruntime-silicon": "coreml",
    "ort-nightly": "cpu (nightly)",
    "ort-nightly-gpu": "gpu (nightly)",
    "ort-nightly-directml": "directml (nightly)",
}
# Distributions whose names start like ORT's but are add-ons, not runtimes.
_NOT_RUNTIMES = ("onnxruntime-extensions", "onnxruntime-genai", "onnxruntime-tools", "onnxruntime-ep-")

INSTALL_HINT = (
    "install one ONNX Runtime flavour: pip install 'ortprep[cpu]' "
    "(or 'ortprep[gpu]', 'ortprep[directml]', 'ortprep[openvino]', 'ortprep[qnn]'); inside this repo: "
    ".venv/bin/pip install onnxruntime"
)


@dataclass(frozen=True)
class OrtDistribution:
    name: str
    version: str
    flavour: str


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_ort_distributions() -> list[OrtDistribution]:
    """Every installed ORT runtime distribution (reads package metadata; imports nothing)."""
    found: dict[str, OrtDistribution] = {}
    for dist in importlib.metadata.distributions():
        name = _normalize(dist.metadata.get("Name") or "")
        if not (name.startswith("onnxruntime") or name.startswith("ort-nightly")) or name.startswith(_NOT_RUNTIMES):
            continue
        if is_plugin_package(name, dist.version):
            continue  # a plugin EP next to onnxruntime, not a runtime of its own
        flavour = ORT_FLAVOURS.get(name, name.removeprefix("onnxruntime-"))
        found[name] = OrtDistribution(name=name, version=dist.version, flavour=flavour)
    return sorted(found.values(), key=lambda d: d.name)


def plugin_table() -> list[dict[str, Any]]:
    """The plugin EP packages ortprep knows (``eps/data/eps.json``)."""
    from ortprep.eps.registry import ep_facts

    return ep_facts()["plugins"]


def is_plugin_package(name: str, version: str) -> bool:
    """True for plugin EP packages: they go next to onnxruntime and never clash with it
    (onnxruntime-qnn 1.x was a full ORT build; 2.x is a plugin)."""
    for entry in plugin_table():
        if _normalize(entry["distribution"]) == _normalize(name):
            return _major(version) >= int(entry["min_version"])
    return _normalize(name).startswith("onnxruntime-ep-")


def _major(version: str) -> int:
    match = re.match(r"(\d+)", version)
    return int(match.group(1)) if match else 0


@dataclass
class RuntimeProbe:
    """What one ONNX Runtime environment can run: asked in a child process of that environment."""

    python: str | None  # None: this interpreter
    ok: bool
    version: str | None = None
    providers: list[str] = field(default_factory=list)  # built into that ORT
    plugins: list[dict[str, Any]] = field(default_factory=list)  # known plugin packages found there
    kernels: list | None = None
    error: str | None = None

    def plugin_for(self, provider: str) -> dict[str, Any] | None:
        return next((p for p in self.plugins if p["provider"] == provider and p.get("registered")), None)

    def devices_for(self, ep_name: str) -> list[dict[str, Any]]:
        """The plugin devices an ortprep EP name would use (e.g. openvino-cpu: ov_device CPU)."""
        from ortprep.eps.registry import resolve_ep

        spec = resolve_ep(ep_name)
        plugin = self.plugin_for(spec.provider)
        entry = next((e for e in plugin_table() if e["provider"] == spec.provider), None)
        if plugin is None or entry is None or spec.name not in entry["eps"]:
            return []
        wanted = entry["eps"][spec.name]["device_metadata"]
        return [d for d in plugin.get("devices", []) if all(d["ep_metadata"].get(k) == v for k, v in wanted.items())]

    def runs(self, ep_name: str) -> bool:
        """Can a session put nodes on this EP here (built in, or a plugin device for it)?"""
        from ortprep.eps.registry import resolve_ep

        spec = resolve_ep(ep_name)
        return spec.provider in self.providers or bool(self.devices_for(spec.name))


@functools.lru_cache(maxsize=8)
def probe_runtime(python: str | None = None, kernels: bool = False) -> RuntimeProbe:
    """Ask an ORT environment (this one, or the interpreter ``python``) in a worker process what it
    can run: providers, plugin packages with their devices, optionally the CPU kernel registry."""
    from ortprep.runtime.requests import Probe
    from ortprep.runtime.worker import call

    reply = call(Probe(plugins=plugin_table(), kernels=kernels), python=python, timeout=120)
    if reply.status in ("crashed", "timeout"):
        tail = reply.stderr_tail
        return RuntimeProbe(python, False, error=f"the probe died ({reply.died}){': ' + tail if tail else ''}")
    return RuntimeProbe(python, reply.ok, reply.version, reply.providers, reply.plugins, reply.kernels,
                        reply.message or None)


def import_ort() -> ModuleType | None:
    """The onnxruntime module, or None when no flavour is installed (or it is broken)."""
    try:
        import onnxruntime
    except ImportError as exc:
        log.debug("onnxruntime import failed: %s", exc)
        return None
    if not hasattr(onnxruntime, "InferenceSession"):
        # A half-removed flavour leaves an empty namespace package behind.
        log.debug("onnxruntime imported without InferenceSession (broken install)")
        return None
    return onnxruntime


def require_ort() -> ModuleType:
    """The onnxruntime module, or EnvironmentMissingError with the install line (exit 3)."""
    ort = import_ort()
    if ort is None:
        raise EnvironmentMissingError("ONNX Runtime is not installed (or its install is broken)", hint=INSTALL_HINT)
    return ort


@functools.lru_cache(maxsize=1)
def ort_cuda_major() -> int:
    """The CUDA major version the installed onnxruntime-gpu was built with (12 when it does not say)."""
    try:
        from onnxruntime.capi import build_and_package_info

        return int(str(getattr(build_and_package_info, "cuda_version", "12")).split(".")[0])
    except (ImportError, ValueError):
        return 12


def ort_max_ir() -> int | None:
    """Highest ONNX IR version the installed ORT loads, found by loading tiny models (opset 7)."""
    ort = import_ort()
    if ort is None:
        return None
    from onnx import TensorProto, helper

    options = ort.SessionOptions()
    options.log_severity_level = 4
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    best = None
    for ir_version in range(3, 20):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)], ir_version=ir_version)
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - any refusal means "not this IR version"
            continue
        best = ir_version
    return best


@functools.lru_cache(maxsize=1)
def ort_max_opset(max_probe: int = 64) -> int | None:
    """Highest default-domain opset the installed ORT accepts, found by loading tiny models.

    ORT refuses models stamped with an opset newer than the ONNX it was built with; asking
    it directly is exact for every flavour and version. None when ORT is not installed.
    """
    ort = import_ort()
    if ort is None:
        return None
    import onnx
    from onnx import TensorProto, helper

    options = ort.SessionOptions()
    options.log_severity_level = 4

    def accepts(opset: int) -> bool:
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "probe",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - any refusal means "not this opset"
            return False
        return True

    low, high = 7, max(max_probe, onnx.defs.onnx_opset_version() + 8)
    if not accepts(low):
        return None
    while low < high:  # invariant: accepts(low)
        middle = (low + high + 1) // 2
        if accepts(middle):
            low = middle
        else:
            high = middle - 1
    return low
