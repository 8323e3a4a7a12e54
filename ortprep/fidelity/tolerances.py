"""What an EP's output is held to against the CPU EP's run of the same model: one rule for load,
compile and quantize's EP side. The precision the EP computes in is passed in (``tf32``: read by
runtime/tolerance.computes_tf32), so this module reads no session. Rationale and sources:
docs/decisions/fidelity-tolerances.md.

- Float models: a share of the output's scale (its largest magnitude, at least 1) by the precision
  the EP computes in (FLOAT_SHARE; float16 where the EP computes float graphs in float16, or its
  float32 products in TF32).
- Quantized (QDQ) models: GRID_STEPS steps of an 8-bit grid over the output's calibrated range
  (its DequantizeLinear), and at least QUANTIZED_SHARE of its scale.
- Always, for an output of more than one value: its norm within NORM_TOLERANCE of the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NORM_TOLERANCE = 0.02  # an output's norm within 2% of the reference's
NORM_MIN_ELEMENTS = 2  # ... for an output of at least this many values (one value has no direction to keep)
FLOAT_SHARE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-3, "float64": 1e-6}
# EPs that compute float graphs in float16 by default (QNN HTP, OpenVINO GPU/NPU, the DirectML NPU path).
FLOAT16_COMPUTE = ("qnn", "dml-npu", "openvino-gpu", "openvino-npu")
# EPs whose default session computes float32 MatMul/Gemm and convolutions in TF32 on NVIDIA GPUs
# since Ampere, and the provider option that turns it off.
TF32_COMPUTE = {"cuda": "use_tf32"}
QUANTIZED_SHARE = 1e-2  # the least a quantized model's output may differ, of its scale
GRID_STEPS = 2  # steps of an 8-bit grid over a quantized output's calibrated range
DECISION_COSINE = 0.99  # an output whose decision agrees holds beyond the max abs diff only this close in direction


@dataclass(frozen=True)
class Tolerance:
    absolute: float  # the largest max abs diff allowed
    rule: str  # how it was set, for the report


def tolerance_for(ep: str, reference: np.ndarray, candidate_dtype: str, quantized_range: float | None,
                  quantized: bool, tf32: bool = False) -> Tolerance:
    """The largest max abs diff allowed for one output (see the module's docstring); ``tf32``: the
    session computes float32 products in TF32."""
    if reference.dtype.kind != "f":
        return Tolerance(0.0, "exact (not a float output)")
    scale = max(1.0, float(np.abs(reference).max())) if reference.size else 1.0
    share = FLOAT_SHARE.get(candidate_dtype, 1e-3)
    precision = candidate_dtype
    if ep in FLOAT16_COMPUTE and share < FLOAT_SHARE["float16"]:
        share, precision = FLOAT_SHARE["float16"], f"float16 compute on {ep}"
    elif tf32 and candidate_dtype == "float32":
        share, precision = FLOAT_SHARE["float16"], f"TF32 compute on {ep}: {TF32_COMPUTE[ep]} on (ORT's default)"
    if not quantized:
        return Tolerance(share * scale, f"{share:g} of the output's scale {scale:.4g} ({precision})")
    least = max(share, QUANTIZED_SHARE) * scale
    if quantized_range:
        steps = GRID_STEPS * quantized_range / 255
        if steps > least:
            return Tolerance(steps, f"{GRID_STEPS} steps of an 8-bit grid over the output's quantized range "
                                    f"{quantized_range:.4g} (its DequantizeLinear scale)")
    return Tolerance(least, f"{max(share, QUANTIZED_SHARE):g} of the output's scale {scale:.4g} (quantized model)")
