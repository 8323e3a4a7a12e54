"""Evaluation of a quantized model against the float one: both run on the same samples, the
outputs are compared (cosine and norm ratio per output, absolute error where an output is flat,
top-1 agreement, latency) and the accuracy gate is decided, on the CPU EP and, where it runs
here, on the target EP (ep_gate.py); and, where the gate fails, where the error comes from (the
nodes that add it, the tensors whose quantization is noisiest).

Every model run of quantize starts here, in a child process: :func:`_run_model` for the runs
compared here, :func:`opset_upgrade_verified` for the check of an opset upgrade.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import onnx
from onnx import ModelProto

from ortprep.findings import Finding
from ortprep.runtime.compare import Degenerate, OutputDiff, compare_arrays, degenerate
from ortprep.runtime.decisions import (REQUIRED_SEQUENCES, Decision, decision_shortfall, dfl_hint, infer_decisions,
                                       judge_decision, margin_shortfall, share_gaps, with_margin)
from ortprep.runtime.isolated import RunOutcome, run_isolated, time_isolated
from ortprep.runtime.tolerance import NORM_TOLERANCE
from ortprep.steps.quantize.calibrate import exposure_chunks
from ortprep.steps.quantize.edits import QUANT_OPS, with_outputs
from ortprep.transforms.verify import EXACT_GATE, VerifyResult, float_intermediates, run_model, verify_run

if TYPE_CHECKING:
    from ortprep.steps.quantize.ep_gate import GateTarget

LATENCY_RUNS = 10


def _run_model(model: Path, feeds: dict[str, np.ndarray] | list[dict[str, np.ndarray]]) -> RunOutcome:
    """Run ``model`` on ``feeds`` in a child process (untimed: paired_latency times)."""
    return run_isolated(model, feeds)


def _exposed_run(model: Path, feeds: dict[str, np.ndarray] | list[dict[str, np.ndarray]]) -> RunOutcome:
    """A run that exposes intermediates, with ORT's graph optimizations off: which tensors one
    group exposes must not change the values of the others (a fusion happens only where its
    intermediates are not exposed, and a fused Q/DQ pair computes in integers): each group then
    sees what a run exposing every tensor saw."""
    return run_isolated(model, feeds, optimization="disable")


def opset_upgrade_verified(original: ModelProto, upgraded: ModelProto, feeds: dict[str, np.ndarray]) -> VerifyResult:
    """Whether ``upgraded`` (an opset conversion of ``original``) computes the same outputs on
    ``feeds``: both run in child processes (ortprep.transforms.verify), judged by the exact gate."""
    return verify_run(run_model(original, feeds), run_model(upgraded, feeds), EXACT_GATE)


def fmt_cosine(value: float | None, against: float | None = None) -> str:
    """A cosine for a message: four decimals (more where ``against``, the gate's threshold, needs
    them: 0.99999997 below a gate of 0.999999999995 is not '1.0000'), or n/a."""
    if value is None:
        return "n/a"
    digits = 4
    if against is not None and 0.0 < 1.0 - against < 1e-4:
        digits = min(12, int(np.ceil(-np.log10(1.0 - against))) + 1)
    return f"{value:.{digits}f}"


def outputs_shortfall(outputs: list[dict]) -> float:
    """The worst of the outputs' decision shortfalls (decisions.decision_shortfall); 0.0 for none."""
    return max([0.0, *(decision_shortfall(o.get("decision")) for o in outputs)])


def outputs_margin_gap(outputs: list[dict]) -> float:
    """The worst of the outputs' gaps to the decision margin (decisions.margin_shortfall); 0.0 for none."""
    return max([0.0, *(margin_shortfall(o.get("decision")) for o in outputs)])


@dataclass
class Judgement:
    """One run of the quantized model (on the CPU EP, or on the target EP) against the float model
    on the CPU EP, on the evaluation samples: per output, and that side's verdict."""

    ep: str
    cosine: float | None  # lowest over the outputs judged by cosine, over the samples
    norm_ratio: float | None  # of the outputs judged by cosine, the one farthest from 1
    max_abs_diff: float | None
    top1_agreement: float | None
    passed: bool
    outputs: list[dict] = field(default_factory=list)
    error: str | None = None
    spread: dict | None = None  # {"samples", "min", "median", "max"} of each sample's lowest output cosine
    sample_cosines: list[float] = field(default_factory=list)  # each sample's lowest output cosine, in order
    placement: dict | None = None  # the EP's side: {"nodes_total", "nodes_on_ep"} of its session
    apart: dict | None = None  # the EP's side: the first output beyond load's rule against the CPU EP's run (ep_apart)
    limited: dict | None = None  # the EP's side: the samples it judged within --ep-seconds, of those offered (budget.py)

    def failing(self) -> list[dict]:
        """The outputs that fail the gate on this side."""
        return [o for o in self.outputs if not o.get("passed", True)]

    def wrong_outputs(self) -> list[str]:
        """The outputs this side gets wrong: those failing the gate, or else the one it computes apart
        from the CPU EP (ep_apart)."""
        return [o["name"] for o in self.failing()] or ([self.apart["name"]] if self.apart else [])

    @property
    def shortfall(self) -> float:
        """How far this side's decisions fall short of the gate, the worst output's (decision_shortfall)."""
        return outputs_shortfall(self.outputs)

    @property
    def margin_gap(self) -> float:
        """How far this side's decisions fall short of the decision margin, the worst output's."""
        return outputs_margin_gap(self.outputs)

    def summary(self) -> dict:
        """What a search trial records of this side: the figures, each output's, the verdict."""
        return {"ep": self.ep, "cosine": self.cosine, "norm_ratio": self.norm_ratio, "passed": self.passed,
                "outputs": [{"name": o["name"], "cosine": o["cosine"], "norm_ratio": o["norm_ratio"]} for o in self.outputs[:16]],
                "error": self.error, "apart": self.apart}

    def to_record(self) -> dict:
        return {"ep": self.ep, "cosine": self.cosine, "norm_ratio": self.norm_ratio, "max_abs_diff": self.max_abs_diff,
                "top1_agreement": self.top1_agreement, "passed": self.passed, "spread": self.spread, "outputs": self.outputs,
                "error": self.error, "placement": self.placement, "apart": self.apart, "limited": self.limited}


@dataclass
class Confirmation:
    """The gate held over every real sample: the held-back ones and those the model was calibrated
    on, judged together as the held-back ones are alone (each sample's cosine, the norm, each
    decision's share over all of them). Passing with the calibration samples is the weaker test
    (the ranges were set on them), so it is a second condition, never the verdict alone; failing
    with them is strong evidence: measured on the NPU journey, PP-OCRv4's
    recogniser in A16W16 passed on QNN on its 8 held-back samples (every string equal) while 3 of
    its 24 samples' strings changed on QNN (87.5% whole strings against the gate's 95%), and only
    compile, judging all 24, refused it (bench/RESULTS.md, "Held to the calibration samples too")."""

    samples: int  # the calibration samples judged (the EP's side: at most CONFIRM_EP_SAMPLES of them)
    cpu: Judgement  # over the held-back samples and the calibration samples together, in that order
    on_ep: Judgement | None = None
    held_back: int = 0  # how many of each side's samples (its first) are the held-back ones

    @property
    def passed(self) -> bool:
        return self.cpu.passed and (self.on_ep is None or self.on_ep.passed)

    @property
    def failing(self) -> Judgement | None:
        """The side that fails (the CPU EP's first), or None."""
        if not self.cpu.passed:
            return self.cpu
        return self.on_ep if self.on_ep is not None and not self.on_ep.passed else None

    def to_record(self) -> dict:
        return {"samples": self.samples, "held_back": self.held_back, "passed": self.passed, "cpu": self.cpu.to_record(),
                "ep": self.on_ep.to_record() if self.on_ep is not None else None}


