"""The transform gate: a result (convert, simplify, optimize, an opset upgrade) against its source,
both run on the same inputs, must compute the same outputs: each output's cosine (or, where the
reference is flat, its absolute error) and each gated decision. Runs are read duck-typed (an
``outcome`` has ``ok``, ``stage``, ``status``, ``message``, ``outputs``, ``samples``, ``bounds`` and
``decisions``), so this module runs nothing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ortprep.fidelity.compare import OutputDiff, compare_outputs, degenerate
from ortprep.fidelity.decisions import infer_decisions, judge_decision, named
from ortprep.fidelity.graph import output_bounds
from ortprep.fidelity.words import describe_decision


@dataclass(frozen=True)
class Gate:
    """When a result counts as the same computation."""

    min_cosine: float
    max_abs: float | None = None  # relative to the reference's largest magnitude (at least 1)
    # for degenerate reference outputs (constant, near zero): the largest absolute error, relative
    # to the output's declared range or its own scale
    degenerate_tol: float = 1e-2

    def passes(self, diff: OutputDiff, reference: np.ndarray | None = None, cosine_replaced: bool = False) -> bool:
        """``cosine_replaced``: the output's gated decision judges it in place of the cosine floor
        (a ``ctc`` decision); the elementwise bound still holds where set."""
        if not diff.shape_match or diff.nonfinite or diff.cosine is None:
            return False
        if diff.cosine < self.min_cosine and not cosine_replaced:
            return False
        if self.max_abs is not None and diff.max_abs_diff is not None:
            scale = 1.0
            if reference is not None and reference.size and reference.dtype.kind == "f":
                finite = np.abs(reference[np.isfinite(reference)])
                scale = max(1.0, float(finite.max()) if finite.size else 1.0)
            return diff.max_abs_diff <= self.max_abs * scale
        return True


EXACT_GATE = Gate(min_cosine=0.99999, max_abs=1e-4, degenerate_tol=1e-4)


@dataclass
class VerifyResult:
    loads: bool
    passed: bool
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    cosine: float | None = None  # the lowest over the outputs
    outputs: list[OutputDiff] = field(default_factory=list)
    status: str = "ok"  # the candidate run's status: ok, failed, crashed, timeout
    error: str | None = None
    degenerate: list[tuple[str, str]] = field(default_factory=list)  # (output, why cosine means nothing)
    # per output with a gated decision: judge_decision's record, with its name
    decisions: list[dict] = field(default_factory=list)

    @property
    def decision_failed(self) -> list[dict]:
        """The decisions the candidate did not keep."""
        return [d for d in self.decisions if d.get("passed") is False]

    def failure_words(self) -> str:
        """Why it did not pass, for a finding: the run's error, the decisions it changed, or the
        outputs that differ."""
        if not self.loads or self.error:
            return f"the result does not load or run ({self.error})"
        changed = [describe_decision(d) for d in self.decision_failed]
        if changed:
            return "the application's decision changes: " + "; ".join(changed) + (
                f" (lowest cosine {self.cosine})" if self.cosine is not None else "")
        return f"outputs differ (lowest cosine {self.cosine}, max abs diff {self.max_abs_diff})"

    def to_record(self) -> dict:
        return {
            "loads": self.loads,
            "max_abs_diff": self.max_abs_diff,
            "max_rel_diff": self.max_rel_diff,
            "cosine": self.cosine,
            "passed": self.passed,
            "outputs": [o.to_record() for o in self.outputs],
            "error": self.error,
            "decisions": self.decisions,
        }


def expect(outcome, proto, metrics: dict[str, str] | None = None, seeded: bool = False):
    """Set on a reference run what its candidates are held to besides cosine: the range the graph
    bounds each output to, and the decision an application reads from each (``metrics``: --metric
    overrides). ``seeded``: the run's inputs were made up, not the user's: an inferred decision is
    then reported, not gated (near ties in noise say nothing of the application's inputs).
    Returns ``outcome``."""
    outcome.bounds = output_bounds(proto)
    names = {value.name for value in proto.graph.output}
    samples = [{k: v for k, v in sample.items() if k in names} for sample in (outcome.samples or [outcome.outputs])]
    decisions = infer_decisions(proto, [s for s in samples if s], metrics)
    if seeded:
        decisions = {name: dataclasses.replace(d, gated=False) if d.chosen_by == "inferred" else d
                     for name, d in decisions.items()}
    outcome.decisions = decisions
    return outcome


def judge_run(reference, candidate, gate: Gate) -> VerifyResult:
    """``candidate``'s run against ``reference``'s (set up by :func:`expect`), by ``gate``. A
    reference that did not run passes nothing: with no outputs to compare, every check would hold."""
    if not reference.ok:
        return VerifyResult(loads=candidate.ok, passed=False, status=reference.status,
                            error=f"the original model does not run, so nothing was compared: {reference.message}")
    if not candidate.ok:
        return VerifyResult(
            loads=candidate.stage == "run", passed=False, status=candidate.status, error=candidate.message
        )
    diffs = compare_outputs(reference.outputs, candidate.outputs)
    flat: list[tuple[str, str]] = []
    verdicts = []
    for diff in diffs:
        ref = reference.outputs.get(diff.name)
        flatness = degenerate(ref, reference.bounds.get(diff.name)) if ref is not None else None
        if flatness is None:
            decision = reference.decisions.get(diff.name)
            verdicts.append(gate.passes(diff, ref, cosine_replaced=decision is not None and decision.replaces_cosine))
            continue
        limit = gate.degenerate_tol * flatness.scale
        diff.judged_by = f"absolute error <= {limit:.3g} (output {flatness.what})"
        flat.append((diff.name, flatness.what))
        verdicts.append(diff.shape_match and not diff.nonfinite and diff.max_abs_diff is not None
                        and diff.max_abs_diff <= limit)
    decisions = judge_decisions(reference, candidate)
    verdicts.extend(record["passed"] is not False for record in decisions)
    cosines = [d.cosine for d in diffs if d.cosine is not None and d.judged_by == "cosine"]
    abs_diffs = [d.max_abs_diff for d in diffs if d.max_abs_diff is not None]
    rel_diffs = [d.max_rel_diff for d in diffs if d.max_rel_diff is not None]
    return VerifyResult(
        loads=True,
        passed=all(verdicts),
        max_abs_diff=max(abs_diffs) if abs_diffs else None,
        max_rel_diff=max(rel_diffs) if rel_diffs else None,
        cosine=min(cosines) if cosines else None,
        outputs=diffs,
        degenerate=flat,
        decisions=decisions,
    )


def judge_decisions(reference, candidate) -> list[dict]:
    """Each decision of ``reference`` (set by :func:`expect`) held to the candidate's outputs over
    every sample both ran: a transform that keeps cosine but flips a class, a CTC character or a
    detector's thresholded map does not pass (an ungated one is reported: passed None)."""
    judged = []
    wanted = reference.samples or [reference.outputs]
    got = candidate.samples or [candidate.outputs]
    for name, decision in reference.decisions.items():
        pairs = [(r[name], c.get(name)) for r, c in zip(wanted, got) if name in r]
        if not pairs:
            continue
        record = judge_decision(decision, [r for r, _ in pairs], [c for _, c in pairs])
        judged.append(named({"name": name, **record}, name))
    return judged
