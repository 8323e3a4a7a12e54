"""How close an EP's output must be to the CPU EP's: one rule for load and compile.

- Float models: a share of the output's scale (its largest magnitude, at least 1) by the precision
  the EP computes in: 1e-3 for float32, 1e-2 where the EP runs float graphs in float16 (QNN's HTP,
  the DirectML NPU path, OpenVINO's GPU and NPU devices) or its float32 matrix products and
  convolutions in TF32 (CUDA's default session; TF32 keeps float16's 10-bit mantissa).
- Quantized (QDQ) models: the model's own quantization steps. An EP's integer arithmetic rounds
  some steps otherwise than the CPU EP's, and the error grows through the layers, so an output
  may differ by GRID_STEPS steps of an 8-bit grid over the output's calibrated range (read from
  the DequantizeLinear that makes it), and by at least 1% of its scale.
- Always, for an output of more than one value: the output's norm within NORM_TOLERANCE of the
  reference's, so an output scaled as a whole (its direction right, its size not) fails however
  close its cosine is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ortprep.runtime.compare import compare_arrays

NORM_TOLERANCE = 0.02  # an output's norm within 2% of the reference's
NORM_MIN_ELEMENTS = 2  # ... for an output of at least this many values (one value has no direction to keep)
FLOAT_SHARE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-3, "float64": 1e-6}
# EPs that compute float graphs in float16 by default (QNN HTP: enable_htp_fp16_precision; see the
# qnn table's HTP constraint; OpenVINO GPU/NPU: f16 inference precision; the DirectML NPU path).
FLOAT16_COMPUTE = ("qnn", "dml-npu", "openvino-gpu", "openvino-npu")
# EPs whose default session computes float32 MatMul/Gemm and cuDNN convolutions in TF32 (float32's
# range, float16's 10-bit mantissa) on NVIDIA GPUs of the Ampere generation and later, and the
# provider option that turns it off. CUDA: ORT's CUDAExecutionProviderInfo sets use_tf32 to true
# ("By default, enable TF32 to speed up float GEMM/MatMul or cuDNN convolution of float matrices",
# onnxruntime/core/providers/cuda/cuda_execution_provider_info.h). Measured on an H200 with
# onnxruntime-gpu 1.31.1 (bench/RESULTS.md, "The journey corpus on CUDA").
TF32_COMPUTE = {"cuda": "use_tf32"}
QUANTIZED_SHARE = 1e-2  # the least a quantized model's output may differ, of its scale
GRID_STEPS = 2  # steps of an 8-bit grid over a quantized output's calibrated range
DECISION_COSINE = 0.99  # an output whose decision agrees holds beyond the max abs diff only this close in direction
# Ops that move values without changing them: an output behind them keeps its DequantizeLinear's steps.
_PASS_THROUGH = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Slice", "Gather", "Split",
                 "Concat", "MaxPool", "Relu", "Clip")


@dataclass(frozen=True)
class Tolerance:
    absolute: float  # the largest max abs diff allowed
    rule: str  # how it was set, for the report


def output_ranges(proto) -> dict[str, float]:
    """Each graph output's calibrated range (scale x number of levels), from the DequantizeLinear
    that makes it (directly, or through ops that only move values); outputs without one are absent."""
    from onnx import numpy_helper

    weights = {t.name: t for t in proto.graph.initializer}
    constants = {n.output[0]: n for n in proto.graph.node if n.op_type == "Constant" and n.output}
    producer = {out: node for node in proto.graph.node for out in node.output}

    def array(name: str):
        if name in weights:
            try:
                return numpy_helper.to_array(weights[name])
            except Exception:  # noqa: BLE001 - a scale kept in external data that is not loaded: no range
                return None
        node = constants.get(name)
        if node is not None:
            for attribute in node.attribute:
                if attribute.name == "value":
                    return numpy_helper.to_array(attribute.t)
        return None

    def levels(node) -> int:
        zero = array(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        data = array(node.input[0])
        kind = zero.dtype if zero is not None else (data.dtype if data is not None else np.dtype(np.uint8))
        return int(2 ** (8 * np.dtype(kind).itemsize) - 1)

    ranges = {}
    for output in proto.graph.output:
        name, hops = output.name, 0
        while hops < 8 and name in producer:
            node = producer[name]
            if node.op_type == "DequantizeLinear":
                scale = array(node.input[1])
                if scale is not None and scale.size:
                    ranges[output.name] = float(np.max(np.abs(scale))) * levels(node)
                break
            if node.op_type not in _PASS_THROUGH or not node.input:
                break
            name, hops = node.input[0], hops + 1
    return ranges


# TF32 exists on NVIDIA GPUs of compute capability 8.0 (Ampere) and later; on older ones (a T4, a
# V100) use_tf32 changes nothing and the session computes in float32.
TF32_LEAST_CAPABILITY = 8.0


def computes_tf32(ep: str, provider_options: dict[str, str] | None) -> bool:
    """Does this EP's session, with these provider options, compute float32 products in TF32
    (TF32_COMPUTE; on by default where the EP has the option) on this machine's GPU? Where the
    GPU's compute capability cannot be read (no nvidia-smi), TF32 is taken as on."""
    from ortprep.runtime.gpu import compute_capability

    option = TF32_COMPUTE.get(ep)
    if option is None or str((provider_options or {}).get(option, "1")).strip().lower() in ("0", "false"):
        return False
    capability = compute_capability(int((provider_options or {}).get("device_id", 0) or 0))
    return capability is None or capability >= TF32_LEAST_CAPABILITY


