"""NncfQuantize: NNCF's post-training quantization (ONNX backend) in the worker.

nncf is imported here only, in the worker, with its telemetry off: ``NNCF_CI`` set and
``openvino_telemetry`` blocked in ``sys.modules`` before the import, so NNCF falls back to its stub
and writes nothing under ``~/intel`` (docs/decisions/engines-nncf-aimet.md, "Telemetry"). The
request calibrates on a CalibrationSet's samples, keeps an ignored scope float and writes a QDQ
model; an exception comes back as a failed reply with its type and traceback.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ortprep.runtime.protocol import Reply, Request, WorkerState
from ortprep.runtime.requests.failure import record_failure


# ortprep's --method -> NNCF's activation range estimator. minmax is the global min/max over the
# samples, as ORT's MinMax; NNCF's own default averages each sample's extremes, which clips small
# tensors (docs/decisions/engines-integration.md)
RANGE_ESTIMATORS = {"minmax": "MINMAX", "percentile": "MEAN_QUANTILE", "entropy": "HISTOGRAM"}


@dataclass
class NncfQuantizeReply(Reply):
    engine_seconds: float = 0.0
    version: str | None = None
    peak_rss: int | None = None  # bytes: the worker's peak resident set
    error_type: str | None = None
    traceback: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)  # what was applied (ignored scope, algorithms)


def import_nncf():
    """nncf with its telemetry off (see the module's docstring)."""
    if "nncf" not in sys.modules:
        os.environ["NNCF_CI"] = "1"
        sys.modules.setdefault("openvino_telemetry", None)  # the import fails: NNCF uses its stub
    import nncf

    return nncf


def peak_rss() -> int | None:
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    except (ImportError, OSError):
        return None


@dataclass
class NncfQuantize(Request):
    """``nncf.quantize`` of ``model`` into ``output``. ``options``: ``preset`` (performance or
    mixed), ``model_type`` (transformer or None: SmoothQuant runs for transformer),
    ``fast_bias_correction``, ``per_channel`` (weights), ``smooth_quant_alpha`` (MatMuls), ``method``
    (the activations' range estimator: RANGE_ESTIMATORS),
    ``ignored_names``/``ignored_types`` (kept float; names not in the graph are dropped and
    reported), ``external_data`` (the weights live beside ``model``)."""

    reply_type = NncfQuantizeReply

    workdir: str
    model: str
    output: str
    calibration: Any = None
    calibration_indices: list[int] | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def affinity(self):
        # a worker of its own: nncf and its dependencies stay out of the pool's ORT workers
        return "nncf"

    def handle(self, state: WorkerState) -> NncfQuantizeReply:

        reply = NncfQuantizeReply(status="failed", stage="nncf")
        previous = os.getcwd()
        try:
            os.chdir(self.workdir)
            nncf = import_nncf()
            reply.version = getattr(nncf, "__version__", None)
            started = time.monotonic()
            reply.detail = self._quantize(nncf)
            reply.engine_seconds = round(time.monotonic() - started, 3)
            reply.status = "ok"
        except Exception as exc:  # noqa: BLE001 - reported to the parent as data
            record_failure(reply, exc, message_chars=500)
        finally:
            os.chdir(previous)
            reply.peak_rss = peak_rss()
        return reply

    def _quantize(self, nncf) -> dict[str, Any]:
        import onnx
        from nncf.quantization.advanced_parameters import (
            AdvancedQuantizationParameters,
            AdvancedSmoothQuantParameters,
            QuantizationParameters,
        )

        from ortprep.runtime.calibration import CalibrationSet

        options = self.options
        external = bool(options.get("external_data"))
        model = onnx.load(self.model, load_external_data=not external)
        in_graph = {node.name for node in model.graph.node}
        names = [name for name in options.get("ignored_names") or () if name in in_graph]
        missing = [name for name in options.get("ignored_names") or () if name not in in_graph]
        types = list(options.get("ignored_types") or ())
        calibration = CalibrationSet.from_json(self.calibration)
        indices = list(self.calibration_indices or [])
        transformer = options.get("model_type") == "transformer"
        advanced: dict[str, Any] = {
            "weights_quantization_params": QuantizationParameters(per_channel=bool(options.get("per_channel"))),
        }
        estimator = RANGE_ESTIMATORS.get(options.get("method") or "")
        if estimator is not None:
            from nncf.quantization.range_estimator import RangeEstimatorParametersSet

            advanced["activations_range_estimator_params"] = getattr(RangeEstimatorParametersSet, estimator)
        alpha = options.get("smooth_quant_alpha")
        if transformer and alpha is not None:
            advanced["smooth_quant_alphas"] = AdvancedSmoothQuantParameters(matmul=float(alpha))
        if external:
            advanced["backend_params"] = {"external_data_dir": os.path.dirname(os.path.abspath(self.model))}
        preset = {"performance": nncf.QuantizationPreset.PERFORMANCE,
                  "mixed": nncf.QuantizationPreset.MIXED}.get(options.get("preset") or "")
        quantized = nncf.quantize(
            model, nncf.Dataset(indices, calibration.sample), preset=preset,
            target_device=nncf.TargetDevice.CPU, subset_size=max(1, len(indices)),
            fast_bias_correction=bool(options.get("fast_bias_correction", True)),
            model_type=nncf.ModelType.TRANSFORMER if transformer else None,
            ignored_scope=nncf.IgnoredScope(names=names, types=types, validate=False),
            advanced_parameters=AdvancedQuantizationParameters(**advanced))
        if external:
            from onnx.external_data_helper import load_external_data_for_model

            load_external_data_for_model(quantized, os.path.dirname(os.path.abspath(self.model)))
            onnx.save_model(quantized, self.output, save_as_external_data=True,
                            location=os.path.basename(self.output) + ".data")
        else:
            onnx.save_model(quantized, self.output)
        return {"preset": options.get("preset"), "model_type": options.get("model_type"),
                "range_estimator": estimator,
                "bias_correction": "fast" if options.get("fast_bias_correction", True) else "full",
                "smooth_quant_alpha": alpha if transformer else None, "per_channel": bool(options.get("per_channel")),
                "ignored_names": len(names), "ignored_types": types, "ignored_not_in_graph": missing[:16],
                "samples": len(indices)}
