"""Quantize's gate on one side: the quantized model's outputs (on the CPU EP or the target EP)
against the float model's on the CPU EP, over the evaluation samples: each output's lowest cosine,
its norm ratio (pooled, and per sample for large outputs), absolute error where the float output is
flat, and each decision the application reads."""

from __future__ import annotations

import statistics

import numpy as np

from ortprep.fidelity.compare import Degenerate, OutputDiff, compare_arrays, degenerate
from ortprep.fidelity.cosine_tail import SHARE, expected_share
from ortprep.fidelity.decisions import Decision, judge_decision, named
from ortprep.fidelity.evaluation import Judgement
from ortprep.fidelity.tolerances import NORM_TOLERANCE


DEGENERATE_TOL = 0.05  # a flat output's largest absolute error, relative to its range or scale


def flat_outputs(reference: list[dict[str, np.ndarray]], bounds: dict | None) -> dict[str, Degenerate]:
    """The float outputs the samples leave flat (constant, near zero, or barely moving within the
    range the graph bounds them to): cosine means nothing there."""
    flat: dict[str, Degenerate] = {}
    for name in reference[0] if reference else {}:
        if np.asarray(reference[0][name]).dtype.kind != "f":
            continue
        # samples of different shapes (OCR crops, images of several sizes) are one set of values here
        found = degenerate(np.concatenate([np.asarray(sample[name]).ravel() for sample in reference]),
                           (bounds or {}).get(name))
        if found is not None:
            flat[name] = found
    return flat


# An output of at least this many values per sample has its norm ratio judged sample by sample:
# random error moves a norm by about (relative error) / sqrt(size) along the output, so there a
# per-sample ratio past 1 +- NORM_TOLERANCE is a scale, not noise; a smaller output (a few logits)
# is judged over the samples pooled.
SAMPLE_NORM_SIZE = 1024
# A sample counts where its float output carries at least this share of the median sample's
# energy (a near-silent sample's ratio is a relative error of almost nothing).
SAMPLE_NORM_FLOOR = 0.01


def sample_norm_ratio(energies: list[tuple[float, float]]) -> float | None:
    """Of the samples' norm ratios (candidate over float), the one farthest from 1, as the lowest
    cosine is the worst sample's: an output shrunk on some inputs only is as wrong there as a
    uniformly scaled one (docs/decisions/fidelity-quantize-gate.md). None without such samples."""
    if not energies:
        return None
    median = float(np.median([ref for ref, _ in energies]))
    ratios = [float(np.sqrt(cand / ref)) for ref, cand in energies if ref > 0 and ref >= SAMPLE_NORM_FLOOR * median]
    return max(ratios, key=lambda r: abs(r - 1.0)) if ratios else None


