"""``top1``: class scores, an output [N, C] (C >= 2), read by the argmax of each row; and what every
kind that reads class scores shares (argmax agreement, leads, log probabilities, a grid's floor).

Inferred for a 2-D output not made by a Sigmoid; gated where it holds probabilities, is made by a
Softmax, its rows' largest value stands out (CLASS_GAP) or its name says class scores (an embedding
is reported, not gated). Probability rows are also held by their top class's probability at each
level (``confident``). Measurements: docs/decisions/fidelity-decisions.md ("Classes")."""

from __future__ import annotations

from typing import Any

import numpy as np

from ortprep.fidelity.decisions.decision import Decision, Kind, Output, register
from ortprep.fidelity.decisions.evidence import by_evidence
from ortprep.fidelity.decisions.margins import as64, flip_rate, held_at_levels, pairs, thin

REQUIRED_TOP1 = 0.99
# A class score's lead over the runner-up, in the row's standard deviations, below which a raw
# output may be an embedding (the largest of 512 Gaussian values leads the second by about 0.3).
CLASS_GAP = 1.0
# Ops whose output is a feature vector, never class scores (a transformer's hidden states, whose
# few outlier dimensions lead every row by more than CLASS_GAP).
FEATURE_MAKERS = ("LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
                  "SkipSimplifiedLayerNormalization", "RMSNormalization", "GroupNormalization")
# Output names that say "class scores": read by their argmax, however close their classes are.
_CLASS_WORDS = ("logit", "class", "score", "prob", "label", "tag", "pred")
# Class probabilities are compared in log space, down to this many nats under each row's largest.
LOG_SPAN = 16.0
# ... and no lower than this many steps of a quantized output's grid (below it, a runner-up's move
# in log space is the grid's rounding, not the model's).
GRID_STEPS = 16


def named_as_classes(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _CLASS_WORDS)


def decided(rows: np.ndarray) -> np.ndarray:
    """The rows whose largest value is unique: where the float model's top two are exactly equal
    its argmax is the first index by convention, not a decision."""
    if rows.shape[-1] < 2:
        return np.ones(rows.shape[0], bool)
    ordered = np.sort(rows, axis=-1)
    return ordered[:, -1] > ordered[:, -2]


def decided_rows(compared: list[tuple[np.ndarray, np.ndarray]]):
    """Per pair of class-score outputs (float, candidate), their rows as [rows, classes] where the
    float model decides; pairs with fewer than two classes or no such row are left out."""
    for r, c in as64(compared):
        if r.ndim < 1 or r.shape[-1] < 2:
            continue
        rows, other = r.reshape(-1, r.shape[-1]), c.reshape(-1, c.shape[-1])
        chosen = decided(rows)
        if np.any(chosen):
            yield rows[chosen], other[chosen]


def raw_leads(rows: np.ndarray) -> np.ndarray:
    """Each row's largest value's lead over the runner-up, in the output's units."""
    ordered = np.sort(rows, axis=-1)
    return ordered[:, -1] - ordered[:, -2]


def leads(rows: np.ndarray) -> np.ndarray:
    """Each row's lead in the row's standard deviations (0 for a row of equal values)."""
    spread = np.std(rows, axis=-1)
    return raw_leads(rows) / np.where(spread > 0, spread, 1.0)


def class_gap(values: list[np.ndarray]) -> float:
    """The median over rows of (largest - second largest) / the row's standard deviation."""
    gaps = [lead for value in values for lead in leads(value.reshape(-1, value.shape[-1]).astype(np.float64))]
    return float(np.median(gaps)) if gaps else 0.0


def probability_rows(values) -> bool:
    """True when every row of every value is a probability distribution (in [0, 1], summing to 1);
    values with no row of two or more classes are passed over, and at least one must remain."""
    seen = False
    for value in values:
        if np.ndim(value) < 1 or np.shape(value)[-1] < 2 or not np.size(value):
            continue
        v = np.asarray(value, np.float64)
        if not (float(np.min(v)) >= 0.0 and float(np.max(v)) <= 1.0
                and bool(np.all(np.abs(np.sum(v, axis=-1) - 1.0) < 1e-3))):
            return False
        seen = True
    return seen