def tolerance_for(ep: str, reference: np.ndarray, candidate_dtype: str, quantized_range: float | None,
                  quantized: bool, tf32: bool = False) -> Tolerance:
    """The largest max abs diff allowed for one output (see the module's docstring); ``tf32``: the
    session computes float32 products in TF32 (:func:`computes_tf32`)."""
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


def judge_output(name: str, reference: np.ndarray, candidate: np.ndarray, tolerance: Tolerance) -> dict[str, Any]:
    """One output against the rule: its figures, the tolerance used, and whether it holds."""
    diff = compare_arrays(name, reference, candidate)
    ok = diff.shape_match and diff.max_abs_diff is not None and not diff.nonfinite \
        and diff.max_abs_diff <= tolerance.absolute
    # (a single value's "norm" is the value itself: its ratio is a relative error, which the max abs
    # diff already bounds; a VAD's probability of 0.03 off by 0.003 was refused at norm ratio 0.89)
    scaled = (reference.dtype.kind == "f" and reference.size >= NORM_MIN_ELEMENTS and diff.norm_ratio is not None
              and abs(diff.norm_ratio - 1.0) > NORM_TOLERANCE)
    return {"name": name, "max_abs_diff": diff.max_abs_diff, "cosine": diff.cosine, "norm_ratio": diff.norm_ratio,
            "tolerance": tolerance.absolute, "tolerance_rule": tolerance.rule, "nonfinite": diff.nonfinite,
            "shape_match": diff.shape_match, "within_tolerance": bool(ok and not scaled)}


def judge_outputs(proto, ep: str, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
                  metrics: dict[str, str] | None = None, provider_options: dict[str, str] | None = None
                  ) -> list[dict[str, Any]]:
    """Every output of ``reference`` judged (a missing one fails); ``proto`` is the model that made
    ``candidate`` (its DequantizeLinear scales set a quantized output's tolerance); ``metrics``:
    output -> decision (--metric), over what each output's form says; ``provider_options``: the
    session's, where they set the precision the EP computes in (TF32_COMPUTE)."""
    from ortprep.runtime.decisions import infer_decisions, judge_decision

    quantized = any(node.op_type in ("QuantizeLinear", "DequantizeLinear") for node in proto.graph.node)
    ranges = output_ranges(proto) if quantized else {}
    decisions = infer_decisions(proto, [{k: np.asarray(v) for k, v in reference.items()}], metrics)
    tf32 = computes_tf32(ep, provider_options)
    judged = []
    for name, value in reference.items():
        other = candidate.get(name)
        if other is None:
            judged.append({"name": name, "max_abs_diff": None, "cosine": None, "norm_ratio": None, "tolerance": None,
                           "tolerance_rule": "output missing", "nonfinite": False, "shape_match": False,
                           "within_tolerance": False})
            continue
        value, other = np.asarray(value), np.asarray(other)
        record = judge_output(name, value, other, tolerance_for(ep, value, str(other.dtype), ranges.get(name), quantized, tf32))
        decision = decisions.get(name)
        if decision is not None and decision.gated:
            record["decision"] = judge_decision(decision, [value], [other])
            agreed = record["decision"]["agreement"]
            # Beyond the max abs diff at some elements, yet the same decision, the same direction and
            # the same size: what the application reads is the same (a detector's map off at a few
            # pixels with its text regions unchanged), so the output holds, and the rule says why.
            if (not record["within_tolerance"] and record["decision"]["passed"] and record["shape_match"]
                    and not record["nonfinite"] and (decision.replaces_cosine or (record["cosine"] or 0.0) >= DECISION_COSINE)
                    and record["norm_ratio"] is not None and abs(record["norm_ratio"] - 1.0) <= NORM_TOLERANCE):
                record["within_tolerance"] = True
                record["tolerance_rule"] += (f"; exceeded at some elements, but the decision ({decision.label()}) agrees "
                                             f"({agreed:.4f}), cosine {record['cosine']:.5f}, norm ratio "
                                             f"{record['norm_ratio']:.4f}")
        judged.append(record)
    return judged