@dataclass
class Evaluation:
    """How a quantized model compares with the float one on the evaluation samples, and the verdict.
    The figures are the CPU EP's (as they always were); ``on_ep`` holds the target EP's where it
    judged too, and ``passed`` is the gate's verdict over every side judged."""

    cosine: float | None
    max_abs_diff: float | None
    top1_agreement: float | None
    latency_ratio: float | None
    float_latency_ms: float | None
    quant_latency_ms: float | None
    passed: bool
    outputs: list[dict] = field(default_factory=list)
    error: str | None = None
    spread: dict | None = None  # {"samples", "min", "median", "max"} of each sample's lowest output cosine
    degenerate: list[tuple[str, str]] = field(default_factory=list)  # (output, why cosine means nothing)
    sample_cosines: list[float] = field(default_factory=list)  # each sample's lowest output cosine, in order
    norm_ratio: float | None = None  # the CPU EP's: of the outputs judged by cosine, the one farthest from 1
    cpu_passed: bool | None = None  # the CPU EP's verdict (None: ``passed`` is it)
    on_ep: Judgement | None = None  # the target EP's side, where it judged
    target: dict | None = None  # where the gate was judged (ep_gate.GateTarget.record())
    min_cosine: float | None = None
    ep_skipped: str | None = None  # why the target EP did not run, where it did not
    ep_latency: dict | None = None  # {"ep", "float_ms", "quant_ms", "ratio"}: timed on the target EP (measure_on_target)
    confirmation: Confirmation | None = None  # the same gate on the calibration samples (confirm)
    # a result chosen among trials on the same samples, held to the decision margin (hold_to_margin):
    # {"trials", "samples", "gap", "passed", "side", "output", "kind", "share", "asked", "measured"};
    # None where no choice was made
    selection: dict | None = None

    @property
    def judged_on(self) -> list[str]:
        return ["cpu"] + ([self.on_ep.ep] if self.on_ep is not None else [])

    @property
    def gate_cosine(self) -> float | None:
        """The lowest cosine judged on the held-back samples: the worse of the CPU EP's and the EP's
        (what the search decides on; the calibration samples' figures are in ``confirmation``)."""
        values = [v for v in (self.cosine, self.on_ep.cosine if self.on_ep else None) if v is not None]
        if self.on_ep is not None and self.on_ep.error is not None:
            return None  # the EP gave no outputs: nothing to compare
        return min(values) if values else None

    @property
    def gate_norm_ratio(self) -> float | None:
        """Of both sides' norm ratios on the held-back samples, the one farthest from 1."""
        values = [v for v in (self.norm_ratio, self.on_ep.norm_ratio if self.on_ep else None) if v is not None]
        return max(values, key=lambda r: abs(r - 1.0)) if values else None

    @property
    def cpu_verdict(self) -> bool:
        return self.passed if self.cpu_passed is None else self.cpu_passed

    @property
    def failed_on(self) -> list[str]:
        """The EPs whose outputs fail the gate ("cpu", the target EP)."""
        failed = [] if self.cpu_verdict else ["cpu"]
        failed += [self.on_ep.ep] if self.on_ep is not None and not self.on_ep.passed else []
        if self.confirmation is not None:  # on the calibration samples
            failed += [side.ep for side in (self.confirmation.cpu, self.confirmation.on_ep)
                       if side is not None and not side.passed and side.ep not in failed]
        return failed

    @property
    def shortfall(self) -> float | None:
        """How far the decisions fall short of the gate on the held-back samples, the worse of
        the CPU EP's side and the target EP's: what the accuracy search reads as progress where
        the cosine cannot show it. The calibration samples' sides are left out: they are judged
        only once the held-back ones pass, so two trials' figures would rest on different samples.
        None when the evaluation failed (no outputs to judge)."""
        if self.error is not None:
            return None
        cpu = outputs_shortfall(self.outputs)
        return max(cpu, self.on_ep.shortfall) if self.on_ep is not None else cpu

    @property
    def margin_gap(self) -> float | None:
        """How far the decisions fall short of the decision margin on the held-back samples
        (decisions.margin_shortfall), the worse side's; 0.0 where they hold it or none is gated;
        None when the evaluation failed."""
        if self.error is not None:
            return None
        cpu = outputs_margin_gap(self.outputs)
        return max(cpu, self.on_ep.margin_gap) if self.on_ep is not None else cpu

    @property
    def ep_only(self) -> bool:
        """The CPU EP passes and the target EP fails: the EP's own error, not quantization's."""
        return self.failed_on == [self.on_ep.ep] if self.on_ep is not None else False

    @property
    def worst_sample_cosines(self) -> list[float]:
        """Each sample's lowest output cosine over both sides (the CPU EP's alone where the EP's are missing)."""
        theirs = self.on_ep.sample_cosines if self.on_ep is not None else []
        if len(theirs) != len(self.sample_cosines):
            return list(self.sample_cosines) or list(theirs)
        return [min(a, b) for a, b in zip(self.sample_cosines, theirs)]

    def to_record(self) -> dict:
        ep = None
        if self.on_ep is not None:
            context = self.target or {}
            ep = {**self.on_ep.to_record(), **{key: context.get(key) for key in ("device", "provider_options", "runtime",
                                                                                  "package")}}
        return {
            "cosine": self.cosine,
            "spread": self.spread,
            "max_abs_diff": self.max_abs_diff,
            "top1_agreement": self.top1_agreement,
            "latency_ratio": self.latency_ratio,
            "float_latency_ms": self.float_latency_ms,
            "quant_latency_ms": self.quant_latency_ms,
            "ep_latency": self.ep_latency,
            "passed": self.passed,
            "outputs": self.outputs,
            "error": self.error,
            "norm_ratio": self.norm_ratio,
            "judged_on": self.judged_on,
            "gate": {"min_cosine": self.min_cosine, "norm_tolerance": NORM_TOLERANCE, "cosine": self.gate_cosine,
                     "norm_ratio": self.gate_norm_ratio, "failed_on": self.failed_on, "selection": self.selection},
            "ep": ep,
            "ep_skipped": self.ep_skipped,
            "confirmation": self.confirmation.to_record() if self.confirmation is not None else None,
        }


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
    uniformly scaled one (the NPU journey's detector: norm 0.986 pooled over the gate's samples,
    0.979 on its worst unseen one). None without such samples."""
    if not energies:
        return None
    median = float(np.median([ref for ref, _ in energies]))
    ratios = [float(np.sqrt(cand / ref)) for ref, cand in energies if ref > 0 and ref >= SAMPLE_NORM_FLOOR * median]
    return max(ratios, key=lambda r: abs(r - 1.0)) if ratios else None


def judge(ep: str, reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]], min_cosine: float,
          flat: dict[str, Degenerate], decisions: dict[str, Decision] | None = None,
          more: list[dict[str, np.ndarray]] | None = None) -> Judgement:
    """``candidate`` (the quantized model's outputs per sample, on ``ep``) against ``reference``
    (the float model's on the CPU EP). An output passes when its lowest cosine reaches
    ``min_cosine`` and its norm is within NORM_TOLERANCE of the float one's (a uniformly scaled
    output has cosine 1), pooled over the samples and, for an output of SAMPLE_NORM_SIZE values
    or more, on every sample; a flat output (``flat``) by its absolute error instead.
    An output with a decision (``decisions``: runtime/decisions.py, what the application reads
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
        judged_decision = (judge_decision(decision, [sample[name] for sample in reference], [other for _, other in rows],
                                          [sample[name] for sample in more or [] if name in sample])
                           if decision is not None else None)
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
            verdict = worst_abs is not None and worst_abs <= limit and all(d.shape_match and not d.nonfinite for d, _ in rows)
        else:
            # a gated ctc decision judges the output in place of the cosine floor (decisions.CTC_REPLACES_COSINE)
            replaced = decision is not None and decision.replaces_cosine
            if replaced:
                record["cosine_replaced_by"] = decision.label()
            verdict = (comparable and record["cosine"] is not None and (replaced or record["cosine"] >= min_cosine)
                       and (norm_ratio is None or abs(norm_ratio - 1.0) <= NORM_TOLERANCE))
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


# The float model's outputs kept for margins: at most this many samples, and this many bytes.
MARGIN_SAMPLES, MARGIN_BYTES = 64, 128 * 2**20


def margin_outputs(float_model: Path, feeds: Callable[[], list[dict[str, np.ndarray]]] | None,
                   decisions: dict[str, Decision], reference: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The float model's decided outputs on the samples ``feeds()`` reads (capped at MARGIN_SAMPLES
    and MARGIN_BYTES), for their margins; nothing when no output has a gated decision (then no
    sample is read) or the run fails."""
    names = [name for name, d in decisions.items() if d.gated and d.reads_margins]
    if feeds is None or not names or not reference:
        return []
    feeds = feeds()
    if not feeds:
        return []
    per_sample = sum(np.asarray(reference[0][name]).nbytes for name in names if name in reference[0])
    count = min(len(feeds), MARGIN_SAMPLES, max(1, MARGIN_BYTES // max(per_sample, 1)))
    run = run_isolated(float_model, feeds[:count], outputs=names)
    if not run.ok:
        return []
    return [{name: sample[name] for name in names if name in sample} for sample in run.samples]


def paired_latency(float_model: Path, quant_model: Path, feed: dict[str, np.ndarray]) -> tuple[float, float] | None:
    """(float ms, quantized ms): the medians of 2 x LATENCY_RUNS runs of each, timed in turns of
    one run (float, quantized, then quantized, float, ...) in one worker, so that both meet the same
    load (TimeModels), each in a session that exposes nothing more. Timed in blocks of ten, a
    level-4 MatMulNBits file read 0.90x and 0.96x of its level-0 twin in two runs of one quantize on
    a shared 2-core machine, across the 0.9 that --accuracy-level auto asks (bench/RESULTS.md, session
    28). An FP16 probe read 0.19x and 0.41x the float model's time for openwakeword's mel front end,
    and 0.11x for PP-OCR's direction classifier: the float model was timed in the session that had
    exposed its every intermediate for FP16's scan (2-9x slower); measured directly, about 1.0x.
    None where a run fails."""
    medians = timed_medians([float_model, quant_model], feed)
    return None if medians is None else (medians[0], medians[1])


def timed_medians(models: list[Path], feed: dict[str, np.ndarray]) -> list[float] | None:
    """Each model's median time (ms) over 2 x LATENCY_RUNS runs, one run of each in turn in one
    worker (TimeModels); None where a run fails."""
    times = time_isolated(models, feed, runs=2 * LATENCY_RUNS)
    return None if times is None else [statistics.median(t) for t in times]


def measure_latency(evaluation: Evaluation, float_model: Path, quant_model: Path, feeds: list[dict[str, np.ndarray]]) -> None:
    """Time ``quant_model`` against the float model (paired_latency) where its evaluation did not,
    and set the evaluation's latency figures."""
    if evaluation.quant_latency_ms is not None or not feeds:
        return
    paired = paired_latency(float_model, quant_model, feeds[0])
    if paired is not None:
        evaluation.float_latency_ms, evaluation.quant_latency_ms = paired
        evaluation.latency_ratio = round(paired[1] / paired[0], 3) if paired[0] else None


def evaluate(float_model: Path, quant_model: Path, feeds: list[dict[str, np.ndarray]], min_cosine: float,
             cache: dict[str, RunOutcome] | None = None, bounds: dict | None = None, target: GateTarget | None = None,
             metrics: dict[str, str] | None = None, margin_feeds: Callable[[], list[dict[str, np.ndarray]]] | None = None,
             ep_after_cpu_fails: bool = True, latency_runs: int = LATENCY_RUNS,
             confirm_feeds: Callable[[], list[dict[str, np.ndarray]]] | None = None) -> Evaluation:
    """Run both models on ``feeds`` on the CPU EP and compare; where ``target`` judges on its EP,
    run the quantized model there too and compare its outputs with the float model's on the CPU
    EP. The gate holds on the worse of the two. ``cache`` keeps the float model's run between
    trials (only the quantized model changes). An output that the samples leave flat (constant,
    near zero) is judged by absolute error against its range or scale, not by cosine.
    ``margin_feeds``: reads more samples (the calibration samples) the float model runs on once, so that
    its decisions' margins on them join the expected agreement (runtime/decisions.py).
    ``ep_after_cpu_fails`` False: where the CPU EP already fails the gate, the target EP is not run
    (the gate holds on both, so it cannot pass; a search's trials save the EP's time).
    ``latency_runs`` 0: the quantized model's latency is not timed (a search trial; the result
    chosen is timed afterwards: measure_latency).
    ``confirm_feeds``: reads the samples the model was calibrated on; where the held-back samples
    pass on every side judged, the same gate is held on these too, on the CPU EP (:func:`confirm`;
    the target EP's side waits for the result a search chooses: :func:`confirm_on_target`), and
    failing there fails the evaluation."""
    cache = {} if cache is None else cache
    if "evaluation" not in cache:
        cache["evaluation"] = _run_model(float_model, feeds)  # timed with the candidate (paired_latency)
    reference = cache["evaluation"]
    candidate = _run_model(quant_model, feeds)  # timed below, in turns with the float model
    record = target.record() if target is not None else None
    if not reference.ok or not candidate.ok:
        which = "float" if not reference.ok else "quantized"
        message = reference.message if not reference.ok else candidate.message
        return Evaluation(None, None, None, None, None, None, False, error=f"the {which} model failed: {message}",
                          target=record, min_cosine=min_cosine)
    flat = flat_outputs(reference.samples, bounds)
    cache["flat"], cache["feeds"], cache["metrics"] = flat, feeds, metrics  # for confirm_on_target
    cache["held_back_cpu"] = (str(quant_model), candidate.samples)
    if "decisions" not in cache:  # what the application reads from each output (--metric overrides)
        graph = onnx.load(str(float_model), load_external_data=False)
        cache["decisions"] = infer_decisions(graph, reference.samples, metrics)
    decisions = cache["decisions"]
    if "margins" not in cache:
        cache["margins"] = margin_outputs(float_model, margin_feeds, decisions, reference.samples)
    more = cache["margins"]
    cpu = judge("cpu", reference.samples, candidate.samples, min_cosine, flat, decisions, more)
    on_ep = None
    ep_skipped = None
    if target is not None and target.judged and not cpu.passed and not ep_after_cpu_fails:
        ep_skipped = "the CPU EP already fails the gate"
    elif target is not None and target.judged:
        run = target.run(quant_model, feeds)
        placement = {"nodes_total": run.nodes_total, "nodes_on_ep": run.nodes_on_ep} if run.nodes_total else None
        if run.ok:
            # (the first samples, where --ep-seconds left some out: run.limited)
            on_ep = judge(target.ep, reference.samples[:len(run.samples)], run.samples, min_cosine, flat, decisions, more)
            on_ep.placement = placement
            on_ep.limited = run.limited
            # apart is said wherever both runs are there, so that null means "within load's rule" (an
            # EP whose output is all zeros failed the gate, and apart was null as if it agreed); it
            # decides the EP's side only where both sides pass the gate
            on_ep.apart = ep_apart(quant_model, target.ep, candidate.samples, run.samples, metrics, target.provider_options)
            if on_ep.passed and cpu.passed:
                on_ep.passed = on_ep.apart is None
            cache["ep_held_back"] = (str(quant_model), run.samples)  # for confirm_on_target (the latest trial's only)
        else:
            on_ep = Judgement(target.ep, None, None, None, None, False, error=run.message, placement=placement)
    confirmation = None
    if confirm_feeds is not None and cpu.passed and (on_ep is None or on_ep.passed):
        confirmation = confirm(float_model, quant_model, confirm_feeds, min_cosine, cache, flat, decisions,
                               reference.samples, candidate.samples)
    float_ms = quant_ms = None
    if latency_runs and feeds:
        # both in turns, in the same minute (the reference run above is not timed)
        paired = paired_latency(float_model, quant_model, feeds[0])
        if paired is not None:
            float_ms, quant_ms = paired
    return Evaluation(
        cosine=cpu.cosine,
        max_abs_diff=cpu.max_abs_diff,
        top1_agreement=cpu.top1_agreement,
        latency_ratio=round(quant_ms / float_ms, 3) if float_ms and quant_ms else None,
        float_latency_ms=float_ms,
        quant_latency_ms=quant_ms,
        passed=cpu.passed and (on_ep is None or on_ep.passed) and (confirmation is None or confirmation.passed),
        outputs=cpu.outputs,
        spread=cpu.spread,
        degenerate=[(name, found.what) for name, found in flat.items()],
        sample_cosines=cpu.sample_cosines,
        norm_ratio=cpu.norm_ratio,
        cpu_passed=cpu.passed,
        on_ep=on_ep,
        target=record,
        min_cosine=min_cosine,
        ep_skipped=ep_skipped,
        confirmation=confirmation,
    )


def hold_to_margin(evaluation: Evaluation, trials: int) -> dict | None:
    """A result kept after another trial failed the gate on the same held-back samples was chosen
    by them: among several, the one they favour (the winner's curse), and its figures flatter it.
    Such a result holds each decision's shares half-way from the gate to 1 (decisions.with_margin),
    as the search's cosine aims half-way (search.margin_aim); short of that it fails, and
    ``evaluation.selection`` says by what. ``trials``: how many were judged on those samples.
    Returns the selection record (None: nothing gated, or the evaluation failed already)."""
    if evaluation.error is not None or not evaluation.passed:
        return None
    sides = [("cpu", evaluation.outputs, len(evaluation.sample_cosines))]
    if evaluation.on_ep is not None:  # (the EP's own count: --ep-seconds may have judged fewer there)
        sides.append((evaluation.on_ep.ep, evaluation.on_ep.outputs, len(evaluation.on_ep.sample_cosines)))
    worst = None  # (gap, side, output, what, asked, measured, kind, samples)
    for ep, outputs, samples in sides:
        for output in outputs:
            decision = output.get("decision")
            if not decision or decision.get("passed") is None:
                continue
            for what, asked, value in share_gaps(decision, with_margin):
                if worst is None or asked - value > worst[0]:
                    worst = (asked - value, ep, output["name"], what, asked, value, decision["kind"], samples)
    if worst is None:
        return None
    gap, ep, name, what, asked, value, kind, samples = worst
    gap = max(0.0, gap)  # the worst share is the margin gap (Evaluation.margin_gap), found here with its name
    evaluation.selection = {"trials": trials, "samples": samples, "gap": round(gap, 6),
                            "passed": gap <= 0, "side": ep, "output": name, "kind": kind, "share": what,
                            "asked": round(asked, 6), "measured": round(value, 6)}
    if gap > 0:
        evaluation.passed = False
    return evaluation.selection


def selection_words(selection: dict, ep_text: str) -> str:
    """What the decision margin found short (hold_to_margin), in a few words."""
    where = "the CPU EP" if selection["side"] == "cpu" else ep_text
    gate = 2 * selection["asked"] - 1  # with_margin, undone
    return (f"output '{selection['output']}' ({selection['kind']}): {selection['share']} {selection['measured']:.1%} on "
            f"{where}'s {selection['samples']} held-back samples passes the gate ({gate:.1%}) but not "
            f"{selection['asked']:.1%}, the margin asked of a result chosen among {selection['trials']} trials judged on "
            "those same samples (half-way from the gate to 1: of several trials, they favour the one they chose)")


CONFIRM_EP_SAMPLES = 24  # calibration samples the target EP runs for the confirmation, at most


def confirm_on_target(evaluation: Evaluation, quant_model: Path,
                      feeds: Callable[[], list[dict[str, np.ndarray]]], target: GateTarget, cache: dict) -> None:
    """The confirmation's side on the target EP, for a result whose held-back samples pass on every
    side and whose calibration samples pass with them on the CPU EP (a search's trials judge
    those; the EP's runs of the calibration samples wait for the result chosen: on QNN's HTP
    simulator they take seconds a sample). Sets ``evaluation.confirmation.on_ep`` and, where it
    fails, the verdict."""
    confirmation = evaluation.confirmation
    if (confirmation is None or not confirmation.passed or confirmation.on_ep is not None or evaluation.on_ep is None
            or not evaluation.passed):
        return
    reference, held_back = cache.get("confirmation"), cache.get("evaluation")
    held_on_ep = cache.get("ep_held_back")
    samples = feeds()
    if not samples or reference is None or not reference.ok or held_back is None or not held_back.ok:
        return
    if held_on_ep is None or held_on_ep[0] != str(quant_model):  # a later trial ran on the EP since
        run = target.run(quant_model, cache["feeds"])
        if not run.ok:
            return
        held_on_ep = (str(quant_model), run.samples)
    count = min(len(samples), CONFIRM_EP_SAMPLES)
    run = target.run(quant_model, samples[:count])
    held = held_on_ep[1]  # each side's first samples where --ep-seconds left some out
    confirmation.on_ep = (judge(target.ep, held_back.samples[:len(held)] + reference.samples[:len(run.samples)],
                                held + run.samples, evaluation.min_cosine or 0.99, cache.get("flat", {}),
                                cache.get("decisions", {}))
                          if run.ok else Judgement(target.ep, None, None, None, None, False, error=run.message))
    if run.ok and run.limited:
        confirmation.on_ep.limited = run.limited
    # and, as on the held-back samples, computed as the CPU EP computes the same model (compile --eval
    # judges these very samples by that rule)
    on_cpu, calib_cpu = cache.get("held_back_cpu"), cache.get("confirmation_cpu")
    if (run.ok and confirmation.on_ep.passed and on_cpu is not None and calib_cpu is not None
            and on_cpu[0] == calib_cpu[0] == str(quant_model)):
        confirmation.on_ep.apart = ep_apart(quant_model, target.ep, on_cpu[1][:len(held)] + calib_cpu[1][:len(run.samples)],
                                            held + run.samples, cache.get("metrics"), target.provider_options)
        confirmation.on_ep.passed = confirmation.on_ep.apart is None
    evaluation.passed = evaluation.passed and confirmation.on_ep.passed


def confirm(float_model: Path, quant_model: Path, feeds: Callable[[], list[dict[str, np.ndarray]]], min_cosine: float,
            cache: dict, flat: dict[str, Degenerate], decisions: dict[str, Decision],
            held_back: list[dict[str, np.ndarray]], held_back_cpu: list[dict[str, np.ndarray]]) -> Confirmation | None:
    """The gate (:func:`judge`) over the held-back samples (``held_back``: the float model's
    outputs; ``held_back_cpu``: the quantized model's) and the calibration samples ``feeds()``
    reads, together, on the CPU EP (the EP's side: :func:`confirm_on_target`).
    The float model's run on the calibration samples is kept in ``cache`` between trials. None
    when there are no such samples or the float model does not run on them."""
    samples = feeds()
    if not samples:
        return None
    if "confirmation" not in cache:
        cache["confirmation"] = _run_model(float_model, samples)
    reference = cache["confirmation"]
    if not reference.ok:
        return None
    candidate = _run_model(quant_model, samples)
    if not candidate.ok:
        return Confirmation(len(samples), Judgement("cpu", None, None, None, None, False, error=candidate.message),
                            held_back=len(held_back))
    cpu = judge("cpu", held_back + reference.samples, held_back_cpu + candidate.samples, min_cosine, flat, decisions)
    cache["confirmation_cpu"] = (str(quant_model), candidate.samples)  # for confirm_on_target's ep_apart
    return Confirmation(len(samples), cpu, held_back=len(held_back))


def worst_nodes(float_model: Path, quant_model: Path, feeds: dict[str, np.ndarray], excluded: set[str], limit: int | None = 5,
                cache: dict[str, RunOutcome] | None = None) -> list[tuple[str, str, float]]:
    """(node, op, cosine) of the nodes where the quantization error starts, worst first.

    Every tensor both models compute is compared. A node of the quantized model is blamed when
    its output is worse than what it reads (its inputs traced back through Q/DQ pairs to the
    tensors they quantize): the error starts there. The quantizer may fold nodes (a Relu into
    the preceding MatMul's Q/DQ range), so blame goes to the node that produces the tensor in
    the quantized model."""
    float_proto = onnx.load(str(float_model), load_external_data=False)
    quant_proto = onnx.load(str(quant_model), load_external_data=False)
    names = float_intermediates(float_proto)
    source_of = {}  # DQ/Q output -> the tensor it quantizes
    dequantized = {}  # tensor -> the DQ output its consumers read
    for node in quant_proto.graph.node:
        if node.op_type in QUANT_OPS and node.input:
            source_of[node.output[0]] = source_of.get(node.input[0], node.input[0])
            if node.op_type == "DequantizeLinear":
                dequantized[source_of[node.output[0]]] = node.output[0]
    # Compare what consumers read: the dequantized value where the tensor is quantized (a Relu
    # folded into a Q/DQ range only shows there).
    seen = {name: dequantized.get(name, name) for name in names}
    cache = {} if cache is None else cache
    chunks = exposure_chunks(float_model, names, [feeds])  # groups of at most EXPOSED_BYTES
    quality: dict[str, float] = {}
    for chunk in chunks:
        # one chunk: the float model's run is kept for the next trial; more: run again per chunk
        # (holding every intermediate of both models at once is what bounded memory rules out)
        reference = cache.get("intermediates") if len(chunks) == 1 else None
        if reference is None:
            reference = _exposed_run(with_outputs(float_model, chunk), feeds)
            if len(chunks) == 1:
                cache["intermediates"] = reference
        candidate = _exposed_run(with_outputs(quant_model, [seen[name] for name in chunk]), feeds)
        if not reference.ok or not candidate.ok:
            return []
        for name, value in reference.outputs.items():
            other = candidate.outputs.get(seen.get(name, name))
            if name not in quality and other is not None and value.dtype.kind == "f":
                diff = compare_arrays(name, value, other.astype(value.dtype))
                quality[name] = diff.cosine if diff.cosine is not None else 0.0
        del reference, candidate
    graph_inputs = {v.name for v in quant_proto.graph.input}

    def input_quality(name: str) -> float | None:
        original = source_of.get(name, name)
        if original in quality:
            return quality[original]
        return 1.0 if original in graph_inputs else None

    ranked = []
    for node in quant_proto.graph.node:
        if node.name in excluded or node.op_type in QUANT_OPS:
            continue
        outs = [quality[o] for o in node.output if o in quality]
        if not outs:
            continue
        ins = [q for q in (input_quality(i) for i in node.input) if q is not None]
        introduced = (min(ins) if ins else 1.0) - min(outs)
        if introduced > 1e-4:
            ranked.append((introduced, node.name, node.op_type, min(outs)))
    if not ranked:
        # The error shows at nodes already kept in float: what produces their inputs goes too.
        producers = {out: node for node in quant_proto.graph.node for out in node.output}
        for node in quant_proto.graph.node:
            outs = [quality[o] for o in node.output if o in quality]
            if node.name not in excluded or not outs or min(outs) >= 0.9999:
                continue
            for name in node.input:
                upstream = producers.get(name)
                while upstream is not None and upstream.op_type in QUANT_OPS:
                    upstream = producers.get(upstream.input[0])
                if upstream is not None and upstream.name not in excluded:
                    ranked.append((1.0 - min(outs), upstream.name, upstream.op_type, min(outs)))
    ranked.sort(reverse=True)
    return [(name, op, cosine) for _, name, op, cosine in (ranked if limit is None else ranked[:limit])]


def _noise(data: np.ndarray, quantization: tuple) -> float | None:
    """One tensor's quantization noise (RMS error over the median magnitude); None when it holds
    no finite value."""
    data = data[np.isfinite(data)]
    if data.size == 0:
        return None
    scale, zero, bits = quantization
    if scale is None:  # dynamic: uint8 over the run's range, zero included
        low, high = min(float(data.min()), 0.0), max(float(data.max()), 0.0)
        step = (high - low) / 255 or 1.0
        point = round(-low / step)
        levels = (0, 255)
    else:
        step = float(scale.ravel()[0]) or 1.0
        point = int(zero.ravel()[0]) if zero is not None else 0
        signed = zero is not None and zero.dtype.kind == "i"
        levels = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
    restored = (np.clip(np.round(data / step) + point, *levels) - point) * step
    nonzero = np.abs(data[data != 0])
    typical = float(np.median(nonzero)) if nonzero.size else 0.0
    rms = float(np.sqrt(np.mean((data - restored) ** 2)))
    return rms / typical if typical > 0 else (0.0 if rms == 0 else float("inf"))


def tensor_noise(float_model: Path, quant_model: Path, feeds: list[dict[str, np.ndarray]],
                 cache: dict[str, RunOutcome] | None = None) -> list[tuple[str, float]]:
    """(tensor, noise) for every activation the quantized model quantizes, worst first.

    As ORT's qdq_loss_debug does, each tensor's quantization is measured on its own: the float
    model's values of it, quantized and dequantized with the scale and zero point the quantizer
    chose (or, for dynamic quantization, the per-run range), against themselves. The noise is
    the RMS error over the median magnitude of the values: a tensor whose range a few outlier
    channels set leaves the other channels at the mercy of one step, and scores high even
    though cosine over the whole tensor stays near 1."""
    quant = onnx.load(str(quant_model), load_external_data=False)
    inits = {t.name: t for t in quant.graph.initializer}
    wanted: dict[str, tuple[np.ndarray | None, np.ndarray | None, int]] = {}
    float_proto = onnx.load(str(float_model), load_external_data=False)
    produced = {o for n in float_proto.graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in quant.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    for node in quant.graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) >= 2 and node.input[1] in inits:
            scale = onnx.numpy_helper.to_array(inits[node.input[1]])
            zero = onnx.numpy_helper.to_array(inits[node.input[2]]) if len(node.input) > 2 and node.input[2] in inits else None
            tensor = node.input[0]
            if tensor not in produced:
                # a graph output: the quantizer renames what writes it, and the DQ after the Q writes the name
                tensor = next((r.output[0] for r in readers.get(node.output[0], []) if r.op_type == "DequantizeLinear"
                               and r.output[0] in produced), tensor)
            if scale.size == 1:
                wanted[tensor] = (scale, zero, zero.dtype.itemsize * 8 if zero is not None else 8)
        elif node.op_type == "DynamicQuantizeLinear":
            wanted[node.input[0]] = (None, None, 8)
    names = [n for n in wanted if n in produced or n in {v.name for v in float_proto.graph.input}]
    cache = {} if cache is None else cache
    noise = []
    chunks = exposure_chunks(float_model, names, feeds)
    for chunk in chunks:
        key = "noise:" + ",".join(sorted(chunk)) + f":{id(feeds[0])}:{len(feeds)}"
        reference = cache.get(key)
        if reference is None:
            reference = _exposed_run(with_outputs(float_model, [n for n in chunk if n in produced]), feeds)
            if len(chunks) == 1:  # kept for the next trial only when it is small
                cache[key] = reference
        if not reference.ok:
            return []
        values: dict[str, list[np.ndarray]] = {}
        for sample, feed in zip(reference.samples, feeds):
            for name in chunk:
                value = sample.get(name, feed.get(name))
                if value is not None and np.asarray(value).dtype.kind == "f":
                    values.setdefault(name, []).append(np.asarray(value).ravel())  # float64 one tensor at a time
        del reference
        noise += [(name, _noise(np.concatenate(parts).astype(np.float64), wanted[name])) for name, parts in values.items()]
    noise = [(name, value) for name, value in noise if value is not None]
    noise.sort(key=lambda item: -item[1])
    return noise


def ep_apart(model: Path, ep: str, on_cpu: list[dict[str, np.ndarray]], on_ep: list[dict[str, np.ndarray]],
             metrics: dict[str, str] | None = None, provider_options: dict[str, str] | None = None) -> dict | None:
    """The EP's outputs of ``model`` held to the rule load and compile hold them to
    (runtime/tolerance.py: a quantized output within a few of its own steps of the CPU EP's run of
    the same model, a float one within the EP's precision; the same decision, direction and size
    where some elements are off), sample by sample: the first output beyond it, or None. Close to
    the float model is not enough: the journey's YOLOv8n A16W8 model passed the gate on QNN at
    cosine 0.996 while its box sizes on QNN were up to 125 px off the CPU EP's run of the same
    model (49 of the output's 8-bit steps), so quantize wrote it and load refused it (LOD006)."""
    from ortprep.runtime.tolerance import judge_each_sample

    proto = onnx.load(str(model), load_external_data=False)
    count = min(len(on_cpu), len(on_ep))
    # each decision pooled over the samples, as compile --eval pools it (one CTC position in one
    # sample of 24 is not a changed application)
    judged, _ = judge_each_sample(proto, ep, on_cpu[:count], [{k: np.asarray(v) for k, v in s.items()} for s in on_ep[:count]],
                                  metrics, provider_options)
    for sample in judged:
        for record in sample["outputs"]:
            if not record["within_tolerance"]:
                shape = np.shape(on_cpu[sample["sample"]].get(record["name"], ()))
                return {"sample": sample["sample"], **{key: record.get(key) for key in (
                    "name", "max_abs_diff", "cosine", "norm_ratio", "tolerance", "tolerance_rule")},
                    "hint": dfl_hint(record["name"], tuple(shape), metrics).lstrip("; ") or None}
    return None


def measure_on_target(evaluation: Evaluation, target: GateTarget, float_model: Path, quant_model: Path,
                      feeds: list[dict[str, np.ndarray]]) -> None:
    """Time the float and the quantized model on the target EP, where its time is the device's
    (``target.timed``: not the CPU EP, not a simulator), and set ``evaluation.ep_latency``. The
    CPU's time says nothing of a GPU's: measured on an H200, a GPT-2-like decoder's int4
    weight-only model ran at 0.84x float's time on the CPU EP and 1.32x on CUDA."""
    if not feeds or not target.timed:  # (the CPU EP as the target is never judged as an EP: not timed)
        return
    float_ms = target.latency(float_model, feeds[0], LATENCY_RUNS)
    quant_ms = target.latency(quant_model, feeds[0], LATENCY_RUNS)
    if float_ms and quant_ms:
        f, q = statistics.median(float_ms), statistics.median(quant_ms)
        evaluation.ep_latency = {"ep": target.ep, "float_ms": round(f, 4), "quant_ms": round(q, 4),
                                 "ratio": round(q / f, 3) if f > 0 else None}


def target_latency_ratio(verify: dict) -> float | None:
    """The latency ratio that counts: the target EP's where it was timed, else this CPU's."""
    timed = verify.get("ep_latency") or {}
    return timed.get("ratio") if timed else verify.get("latency_ratio")


def limited_finding(evaluation: Evaluation | None) -> Finding | None:
    """QNT021 where the target EP judged fewer samples than offered (--ep-seconds: one run takes
    long there, runtime/budget.py), on the held-back samples or on the calibration samples."""
    from ortprep.runtime.budget import limited_words

    if evaluation is None:
        return None
    sides = [("held-back", evaluation.on_ep)]
    if evaluation.confirmation is not None:
        sides.append(("calibration", evaluation.confirmation.on_ep))
    said = [f"{limited_words(side.limited)} of the {which} ones" for which, side in sides
            if side is not None and side.limited]
    if not said:
        return None
    ep = next(side.limited["ep"] for _, side in sides if side is not None and side.limited)
    return Finding.of("QNT021", f"the gate on {ep} judged {'; '.join(said)}; the CPU EP judged every sample",
                      ep=ep,
                      fix="--ep-seconds N lets the EP judge more samples; on the device itself one run takes milliseconds")


def latency_finding(evaluation: Evaluation | None) -> Finding | None:
    """QNT004 when the quantized model ran slower than the float one on the target EP where it was
    timed there, else on this CPU."""
    timed = evaluation.ep_latency if evaluation is not None else None
    if timed and timed.get("ratio") is not None:
        if timed["ratio"] <= 1.0:
            return None
        return Finding.of(
            "QNT004", f"the quantized model is slower than the float one on {timed['ep']} "
            f"({timed['quant_ms']:.3f} ms vs {timed['float_ms']:.3f} ms per run, {timed['ratio']:.2f}x)",
            fix="keep the float model for speed on this EP; the precision is a trade of size or accuracy, not time here")
    if evaluation is None or evaluation.latency_ratio is None or evaluation.latency_ratio <= 1.0:
        return None
    return Finding.of(
        "QNT004",
        f"the quantized model is slower than the float one on this CPU "
        f"({evaluation.quant_latency_ms:.3f} ms vs {evaluation.float_latency_ms:.3f} ms per run)",
        fix="expected without VNNI/AVX-512 int8 kernels, for tiny models, or with ConvInteger; measure on the target EP",
    )


def _decision_text(decision: dict) -> str:
    what = {"top1": "its top-1 class agrees with the float model's on", "argmax": "its argmax per position agrees on",
            "ctc": "its decoded strings (greedy CTC) equal the float model's on",
            "map": f"its map above {decision.get('threshold')} matches the float model's with F1",
            "detect": f"its detections (class scores above {decision.get('threshold')}) match the float model's with F1",
            "dfl": f"its box sides (decoded as DFL distances) stay within {decision.get('slack_bins')} bins of the float "
                   "model's on"
            }[decision["kind"]]
    share, expected, required = decision["agreement"], decision.get("expected_agreement"), decision.get("required")
    if share is None:
        return f"{what} n/a ({decision.get('error') or 'nothing to compare'})"
    text = f"{what} {share:.1%}" + (f" (the gate asks {required:.0%})" if required else "")
    whole, whole_expected = decision.get("sequence_agreement"), decision.get("expected_sequence_agreement")
    if decision["kind"] == "argmax" and share is not None and (required is None or share >= required) and (
            (whole is not None and whole < REQUIRED_SEQUENCES)
            or (whole_expected is not None and whole_expected < REQUIRED_SEQUENCES)):
        # each position nearly always agrees, whole sequences (the string the application reads) do not
        def share_text(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.1%}"

        return (text + f"; whole sequences agree on {share_text(whole)} of these samples and on about "
                f"{share_text(whole_expected)} to expect on unseen ones (the gate asks {REQUIRED_SEQUENCES:.0%}: a string "
                "is right only when every position is)")
    ranking = decision.get("ranking") or {}
    if decision["kind"] == "map" and required and ranking.get("passed") is False and (
            share is not None and share >= required and (expected is None or expected >= required)):
        # the thresholded scores agree, the row's best-scored class (what a ranking reads) does not
        best, best_expected = ranking.get("agreement"), ranking.get("expected_agreement")
        text += (f"; but each row's best-scored class (what an application that ranks the scores reads) agrees on "
                 f"{'n/a' if best is None else f'{best:.1%}'} of these samples and about "
                 f"{'n/a' if best_expected is None else f'{best_expected:.1%}'} to expect on unseen ones "
                 f"(the gate asks {ranking.get('required', 0.99):.0%}; --metric OUTPUT=map judges the threshold alone)")
        return text
    confidence = decision.get("confidence") or {}
    if decision["kind"] in ("ctc", "top1") and required and confidence.get("passed") is False and (
            share is not None and share >= required and (expected is None or expected >= required)):
        # the decision agrees, a score crosses a level an application may accept (or drop) it at
        what, why = ({"ctc": ("the lines' scores (the mean top probability over the characters read) stay",
                              "an application drops a line below a score of its own, rapidocr at 0.5"),
                      "top1": ("the top class's probability stays", "an application that accepts a class above a threshold "
                               "answers otherwise; --metric OUTPUT=top1 judges the class alone")})[decision["kind"]]
        return (text + f"; but {what} on the same side of {confidence['level']:g} on "
                f"{confidence['agreement']:.1%} of these samples and about {confidence['expected_agreement']:.1%} to "
                f"expect on unseen ones (the gate asks {confidence['required']:.0%}: {why})")
    boxes, needed = decision.get("box_agreement"), decision.get("required_regions")
    if decision["kind"] == "detect" and boxes is not None and needed is not None and boxes < needed and (
            required is None or share >= required):
        # the detections agree, their boxes moved
        return (text + f"; but of the {decision.get('detections_kept')} detections both keep, {boxes:.1%} keep their box "
                f"within {decision.get('box_slack'):g} px (the gate asks {needed:.0%})")
    scenes, scenes_expected = decision.get("scene_agreement"), decision.get("expected_scene_agreement")
    needed = decision.get("required_scenes")
    if decision["kind"] == "detect" and needed is not None and (required is None or share >= required):
        # the detections pooled agree, whole scenes (what the application returns per input) do not
        if scenes is not None and scenes < needed:
            kept = decision.get("detections_kept") or 0
            moved = kept - round((decision.get("box_agreement") or 0.0) * kept)
            return (text + f"; but only {scenes:.1%} of these samples keep every detection (the gate asks {needed:.0%}: "
                    f"a scene is right only when all its detections are; {decision.get('detections_lost')} lost, "
                    f"{decision.get('detections_added')} added, {moved} box(es) moved past {decision.get('box_slack'):g} px)")
        if scenes_expected is not None and scenes_expected < needed:
            return (text + f"; but only about {scenes_expected:.1%} of unseen scenes can be expected to keep every "
                    f"detection (the gate asks {needed:.0%}): the float model's scenes hold scores nearer "
                    f"{decision.get('threshold')} than the candidate moves them")
    regions, needed = decision.get("region_agreement"), decision.get("required_regions")
    if decision["kind"] == "map" and regions is not None and needed is not None and regions < needed and (
            required is None or (share is not None and share >= required)):
        # the pixels agree, the regions an application boxes do not
        counted = (f", {decision['regions_kept']} of the float map's {decision['regions']} boxes kept"
                   if decision.get("regions") is not None else "")
        return (text + f"; but its regions above {decision.get('region_level'):g} keep their bounding box on only "
                f"{regions:.1%}{counted} (the gate asks {needed:.0%}: a box one pixel off is another crop)")
    largest, limit = decision.get("largest_move_bins"), decision.get("limit_bins")
    if decision["kind"] == "dfl" and largest is not None and limit is not None and largest > limit:
        return text + f"; but a side moves {largest:.2f} bins, past the {limit:g} allowed (a whole bin is another box)"
    if required and share is not None and share >= required and expected is not None and expected < required:
        # the samples agreed, their margins say unseen ones will not
        text += (f" on these samples, but only about {expected:.1%} to expect on unseen ones: the float model's "
                 "decisions sit closer to their boundary than the quantization error moves them")
    return text


def _shortfall(judgement: Judgement, min_cosine: float) -> str:
    """What fails on one side, worst output first: its cosine, or its size (the norm ratio)."""
    failing = judgement.failing()
    apart = judgement.apart
    if not failing and apart:
        size = "" if apart["max_abs_diff"] is None else f"max abs diff {apart['max_abs_diff']:.4g}, "
        allowed = "" if apart["tolerance"] is None else f"allowed {apart['tolerance']:.4g}: "
        if (apart.get("tolerance") is not None and apart.get("max_abs_diff") is not None
                and apart["max_abs_diff"] <= apart["tolerance"] and apart.get("norm_ratio") is not None):
            # within the max abs diff: the norm is what fails, and the words say so
            size = f"norm ratio {apart['norm_ratio']:.4f}, outside the 1 ± {NORM_TOLERANCE:g} asked; max abs diff {apart['max_abs_diff']:.4g}, "
        return (f"output '{apart['name']}' computed otherwise than the CPU EP computes the same model, beyond what load "
                f"and compile allow (held-back sample {apart['sample']}: {size}{allowed}{apart['tolerance_rule']}) though "
                f"its cosine against the float model passes ({fmt_cosine(judgement.cosine)})"
                + (f"; {apart['hint']}" if apart.get("hint") else ""))
    if not failing:
        return f"lowest cosine {fmt_cosine(judgement.cosine)}"
    worst = min(failing, key=lambda o: (o["cosine"] if o["cosine"] is not None else -2.0))
    name, cosine, ratio = worst["name"], worst["cosine"], worst["norm_ratio"]
    decision = worst.get("decision") or {}
    if worst["judged_by"] != "cosine":
        text = f"output '{name}' off by {worst['max_abs_diff']:.4g} ({worst['judged_by']})"
    elif decision and decision.get("passed") is False and cosine is not None and (
            cosine >= min_cosine or decision.get("replaces_cosine")) and (ratio is None or abs(ratio - 1.0) <= NORM_TOLERANCE):
        text = (f"output '{name}' decides otherwise: {_decision_text(decision)} (cosine {fmt_cosine(cosine)} passes: "
                "the tensor is close, the application's answer is not)")
    elif cosine is not None and (cosine >= min_cosine or decision.get("replaces_cosine")) and ratio is not None:
        text = (f"output '{name}' scaled as a whole: norm ratio {ratio:.4f}, allowed 1 ± {NORM_TOLERANCE:g} "
                f"(cosine {fmt_cosine(cosine)}: the direction is right, the size is not)")
    else:
        asked = f"{min_cosine:g}" if 1.0 - min_cosine >= 1e-4 else fmt_cosine(min_cosine, min_cosine)
        text = (f"cosine {fmt_cosine(cosine, min_cosine)} on output '{name}' (the gate asks {asked}"
                + (f"; norm ratio {ratio:.4f})" if ratio is not None else ")"))
        if decision and decision.get("agreement") is not None and decision["agreement"] < 1.0:
            text += f"; {_decision_text(decision)}"
    if len(failing) > 1:
        text += f"; {len(failing) - 1} more output(s) fail"
    return text


def failing_words(evaluation: Evaluation, min_cosine: float) -> str | None:
    """What fails the gate, in a few words, the side first: the CPU EP's held-back samples, the
    target EP's, then the calibration samples (the confirmation); None where it passes."""
    if evaluation.passed:
        return None
    if evaluation.error is not None:
        return evaluation.error
    if not evaluation.cpu_verdict:
        cpu = Judgement("cpu", evaluation.cosine, evaluation.norm_ratio, evaluation.max_abs_diff, None, False,
                        evaluation.outputs)
        return f"on the CPU EP: {_shortfall(cpu, min_cosine)}"
    on_ep = evaluation.on_ep
    if on_ep is not None and not on_ep.passed:
        return f"on {on_ep.ep}: {on_ep.error or _shortfall(on_ep, min_cosine)}"
    confirmation = evaluation.confirmation
    side = confirmation.failing if confirmation is not None else None
    if side is not None:
        where = "the CPU EP" if side.ep == "cpu" else side.ep
        return (f"with the samples it was calibrated on, on {where}: "
                f"{side.error or _shortfall(side, min_cosine)}")
    return None


def gate_finding(evaluation: Evaluation, *, min_cosine: float, ep_text: str, stopped: str, worst: str,
                 writers: str, others: list[str] | None = None, searched: bool = False) -> Finding:
    """QNT005: what failed the gate, where (the CPU EP, the target EP, both) and what to do.
    ``ep_text`` names the EP and its device; ``worst`` the nodes where the CPU-side error starts;
    ``writers`` what writes the outputs the EP alone gets wrong; ``others`` the precisions --auto
    would try after this one, for this target and data (none: FP16 is named); ``searched``: the
    search already ran (--auto-exclude was given), so the fix does not ask for it again."""
    # what the fix offers for the search: to run it, or where it ran, more room for it
    search = ("more room for the search (--search-seconds, --max-float-share, --max-exclude-rounds; it ran)"
              if searched else "--auto-exclude")
    on_ep = evaluation.on_ep
    confirmation = evaluation.confirmation
    selection = evaluation.selection
    if (selection is not None and not selection["passed"] and evaluation.cpu_verdict and (on_ep is None or on_ep.passed)
            and (confirmation is None or confirmation.passed)):
        return Finding.of(
            "QNT005", f"accuracy gate failed by its margin: {selection_words(selection, ep_text)}{stopped}",
            ep=selection["side"] if selection["side"] != "cpu" else None,
            fix="more held-back samples (--eval DATA with more inputs, --samples N) judge a choice more surely; "
                f"ortprep quantize ... --auto (a wider precision) or {search}; verify.gate.selection in the JSON gives "
                "the figures")
    if (evaluation.error is None and confirmation is not None and confirmation.failing is not None
            and evaluation.cpu_verdict and (on_ep is None or on_ep.passed)):
        side = confirmation.failing
        where = "the CPU EP" if side.ep == "cpu" else ep_text
        what = side.error or _shortfall(side, min_cosine)
        judged = confirmation.held_back + (confirmation.samples if side.ep == "cpu"
                                           else min(confirmation.samples, CONFIRM_EP_SAMPLES))
        return Finding.of(
            "QNT005", f"accuracy gate failed with the samples it was calibrated on: its {confirmation.held_back} held-back "
            f"sample(s) pass, but on {where} the {judged} held-back and calibration samples together give {what}: the "
            f"held-back samples miss inputs that the calibration samples show{stopped}",
            ep=side.ep if side.ep != "cpu" else None,
            fix=f"ortprep quantize ... --auto (a wider precision) or {search} (it works on the sample that fails "
                "worst); verify.confirmation in the JSON gives the figures per output")
    if evaluation.error is not None:
        return Finding.of("QNT005", f"accuracy gate failed: {evaluation.error}{stopped}",
                          fix="check that the float and the quantized model run: ortprep load MODEL --ep cpu")
    if on_ep is not None and on_ep.error is not None:
        cpu = "passes on the CPU EP" if evaluation.cpu_verdict else "fails on the CPU EP too"
        return Finding.of(
            "QNT005", f"accuracy gate failed: the quantized model {cpu} (cosine {fmt_cosine(evaluation.cosine)}) but gives "
            f"no outputs on {ep_text}: {on_ep.error}{stopped}", ep=on_ep.ep,
            fix=f"ortprep check MODEL.int8.onnx --ep {on_ep.ep} --prove names what the EP refuses; another --device; "
                "--gate-on-cpu judges on the CPU EP only")
    if evaluation.ep_only:
        cpu = f"cosine {fmt_cosine(evaluation.cosine)}" + (f", norm ratio {evaluation.norm_ratio:.4f}"
                                                            if evaluation.norm_ratio is not None else "")
        return Finding.of(
            "QNT005", f"accuracy gate failed on {ep_text}: it passes on the CPU EP ({cpu}) but {on_ep.ep} gives "
            f"{_shortfall(on_ep, min_cosine)}: the EP's own error, not quantization's{stopped}"
            + (f"; {writers}" if writers else ""), ep=on_ep.ep,
            fix=f"ortprep quantize ... {search} (its trials are judged on {on_ep.ep} too), a different --device, or "
                f"keep the nodes that write that output in float (--exclude-node NAME); ortprep load MODEL.int8.onnx --ep "
                f"{on_ep.ep} --reference MODEL.onnx separates the EP's error from quantization's; --gate-on-cpu judges on "
                "the CPU EP only")
    below = [o for o in evaluation.outputs if not o.get("passed", True) and o["judged_by"] == "cosine"
             and not o.get("cosine_replaced_by") and (o["cosine"] is None or o["cosine"] < min_cosine)]
    if below or evaluation.cpu_verdict:
        what = f"lowest output cosine {fmt_cosine(evaluation.cosine)} is below {min_cosine}"
    else:  # scaled, or a flat output off by too much
        what = _shortfall(Judgement("cpu", evaluation.cosine, evaluation.norm_ratio, evaluation.max_abs_diff, None, False,
                                    evaluation.outputs), min_cosine)
    if on_ep is not None:
        what += (f"; on {on_ep.ep}: " + (_shortfall(on_ep, min_cosine) if not on_ep.passed
                                         else f"passes (cosine {fmt_cosine(on_ep.cosine)})"))
    return Finding.of("QNT005", f"accuracy gate failed: {what}{stopped}; worst nodes: {worst}"
                      + (f"; {writers}" if writers else ""),
                      fix=f"ortprep quantize ... {search}" + (", or --exclude-node NAME for the nodes above"
                                                               if worst != "none found" else "")
                          + (f"; --auto tries {', '.join(others)} and keeps the first that passes (where none does, it "
                             "measures FP16 by this gate)" if others
                             else "; no other precision here for --auto to try (--auto measures FP16 by this gate): "
                                  "ortprep convert MODEL --fp16 keeps float arithmetic (verified)"))