def grid_floor(values: list[np.ndarray]) -> float:
    """GRID_STEPS times the step of the grid ``values`` lie on (a quantized output's), so that what
    the grid's rounding moves is not read as the model's change; 0 where they lie on no grid."""
    if not values:
        return 0.0
    # thinned in the values' own type, then read in float64
    joined = np.concatenate([np.ravel(np.asarray(v)) for v in values])
    if not np.issubdtype(joined.dtype, np.floating):
        joined = joined.astype(np.float64)
    pooled = np.unique(thin(joined).astype(np.float64))
    if len(pooled) < 3:
        return 0.0
    # the grid is read at the bottom of the range (a runner-up near 0): its hundredth, tenth, or all of it
    for share in (0.01, 0.1, 1.0):
        bottom = pooled[pooled <= pooled[0] + share * (pooled[-1] - pooled[0])]
        if len(bottom) >= 3:
            break
    pooled = bottom
    if len(pooled) < 3:
        return 0.0
    gaps = np.diff(pooled)[:1000]
    noise = 1e-6 * max(1e-3, float(np.max(np.abs(pooled))))  # a remainder below this is float32's rounding
    step = float(gaps[0])
    for gap in gaps[1:]:  # Euclid's algorithm on the gaps, to within the rounding
        a, b = max(step, float(gap)), min(step, float(gap))
        while b > noise:
            a, b = b, a % b
            if a - b < noise:  # a remainder of almost a whole step is rounding too
                b = 0.0
        step = a
        if step <= noise:
            return 0.0
    units = (pooled - pooled[0]) / step
    if float(np.max(np.abs(units - np.round(units)))) > 0.05:
        return 0.0
    return GRID_STEPS * step