def judge_each_sample(proto, ep: str, references: list[dict], candidates: list[dict],
                      metrics: dict[str, str] | None = None, provider_options: dict[str, str] | None = None,
                      more: list[dict] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each sample's outputs judged (:func:`judge_outputs`), then each gated decision pooled over
    all the samples (:func:`pool_decisions`): what compile --eval holds the compiled model to, and
    quantize the target EP's run to (its ``ep_apart``). ``more``: the reference's outputs on other
    samples, whose decisions' margins join the expected agreement (judge_decision). Returns the
    samples' records (``{"sample", "passed", "cosine", "outputs"}``) and the pooled decisions."""
    judged = []
    for index, (reference, candidate) in enumerate(zip(references, candidates)):
        outputs = judge_outputs(proto, ep, reference, candidate, metrics, provider_options)
        lowest = min((o["cosine"] for o in outputs if o["cosine"] is not None), default=None)
        judged.append({"sample": index, "passed": all(o["within_tolerance"] for o in outputs), "cosine": lowest,
                       "outputs": outputs})
    return judged, pool_decisions(proto, references, candidates, judged, metrics, more)


def pool_decisions(proto, references: list[dict], candidates: list[dict], judged: list[dict],
                   metrics: dict[str, str] | None = None, more: list[dict] | None = None) -> dict[str, Any]:
    """Each gated decision judged over all the samples together, as quantize's gate judges it (a
    share of classes, positions, whole strings, regions, against its bar), instead of on one
    sample at a time: one CTC position in one of 24 samples otherwise fails a compile that keeps
    96% of the strings, stricter than the gate that passed the model. Where an output's pooled
    decision passes, a sample that failed on that output only by its decision (the same
    direction, cosine >= DECISION_COSINE, and the same size) holds, and its rule says why; the
    elementwise tolerance, the norm and NaN/Inf stay per sample."""
    from ortprep.runtime.decisions import infer_decisions, judge_decision

    decisions = infer_decisions(proto, [{k: np.asarray(v) for k, v in r.items()} for r in references], metrics)
    pooled: dict[str, Any] = {}
    for name, decision in decisions.items():
        if not decision.gated or not all(name in c for c in candidates):
            continue
        record = judge_decision(decision, [np.asarray(r[name]) for r in references], [c[name] for c in candidates],
                                [np.asarray(m[name]) for m in more or [] if name in m] if decision.reads_margins else None)
        pooled[name] = record
        if not record.get("passed"):
            continue
        for sample in judged:
            output = next((o for o in sample["outputs"] if o["name"] == name), None)
            if (output is None or output["within_tolerance"] or not output["shape_match"] or output["nonfinite"]
                    or (not decision.replaces_cosine and (output["cosine"] or 0.0) < DECISION_COSINE)
                    or output["norm_ratio"] is None
                    or abs(output["norm_ratio"] - 1.0) > NORM_TOLERANCE):
                continue
            output["within_tolerance"] = True
            output["tolerance_rule"] += (f"; exceeded at some elements, but the decision ({decision.label()}) over all "
                                         f"{len(judged)} samples agrees ({record['agreement']:.4f}) and passes")
            sample["passed"] = all(o["within_tolerance"] for o in sample["outputs"])
    return pooled
