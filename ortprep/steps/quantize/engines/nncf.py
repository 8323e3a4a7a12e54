"""The ``nncf`` engine: NNCF's post-training quantization (ONNX backend) in a worker of its own.

What it adds over ORT's MinMax: bias correction (fast, or full), and for a transformer-like graph
(MatMul/Gemm layers, no Conv) SmoothQuant, which moves an activation's outlier channels into the
weights. NNCF's ONNX backend writes 8-bit Q/DQ only, static, in QDQ form; 16-bit activations stay
with the ort engine (docs/decisions/engines-nncf-aimet.md). nncf is imported in the worker only
(runtime/requests/nncf_quantize.py), with its telemetry off.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from ortprep.runtime.calibration import CalibrationSet
from ortprep.runtime.requests.nncf_quantize import NncfQuantize
from ortprep.runtime.worker import call
from ortprep.steps.quantize.engines.base import EngineRun, Exclusion

# an engine call's deadline when the caller names none
TIMEOUT = 1800.0
# SmoothQuant's migration strength on MatMuls: NNCF's own default first; where its candidate fails
# the gate, the others in turn (outcome.try_smooth_quant_alphas; docs/decisions/engines-integration.md)
SMOOTH_QUANT_ALPHA = 0.95
SMOOTH_QUANT_ALPHAS = (0.5, 0.25)


def model_type(model: Path) -> str | None:
    """``transformer`` for a graph of MatMul/Gemm layers without Conv (dense layers, attention):
    NNCF then runs SmoothQuant and the MIXED preset; None otherwise. The weights are not read."""
    import onnx

    ops = {node.op_type for node in onnx.load(str(model), load_external_data=False).graph.node}
    return "transformer" if ops & {"MatMul", "Gemm"} and not ops & {"Conv", "ConvTranspose"} else None


class NncfEngine:
    name = "nncf"
    python = None  # nncf lives in ortprep's own environment (the extra ortprep[nncf])
    request_type = NncfQuantize  # the worker's request (a subclass may stand in: tests' failing engine)

    def available(self) -> str | None:
        if importlib.util.find_spec("nncf") is None:
            return "nncf is not installed here: pip install 'ortprep[nncf]'"
        return None

    def supports(self, mode: str, settings: dict[str, Any], exclusion: Exclusion) -> str | None:
        if mode == "weight-only":
            return "NNCF's ONNX engine does not write MatMulNBits weight-only models; use --engine ort"
        if mode == "dynamic":
            return "NNCF quantizes statically (calibrated activations) only, not --dynamic; use --engine ort"
        if settings.get("format") == "qoperator":
            return "NNCF writes QDQ models only, not QOperator (use --format qdq); or use --engine ort"
        wide = {"uint16", "int16"}
        if settings.get("activation_type") in wide or settings.get("weight_type") in wide or exclusion.wide_tensors:
            return "16-bit activations or weights: NNCF's ONNX backend writes 8-bit Q/DQ only; use --engine ort"
        return None

    def quantize(self, workdir: Path, model: Path, output: Path, mode: str, settings: dict[str, Any],
                 calibration: CalibrationSet | None, indices: list[int], exclusion: Exclusion, big: bool,
                 progress=None, timeout: float | None = None) -> EngineRun:
        why = self.available() or self.supports(mode, settings, exclusion)
        if why is None and (calibration is None or not indices):
            why = "NNCF calibrates on samples, and none is left for calibration"
        if why is not None:
            return EngineRun(self.name, False, error=f"nncf: {why}")
        kind = model_type(model)
        symmetric = (settings.get("extra_options") or {}).get("ActivationSymmetric")
        options = {"preset": "performance" if symmetric or kind is None else "mixed", "model_type": kind,
                   "fast_bias_correction": settings.get("bias_correction", "fast") != "full",
                   "per_channel": bool(settings.get("per_channel")),
                   "smooth_quant_alpha": settings.get("smooth_quant_alpha", SMOOTH_QUANT_ALPHA),
                   "ignored_names": list(exclusion.nodes), "ignored_types": list(exclusion.op_types),
                   "external_data": big, "method": settings.get("method", "minmax")}
        request = self.request_type(workdir=str(workdir), model=str(Path(model).resolve()),
                                    output=str(Path(output).resolve()), calibration=calibration.to_json(),
                                    calibration_indices=list(indices), options=options)
        if progress is not None:
            progress("quantizing with nncf", 0, 1)
        reply = call(request, python=None, timeout=timeout or TIMEOUT)
        version = getattr(reply, "version", None)
        label = f"nncf {version}" if version else "nncf"
        seconds = getattr(reply, "engine_seconds", 0.0)
        detail = {**getattr(reply, "detail", {}), "version": version, "peak_rss": getattr(reply, "peak_rss", None)}
        if reply.status == "timeout":
            return EngineRun(self.name, False, error=f"{label}: did not finish within {timeout or TIMEOUT:.0f} s",
                             detail=detail)
        if reply.status == "crashed":
            return EngineRun(self.name, False, error=f"{label}: its process died ({reply.message[-300:]})",
                             detail=detail)
        if not reply.ok or not output.exists():
            return EngineRun(self.name, False, error=f"{label}: {reply.error_type or 'error'}: {reply.message}",
                             seconds=seconds, detail={**detail, "traceback": reply.traceback})
        if progress is not None:
            progress("quantizing with nncf", 1, 1)
        return EngineRun(self.name, True, output, seconds=seconds, detail=detail)


ENGINE = NncfEngine()
