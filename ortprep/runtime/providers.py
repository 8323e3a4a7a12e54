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
from dataclasses import dataclass
from types import ModuleType

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
_NOT_RUNTIMES = ("onnxruntime-extensions", "onnxruntime-genai", "onnxruntime-tools")

INSTALL_HINT = (
    "install one ONNX Runtime flavour: pip install 'ortprep[cpu]' "
    "(or 'ortprep[gpu]', 'ortprep[directml]', 'ortprep[openvino]'); inside this repo: .venv/bin/pip install onnxruntime"
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
        flavour = ORT_FLAVOURS.get(name, name.removeprefix("onnxruntime-"))
        found[name] = OrtDistribution(name=name, version=dist.version, flavour=flavour)
    return sorted(found.values(), key=lambda d: d.name)


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
