"""An EP's outputs against the CPU EP's run of the same model, by the rule of tolerances.py (the
EP's precision, a quantized model's own steps, the norm), each output's decision besides: what
load and compile hold a session to, and quantize holds its target EP's run to."""

from __future__ import annotations

from typing import Any

import numpy as np

from ortprep.fidelity.compare import compare_arrays
from ortprep.fidelity.decisions import dfl_hint, infer_decisions, judge_decision, named
from ortprep.fidelity.graph import output_ranges
from ortprep.fidelity.tolerances import (DECISION_COSINE, NORM_MIN_ELEMENTS, NORM_TOLERANCE, Tolerance,
                                         tolerance_for)

__all__ = ["DECISION_COSINE", "Tolerance", "first_apart", "judge_ep_outputs", "judge_ep_samples", "judge_output",
           "pool_decisions", "summarize_samples", "tolerance_for"]


def judge_output(name: str, reference: np.ndarray, candidate: np.ndarray, tolerance: Tolerance) -> dict[str, Any]:
    """One output against the rule: its figures, the tolerance used, and whether it holds."""
    diff = compare_arrays(name, reference, candidate)
    ok = diff.shape_match and diff.max_abs_diff is not None and not diff.nonfinite \
        and diff.max_abs_diff <= tolerance.absolute
    # (a single value's "norm" is the value itself: its ratio is a relative error, which the max abs
    # diff already bounds)
    scaled = (reference.dtype.kind == "f" and reference.size >= NORM_MIN_ELEMENTS and diff.norm_ratio is not None
              and abs(diff.norm_ratio - 1.0) > NORM_TOLERANCE)
    return {"name": name, "max_abs_diff": diff.max_abs_diff, "cosine": diff.cosine, "norm_ratio": diff.norm_ratio,
            "tolerance": tolerance.absolute, "tolerance_rule": tolerance.rule, "nonfinite": diff.nonfinite,
            "shape_match": diff.shape_match, "within_tolerance": bool(ok and not scaled)}


def _held_by_decision(record: dict[str, Any], decision) -> bool:
    """Beyond the max abs diff at some elements, yet the same direction and the same size, where
    the decision agrees: what the application reads is the same."""
    return (not record["within_tolerance"] and record["shape_match"] and not record["nonfinite"]
            and (decision.replaces_cosine or (record["cosine"] or 0.0) >= DECISION_COSINE)
            and record["norm_ratio"] is not None and abs(record["norm_ratio"] - 1.0) <= NORM_TOLERANCE)


def judge_ep_outputs(proto, ep: str, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
                     metrics: dict[str, str] | None = None, tf32: bool = False) -> list[dict[str, Any]]:
    """Every output of ``reference`` judged (a missing one fails); ``proto`` is the model that made
    ``candidate`` (its DequantizeLinear scales set a quantized output's tolerance); ``metrics``:
    output -> decision (--metric); ``tf32``: the session computes float32 products in TF32."""
    quantized = any(node.op_type in ("QuantizeLinear", "DequantizeLinear") for node in proto.graph.node)
    ranges = output_ranges(proto) if quantized else {}
    decisions = infer_decisions(proto, [{k: np.asarray(v) for k, v in reference.items()}], metrics)
    judged = []
    for name, value in reference.items():
        other = candidate.get(name)
        if other is None:
            judged.append({"name": name, "max_abs_diff": None, "cosine": None, "norm_ratio": None, "tolerance": None,
                           "tolerance_rule": "output missing", "nonfinite": False, "shape_match": False,
                           "within_tolerance": False})
            continue
        value, other = np.asarray(value), np.asarray(other)
        tolerance = tolerance_for(ep, value, str(other.dtype), ranges.get(name), quantized, tf32)
        record = judge_output(name, value, other, tolerance)
        decision = decisions.get(name)
        if decision is not None and decision.gated:
            record["decision"] = named(judge_decision(decision, [value], [other]), name)
            agreed = record["decision"]["agreement"]
            if record["decision"]["passed"] and _held_by_decision(record, decision):
                record["within_tolerance"] = True
                record["tolerance_rule"] += (f"; exceeded at some elements, but the decision ({decision.label()}) "
                                             f"agrees ({agreed:.4f}), cosine {record['cosine']:.5f}, norm ratio "
                                             f"{record['norm_ratio']:.4f}")
        judged.append(record)
    return judged


