"""The JSON record of a quantize attempt (schema ``ortprep.quantize/1``): every key present from
the start, so a refusal before any work has the same shape as a result."""

from __future__ import annotations

from ortprep.model import ModelHandle
from ortprep.options import QuantizeOptions

SCHEMA = "ortprep.quantize/1"


def base_record(handle: ModelHandle, options: QuantizeOptions, settings: dict, size_before: int) -> dict:
    return {
        "input": str(handle.path), "output": None, "kept_failed": None, "mode": options.mode,
            "format": settings["format"],
        "preset": {"ep": settings["preset"], "reason": settings["preset_reason"],
                   "activation_type": settings["activation_type"],
                   "weight_type": settings["weight_type"], "per_channel": settings["per_channel"],
                   "method": settings["method"],
                   "source": settings["preset_source"],
                   "fixed_output_encodings": settings.get("fixed_output_encodings") or {},
                   "reduce_range": settings.get("reduce_range", False)},
        "weight_only": ({"bits": settings["weight_bits"], "block_size": settings["block_size"],
                         "symmetric": settings["symmetric"], "op": "com.microsoft:MatMulNBits",
                         "rounding": settings.get("rounding", "nearest"),
                         "rounding_tried": settings.get("rounding_record"),
                         "accuracy_level": settings.get("accuracy_level", 0),
                         "accuracy_tried": settings.get("compute_record")}
                        if options.mode == "weight-only" else None),
        "preprocess": "not run", "size_before": size_before, "size_after": None, "size_ratio": None,
        "calibration": {"samples": 0, "source": None, "kind": None}, "evaluation_samples": 0,
        "evaluation_inputs": None, "evaluation_data": None,
        "output_headroom": None, "raised_weight_scales": None, "reader_ranges": None, "fp16_matmuls": None,
            "folded_biases": None, "folded_batch_norms": None, "ep_divergence": None,
        "verify": {"cosine": None, "spread": None, "max_abs_diff": None, "top1_agreement": None, "latency_ratio": None,
                   "passed": None},
        "quantized_ops": 0, "quantized_weights": 0, "quantized_weight_share": None, "wide_activations": [],
            "excluded_nodes": [], "kept_off_ep": [], "search": None,
        "gate_target": None,
        # the engine asked for and used, each candidate engine's fate and the one kept (choose.py)
        "engine": {"asked": options.engine_name(), "used": None, "candidates": [], "best": None},
        "timing": {"engine_seconds": 0.0},
    }
