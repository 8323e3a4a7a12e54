"""A trial of quantize's search (one quantize-and-evaluate run) and how two trials compare.

:class:`Trial` is what a run kept float (or off the EP, or at 16 bits) and how it did;
:func:`improved` is the one order the search, the remedies and the moves accept trials by;
:func:`reaches_margin` is what a chosen result must reach. Measurements behind the thresholds:
docs/decisions/reduce-quantize-search.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ortprep.fidelity.words import fmt_cosine

IMPROVES = 1e-4  # a rule (or a calibration method) must raise the lowest cosine by at least this much to stay
NORM_IMPROVES = 5e-3  # or bring the norm ratio this much closer to 1 (a scaled output: cosine cannot show it)
# or bring the decisions this much closer to the gate (share points of agreement, measured or
# expected: decision_shortfall), where the gate fails on a decision and the cosine is already near 1
DECISION_IMPROVES = 2e-3


# a trial's error where the nodes it kept float leave nothing quantized (Trials.attempt)
PREPROCESS_MARGIN = 1e-3  # cosine by which quantizing without pre-processing must win to be chosen (outcome)

FLOAT_MODEL = "nothing is quantized with these nodes kept float: this is the float model"


def margin_aim(min_cosine: float) -> float:
    """The lowest cosine the search aims for: half-way from the gate to 1."""
    return min_cosine + (1 - min_cosine) / 2


@dataclass
class Trial:
    """One quantize-and-evaluate run: the nodes it kept float and how it did (``path``: its model)."""

    label: str
    kept: list[str]
    cosine: float | None  # the lowest cosine judged (the worse of the CPU EP's and the target EP's)
    passed: bool
    size: int
    path: Path | None = None
    error: str | None = None
    norm_ratio: float | None = None  # of both sides' norm ratios, the one farthest from 1
    sides: dict | None = None  # {"judged_on", "cpu": summary, "ep": summary or None} (Judgement.summary)
    # how far its held-back decisions fall short of the gate (Evaluation.shortfall); 0: none does
    shortfall: float | None = None
    # nodes kept off the target EP (off_ep.keep_off_ep): the CPU EP runs them
    off: list[str] = field(default_factory=list)
    # activations given 16 bits (the search's 16-bit rung; weights as asked)
    wide: list[str] = field(default_factory=list)
    # how far its decisions fall short of the decision margin (Evaluation.margin_gap); 0: they hold it
    margin_gap: float | None = None

    def to_record(self, size_before: int) -> dict:
        sides = self.sides or {}
        return {"label": self.label, "kept_in_float": len(self.kept), "kept_off_ep": len(self.off),
                "activations_16bit": len(self.wide),
                "cosine": self.cosine, "passed": self.passed,
                "size_ratio": round(self.size / size_before, 4) if size_before and self.size else None,
                "error": self.error, "norm_ratio": self.norm_ratio, "decision_shortfall": None
                if self.shortfall is None else round(self.shortfall, 6),
                "decision_margin_gap": None if self.margin_gap is None else round(self.margin_gap, 6),
                "judged_on": sides.get("judged_on"),
                "cpu": sides.get("cpu"), "ep": sides.get("ep")}


def reaches_margin(trial: Trial, aim: float | None) -> bool:
    """Whether ``trial`` passes the gate with the margin a chosen result must have: its lowest
    cosine at ``aim`` (margin_aim; None: no cosine aim) and its decisions' shares half-way from the
    gate to 1 (decisions.with_margin; evaluate.hold_to_margin refuses a chosen result short of it)."""
    return (trial.passed and (aim is None or trial.cosine is None or trial.cosine >= aim)
            and not (trial.margin_gap or 0.0) > 0.0)


def ep_only(trial: Trial) -> bool:
    """Whether ``trial`` passes on the CPU EP and fails on the target EP only: the EP's own error,
    which the CPU side's ranking does not see and which the float model need not escape either."""
    sides = trial.sides or {}
    return bool((sides.get("cpu") or {}).get("passed")) and (sides.get("ep") or {}).get("passed") is False