def judge_ep_samples(proto, ep: str, references: list[dict], candidates: list[dict],
                     metrics: dict[str, str] | None = None, tf32: bool = False,
                     more: list[dict] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each sample's outputs judged (:func:`judge_ep_outputs`), then each gated decision pooled over
    all the samples (:func:`pool_decisions`). ``more``: the reference's outputs on other samples,
    whose decisions' margins join the expected agreement. Returns the samples' records
    (``{"sample", "passed", "cosine", "outputs"}``) and the pooled decisions."""
    judged = []
    for index, (reference, candidate) in enumerate(zip(references, candidates)):
        outputs = judge_ep_outputs(proto, ep, reference, candidate, metrics, tf32)
        lowest = min((o["cosine"] for o in outputs if o["cosine"] is not None), default=None)
        judged.append({"sample": index, "passed": all(o["within_tolerance"] for o in outputs), "cosine": lowest,
                       "outputs": outputs})
    return judged, pool_decisions(proto, references, candidates, judged, metrics, more)


def pool_decisions(proto, references: list[dict], candidates: list[dict], judged: list[dict],
                   metrics: dict[str, str] | None = None, more: list[dict] | None = None) -> dict[str, Any]:
    """Each gated decision judged over all the samples together, as quantize's gate judges it,
    instead of on one sample at a time (one CTC position in one of 24 samples is not a changed
    application). Where an output's pooled decision passes, a sample that failed on that output
    only by its decision (the same direction and the same size) holds, and its rule says why; the
    elementwise tolerance, the norm and NaN/Inf stay per sample."""
    decisions = infer_decisions(proto, [{k: np.asarray(v) for k, v in r.items()} for r in references], metrics)
    pooled: dict[str, Any] = {}
    for name, decision in decisions.items():
        if not decision.gated or not all(name in c for c in candidates):
            continue
        record = judge_decision(
            decision,
            [np.asarray(r[name]) for r in references],
            [c[name] for c in candidates],
            [np.asarray(m[name]) for m in more or [] if name in m] if decision.reads_margins else None,
        )
        pooled[name] = record = named(record, name)
        if not record.get("passed"):
            continue
        for sample in judged:
            output = next((o for o in sample["outputs"] if o["name"] == name), None)
            if output is None or not _held_by_decision(output, decision):
                continue
            output["within_tolerance"] = True
            output["tolerance_rule"] += (f"; exceeded at some elements, but the decision ({decision.label()}) over "
                                         f"all {len(judged)} samples agrees ({record['agreement']:.4f}) and passes")
            sample["passed"] = all(o["within_tolerance"] for o in sample["outputs"])
    return pooled


def summarize_samples(judged: list[dict[str, Any]], pooled: dict[str, Any]) -> dict[str, Any]:
    """compile --eval's record of :func:`judge_ep_samples`: the count, the failures, the lowest
    cosine, the worst sample (the lowest cosine among those that fail, else among all)."""
    failed = [j for j in judged if not j["passed"]]
    worst = sorted(failed or judged, key=lambda j: j["cosine"] if j["cosine"] is not None else 1.0)[:1]
    return {"samples": len(judged), "failed": len(failed),
            "lowest_cosine": min((j["cosine"] for j in judged if j["cosine"] is not None), default=None),
            "worst": worst[0] if worst else None, "decisions": pooled}


def first_apart(judged: list[dict[str, Any]], references: list[dict], metrics: dict[str, str] | None = None
                ) -> dict | None:
    """The first output beyond the rule in :func:`judge_ep_samples`' records, with its sample and
    a DFL hint where its form suggests one; None where every output holds."""
    for sample in judged:
        for record in sample["outputs"]:
            if not record["within_tolerance"]:
                shape = np.shape(references[sample["sample"]].get(record["name"], ()))
                return {"sample": sample["sample"], **{key: record.get(key) for key in (
                    "name", "max_abs_diff", "cosine", "norm_ratio", "tolerance", "tolerance_rule")},
                    "hint": dfl_hint(record["name"], tuple(shape), metrics).lstrip("; ") or None}
    return None