def judge_quantized(
    ep: str,
    reference: list[dict[str, np.ndarray]],
    candidate: list[dict[str, np.ndarray]],
    min_cosine: float,
    flat: dict[str, Degenerate],
    decisions: dict[str, Decision] | None = None,
    more: list[dict[str, np.ndarray]] | None = None,
) -> Judgement:
    """``candidate`` (the quantized model's outputs per sample, on ``ep``) against ``reference``
    (the float model's on the CPU EP). An output passes when its lowest cosine reaches
    ``min_cosine`` and its norm is within NORM_TOLERANCE of the float one's (a uniformly scaled
    output has cosine 1), pooled over the samples and, for an output of SAMPLE_NORM_SIZE values
    or more, on every sample; a flat output (``flat``) by its absolute error instead. An output
    with no gated decision must also keep the floor on the share of unseen inputs its samples'
    spread expects (cosine_tail.expected_share: ``cosine_expected`` in its record).
    An output with a decision (``decisions``: fidelity/decisions/, what the application reads
    from it) must also decide the same: its agreement reaches the decision's REQUIRED share."""
    decisions = decisions or {}
    per_output: dict[str, list] = {}
    shapes = {name: list(np.shape(value)) for name, value in (reference[0] if reference else {}).items()}
    energy: dict[str, list[float]] = {}  # output -> [sum of squares of the float values, of the candidate's]
    sample_energy: dict[str, list[tuple[float, float]]] = {}  # output -> the same per sample (large outputs)
    per_sample: list[float] = []
    for ref_sample, cand_sample in zip(reference, candidate):
        sample_cosines = []
        for name, value in ref_sample.items():
            other = cand_sample.get(name)
            if other is None:
                diff = OutputDiff(name, None, None, None, False, False)
            else:
                diff = compare_arrays(name, value, other)
            per_output.setdefault(name, []).append((diff, other if diff.shape_match else None))
            if diff.shape_match and np.asarray(value).dtype.kind == "f":
                ref, cand = np.asarray(value, np.float64), np.asarray(other, np.float64)
                finite = np.isfinite(ref) & np.isfinite(cand)
                sums = energy.setdefault(name, [0.0, 0.0])
                sums[0] += float(np.sum(ref[finite] ** 2))
                sums[1] += float(np.sum(cand[finite] ** 2))
                if ref.size >= SAMPLE_NORM_SIZE:
                    sample_energy.setdefault(name, []).append((float(np.sum(ref[finite] ** 2)),
                                                               float(np.sum(cand[finite] ** 2))))
            if diff.cosine is not None and name not in flat:
                sample_cosines.append(diff.cosine)
            elif diff.cosine is None and name not in flat:
                sample_cosines.append(-1.0)  # no comparable output: the worst a sample can do
        if sample_cosines:
            per_sample.append(min(sample_cosines))
    outputs, verdicts = [], []
    for name, rows in per_output.items():
        cosines = [d.cosine for d, _ in rows if d.cosine is not None]
        decision = decisions.get(name)
        judged_decision = (
            judge_decision(
                decision,
                [sample[name] for sample in reference],
                [other for _, other in rows],
                [sample[name] for sample in more or [] if name in sample],
            )
            if decision is not None
            else None
        )
        if judged_decision is not None:
            judged_decision = named({"name": name, **judged_decision}, name)
        agreed = judged_decision["agreement"] if judged_decision else None
        tops = [agreed] if decision is not None and decision.kind in ("top1", "argmax") and agreed is not None else []
        worst_abs = max((d.max_abs_diff for d, _ in rows if d.max_abs_diff is not None), default=None)
        sums = energy.get(name)
        norm_ratio = float(np.sqrt(sums[1] / sums[0])) if sums and sums[0] > 0 else None
        worst_sample = sample_norm_ratio(sample_energy.get(name, []))
        if worst_sample is not None and norm_ratio is not None and abs(worst_sample - 1.0) > abs(norm_ratio - 1.0):
            norm_ratio = worst_sample
        comparable = len(cosines) == len(rows)  # an output missing or misshapen on a sample fails
        record = {
            "name": name,
            "cosine": min(cosines) if cosines else None,
            "norm_ratio": norm_ratio,
            "max_abs_diff": worst_abs,
            "top1_agreement": statistics.fmean(tops) if tops else None,
            "judged_by": "cosine",
            "shape": shapes.get(name),
        }
        if name in flat:
            limit = DEGENERATE_TOL * flat[name].scale
            record["judged_by"] = f"absolute error <= {limit:.3g} (output {flat[name].what})"
            verdict = (
                worst_abs is not None and worst_abs <= limit and all(d.shape_match and not d.nonfinite for d, _ in rows)
            )
        else:
            # a gated ctc decision judges the output in place of the cosine floor (decisions.CTC_REPLACES_COSINE)
            replaced = decision is not None and decision.replaces_cosine
            if replaced:
                record["cosine_replaced_by"] = decision.label()
            verdict = (comparable and record["cosine"] is not None and (replaced or record["cosine"] >= min_cosine)
                       and (norm_ratio is None or abs(norm_ratio - 1.0) <= NORM_TOLERANCE))
            if not replaced and (decision is None or decision.kind == "cosine" or not decision.gated):
                # judged by cosine alone: held on unseen inputs too (fidelity/cosine_tail.py)
                share = expected_share(cosines, min_cosine) if comparable else None
                if share is not None:
                    record["cosine_expected"] = {"share": share, "asks": SHARE, "samples": len(cosines)}
                    verdict = verdict and share >= SHARE
        if decision is not None and decision.kind != "cosine":
            # held on the samples, and on what their margins and errors say of unseen ones
            record["decision"] = judged_decision
            if decision.gated:
                verdict = verdict and bool(judged_decision["passed"])
        record["passed"] = bool(verdict)
        verdicts.append(bool(verdict))
        outputs.append(record)
    judged = [o for o in outputs if o["judged_by"] == "cosine"]
    cosines = [o["cosine"] for o in judged if o["cosine"] is not None]
    ratios = [o["norm_ratio"] for o in judged if o["norm_ratio"] is not None]
    tops = [o["top1_agreement"] for o in outputs if o["top1_agreement"] is not None]
    spread = ({"samples": len(per_sample), "min": min(per_sample), "median": statistics.median(per_sample),
               "max": max(per_sample)} if per_sample else None)
    return Judgement(
        ep=ep,
        cosine=min(cosines) if cosines else None,
        norm_ratio=max(ratios, key=lambda r: abs(r - 1.0)) if ratios else None,
        max_abs_diff=max((o["max_abs_diff"] for o in outputs if o["max_abs_diff"] is not None), default=None),
        top1_agreement=min(tops) if tops else None,
        passed=bool(verdicts) and all(verdicts) and len(candidate) == len(reference),
        outputs=outputs,
        spread=spread,
        sample_cosines=per_sample,
    )