def norm_error(trial: Trial) -> float:
    return abs(trial.norm_ratio - 1.0) if trial.norm_ratio is not None else 0.0


def cpu_side(trial: Trial) -> Trial:
    """``trial`` as the CPU EP alone judged it (its cosine and norm ratio on that side)."""
    cpu = (trial.sides or {}).get("cpu") or {}
    return Trial(trial.label, trial.kept, cpu.get("cosine"), trial.passed, trial.size, trial.path, trial.error,
                 norm_ratio=cpu.get("norm_ratio"), sides=trial.sides, off=trial.off, margin_gap=cpu.get("margin_gap"))


def improved(new: Trial, old: Trial) -> bool:
    """Whether ``new`` measured better than ``old``: it passes where ``old`` fails, or its lowest
    cosine rose by IMPROVES, or (its cosine no worse) its norm ratio came NORM_IMPROVES closer to 1
    or its decisions DECISION_IMPROVES closer to the gate (a classifier whose cosine is 0.9999 and
    whose expected agreement is short of 99%: the cosine cannot show the progress). The cosine
    still comes first: on a few held-back samples one flipped class moves the shortfall too
    coarsely to veto a trial whose cosine rose (docs/decisions/reduce-quantize-search.md).
    Where one of them was not run on the target EP (a trial the CPU EP already failed), both are
    compared on the CPU EP's figures: a cosine over both sides against one over the CPU alone
    would count the EP's error as progress."""
    if (new.path is None and new.cosine is None) or new.error == FLOAT_MODEL:
        return False
    if new.passed and not old.passed:
        return True
    if (new.passed and old.passed and new.margin_gap is not None and old.margin_gap is not None
            and new.margin_gap <= 0.0 < old.margin_gap):
        # it reaches the decision margin where the other does not, however near that one came
        # (docs/decisions/reduce-quantize-search.md: the margin over DECISION_IMPROVES)
        return True
    one_sided = [trial.sides is not None and trial.sides.get("ep") is None for trial in (new, old)]
    mixed = new.sides is not None and old.sides is not None and one_sided[0] != one_sided[1]
    if mixed:
        new, old = cpu_side(new), cpu_side(old)
    if new.cosine is None:
        return False
    # (the shortfall spans the sides judged on the held-back samples: it compares only trials
    # judged on the same sides)
    shortfalls = not mixed and new.shortfall is not None and old.shortfall is not None
    if old.cosine is None or new.cosine > old.cosine + IMPROVES:
        return True
    if new.cosine < old.cosine - IMPROVES:
        return False
    decided = shortfalls and new.shortfall < old.shortfall - DECISION_IMPROVES
    if shortfalls and not decided and new.passed and old.passed and new.margin_gap is not None \
            and old.margin_gap is not None:
        # both pass the gate: the decisions' progress is toward the margin (reaches_margin)
        decided = new.margin_gap < old.margin_gap - DECISION_IMPROVES
    return decided or norm_error(new) < norm_error(old) - NORM_IMPROVES


def change(before: Trial, after: Trial) -> str:
    """'cosine a -> b' (and the norm ratio where one was measured), for reasons and messages."""
    text = f"cosine {fmt_cosine(before.cosine)} -> {fmt_cosine(after.cosine)}"
    if before.norm_ratio is not None and after.norm_ratio is not None:
        text += f", norm ratio {before.norm_ratio:.3f} -> {after.norm_ratio:.3f}"
    if before.shortfall and after.shortfall is not None and after.shortfall != before.shortfall:
        text += f", decisions short of the gate by {before.shortfall:.1%} -> {after.shortfall:.1%}"
    return text


@dataclass
class SearchResult:
    """What a search ended with, and how it got there (for the report)."""

    best: Trial
    trials: list[Trial] = field(default_factory=list)
    rules: list[dict] = field(default_factory=list)  # {"rule", "nodes", "cosine_before", "cosine_after", "kept"}
    ranked: list[dict] = field(default_factory=list)  # {"tensor", "nodes", "noise"} in rank order
    stopped: str = ""
    reasons: dict[str, str] = field(default_factory=dict)  # kept node -> why
