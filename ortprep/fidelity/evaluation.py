"""The record of quantize's gate: each side judged (a Judgement: the CPU EP's, the target EP's), the
evaluation over them (held-back samples, latency, the confirmation on the calibration samples) and
the margin asked of a result chosen among trials. Figures and verdicts only: quantize runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from ortprep.fidelity.decisions import decision_shortfall, margin_shortfall, share_gaps, with_margin
from ortprep.fidelity.tolerances import NORM_TOLERANCE


def outputs_shortfall(outputs: list[dict]) -> float:
    """The worst of the outputs' decision shortfalls (decisions.decision_shortfall); 0.0 for none."""
    return max([0.0, *(decision_shortfall(o.get("decision")) for o in outputs)])


def outputs_margin_gap(outputs: list[dict]) -> float:
    """The worst of the outputs' gaps to the decision margin (decisions.margin_shortfall); 0.0 for none."""
    return max([0.0, *(margin_shortfall(o.get("decision")) for o in outputs)])


CONFIRM_EP_SAMPLES = 24  # calibration samples the target EP runs for the confirmation, at most


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
    limited: dict | None = (
        None  # the EP's side: the samples it judged within --ep-seconds, of those offered (budget.py)
    )
    # the EP's side: where its first samples decided the verdict ({"verdict", "samples", "offered"},
    # steps/quantize/ep_early.py): its figures are those samples'
    early: dict | None = None

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
        return {
            "ep": self.ep,
            "cosine": self.cosine,
            "norm_ratio": self.norm_ratio,
            "passed": self.passed,
            "outputs": [
                {"name": o["name"], "cosine": o["cosine"], "norm_ratio": o["norm_ratio"]} for o in self.outputs[:16]
            ],
            "error": self.error,
            "apart": self.apart,
        }

    def to_record(self) -> dict:
        return {
            "ep": self.ep,
            "cosine": self.cosine,
            "norm_ratio": self.norm_ratio,
            "max_abs_diff": self.max_abs_diff,
            "top1_agreement": self.top1_agreement,
            "passed": self.passed,
            "spread": self.spread,
            "outputs": self.outputs,
            "error": self.error,
            "placement": self.placement,
            "apart": self.apart,
            "limited": self.limited,
            "early": self.early,
        }


@dataclass
class Confirmation:
    """The gate held over every real sample: the held-back ones and those the model was calibrated
    on, judged together as the held-back ones are alone (each sample's cosine, the norm, each
    decision's share over all of them). Passing with the calibration samples is the weaker test
    (the ranges were set on them), so it is a second condition, never the verdict alone; failing
    with them is strong evidence (docs/decisions/fidelity-quantize-gate.md)."""

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
        return {
            "samples": self.samples,
            "held_back": self.held_back,
            "passed": self.passed,
            "cpu": self.cpu.to_record(),
            "ep": self.on_ep.to_record() if self.on_ep is not None else None,
        }


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
    ep_latency: dict | None = (
        None  # {"ep", "float_ms", "quant_ms", "ratio"}: timed on the target EP (measure_on_target)
    )
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
            ep = {
                **self.on_ep.to_record(),
                **{key: context.get(key) for key in ("device", "provider_options", "runtime", "package")},
            }
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


def hold_to_margin(evaluation: Evaluation, trials: int) -> dict | None:
    """A result kept after another trial failed the gate on the same held-back samples was chosen
    by them: among several, the one they favour (the winner's curse), and its figures flatter it.
    Such a result holds each decision's shares half-way from the gate to 1 (decisions.with_margin),
    as the search's cosine aims half-way (trials.margin_aim); short of that it fails, and
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