def log_scores(rows: np.ndarray, step: float, other: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Probability rows (and a candidate's) as log probabilities, floored per row at the
    reference's largest value times e^-LOG_SPAN or at ``step``, whichever is larger: a model's
    error on a ratio of probabilities is of about the same size in log space on every row."""
    floor = np.maximum(np.max(rows, axis=-1, keepdims=True) * np.exp(-LOG_SPAN), step)
    floor = np.where(floor > 0, floor, np.finfo(np.float64).tiny)
    scaled = np.log(np.maximum(rows, floor))
    return scaled, (np.log(np.maximum(other, floor)) if other is not None else None)


def class_agreement(reference: list[np.ndarray], candidate: list) -> float | None:
    """The share of decided rows (or positions) whose argmax agrees, pooled over the samples."""
    same, total = class_counts(reference, candidate)
    return same / total if total else None


def class_counts(reference: list[np.ndarray], candidate: list) -> tuple[int, int]:
    """(the decided rows or positions whose argmax agrees, the decided rows), over the samples."""
    compared = pairs(reference, candidate)
    same = total = 0
    for r, c in as64(compared):
        if r.ndim < 1 or r.shape[-1] < 2:
            continue
        rows, other = r.reshape(-1, r.shape[-1]), c.reshape(-1, c.shape[-1])
        chosen = decided(rows)
        a, b = np.argmax(rows[chosen], axis=-1), np.argmax(other[chosen], axis=-1)
        same += int(np.sum(a == b))
        total += a.size
    return same, total


def expected_class_agreement(reference: list[np.ndarray], candidate: list, more: list[np.ndarray]) -> float | None:
    """The argmax agreement to expect on unseen inputs: margins are the float model's leads over
    the runner-up (in log probabilities where the rows are probabilities), errors how far the
    candidate shrank them. ``more``: other samples' float outputs (usable ones)."""
    compared = pairs(reference, candidate)
    if not compared:
        return None
    margins, errors = [], []
    in_log = probability_rows(r for r, _ in compared)
    step = grid_floor([c for _, c in compared]) if in_log else 0.0
    for rows, other in decided_rows(compared):
        if in_log:
            rows, other = log_scores(rows, step, other)
        lead = np.argmax(rows, axis=-1)
        index = np.arange(rows.shape[0])

        def lead_over_rest(values: np.ndarray) -> np.ndarray:
            rest = values.copy()
            rest[index, lead] = -np.inf
            return values[index, lead] - np.max(rest, axis=-1)

        # in the output's own units, the same for every row (not in standard deviations: a row of
        # two classes leads by 2 of them however near the tie)
        float_lead = lead_over_rest(rows)
        margins.append(float_lead)
        errors.append(float_lead - lead_over_rest(other))
    if not margins:
        return None
    for m in more:  # one at a time, in float64
        if m.ndim < 1 or m.shape[-1] < 2:
            continue
        rows = np.asarray(m, np.float64).reshape(-1, m.shape[-1])
        if in_log:
            if not probability_rows([rows]):
                continue
            rows = log_scores(rows, step)[0]
        lead = raw_leads(rows)
        margins.append(lead[lead > 0])
    return 1.0 - flip_rate(np.concatenate(margins), np.concatenate(errors))


def top_probabilities(compared: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The float model's top class's probability in each decided row, and the candidate's
    probability of that same class."""
    tops, theirs = [], []
    for rows, other in decided_rows(compared):
        lead = np.argmax(rows, axis=-1)
        index = np.arange(rows.shape[0])
        tops.append(rows[index, lead])
        theirs.append(other[index, lead])
    if not tops:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(tops), np.concatenate(theirs)


def confidence_agreement(reference: list[np.ndarray], candidate: list,
                         more: list[np.ndarray] | None = None, evidence: bool = False,
                         levels: tuple[float, ...] | None = None) -> dict[str, Any] | None:
    """The top class's probability held at each of MAP_LEVELS (an application may accept a class
    only above a threshold of its own; ``levels``: the one the user named), judged in probabilities
    as a map's elements are; the worst level, by the evidence rule where ``evidence``; None when
    no row decides."""
    ours, theirs = top_probabilities(pairs(reference, candidate))
    if ours.size == 0:
        return None
    pooled = [ours]
    for m in more or []:
        m = np.asarray(m, np.float64)
        if m.ndim >= 1 and m.shape[-1] >= 2 and probability_rows([m]):
            pooled.append(top_probabilities([(m, m)])[0])
    return held_at_levels(ours, theirs, np.concatenate(pooled), REQUIRED_TOP1, evidence, levels)


def class_gated(output: Output) -> tuple[bool, bool]:
    """(gated, probabilities) for class scores: gated where they are a distribution, named as
    classes or their rows' lead stands out."""
    probabilities = probability_rows(output.values)
    distribution = output.maker in ("Softmax", "LogSoftmax") or probabilities
    gated = distribution or named_as_classes(output.name) or class_gap(output.values) >= CLASS_GAP
    return gated, probabilities


def form_of(output: Output) -> str:
    """An output's form in words, for the assumption a decision inferred from it states."""
    made = f" made by {output.maker}" if output.maker else ""
    values = ", probability rows" if probability_rows(output.values) else ""
    return f"a {list(output.shape)} output{made}{values}"


class Top1(Kind):
    name = "top1"
    forms = ("top1", "top1:THRESHOLD")
    required = REQUIRED_TOP1
    takes_value = True

    def parse(self, value, text):
        if not value:
            return Decision("top1", None, "--metric")
        try:
            threshold = float(value)
        except ValueError:
            raise ValueError(f"{text!r}: the number after 'top1:' is the top class's probability an application "
                             "accepts it at (between 0 and 1)") from None
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"{text!r}: a top1 threshold lies between 0 and 1")
        return Decision("top1", threshold, "--metric", confident=True, threshold_given=True)

    def label(self, decision):
        return "top1" if decision.threshold is None else f"top1:{decision.threshold:g}"

    def infer(self, output: Output) -> Decision | None:
        shape = output.shape
        if len(shape) == 2 and shape[-1] >= 2 and output.maker != "Sigmoid":
            gated, probabilities = class_gated(output)
            return Decision("top1", gated=gated, confident=probabilities, because=form_of(output))
        return None

    def agreement(self, decision, reference, candidate):
        return class_agreement(reference, candidate)

    def units(self, decision, reference, candidate):
        return class_counts(reference, candidate)[1] or None

    def expected(self, decision, reference, candidate, more=None):
        return expected_class_agreement(reference, candidate, self.usable(reference, more))

    def also(self, decision, record, reference, candidate, more, passed):
        if decision.confident:
            named = (decision.threshold,) if decision.threshold_given and decision.threshold is not None else None
            confidence = confidence_agreement(reference, candidate, more, by_evidence(decision), named)
            if confidence is not None:
                record["confidence"] = confidence
                passed = passed and confidence["passed"]
        return passed


TOP1 = register(Top1())
