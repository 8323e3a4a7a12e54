"""``map[:T]``: a probability map made by a Sigmoid (or, with one channel, a Softmax), values in
[0, 1]: the elements above T (0.5 by default) compared by F1; a map with two spatial axes also by
its connected regions' bounding boxes at each of MAP_LEVELS (or at T alone when given), since an
application that boxes a map crops by those boxes; a [N, C] map from a Sigmoid is also *ranked*:
each row's best class held as ``top1``. Measurements: docs/decisions/fidelity-decisions.md ("Maps")."""

from __future__ import annotations

from typing import Any

import numpy as np

from ortprep.fidelity.decisions.classes import TOP1
from ortprep.fidelity.decisions.decision import Decision, Kind, Output, register
from ortprep.fidelity.decisions.margins import MAP_LEVELS, as64, flip_rate, pairs

MAP_THRESHOLD = 0.5
# The share of a map's regions whose bounding box stays the same (a box one pixel off is another crop).
REQUIRED_REGIONS = 0.95
# A [N, C] Sigmoid map of at least this many classes is ranked as well as thresholded.
RANKED_MIN_CLASSES = 2
# At most this many 2-D planes (over the samples and the leading axes) are labelled per level.
_REGION_PLANES = 64


def regions(mask: np.ndarray) -> np.ndarray:
    """The 8-connected regions of a 2-D boolean mask, as bounding boxes [K, 4] (first row, first
    column, last row, last column), in no particular order. Labelled by runs: each row's runs of
    True, joined to the runs they touch in the next row (union-find by repeated hooking)."""
    mask = np.asarray(mask, bool)
    height, width = mask.shape
    padded = np.zeros((height, width + 2), np.int8)
    padded[:, 1:-1] = mask
    step = np.diff(padded, axis=1)
    rows, starts = np.nonzero(step == 1)
    _, ends = np.nonzero(step == -1)  # one past each run's last column; row-major, so paired with starts
    runs = rows.size
    if runs == 0:
        return np.zeros((0, 4), np.int64)
    stride = width + 2
    start_keys, end_keys = rows * stride + starts, rows * stride + ends
    # the runs of the next row that touch run i (8-connected): they end at or after its start and
    # start at or before its end
    first = np.searchsorted(end_keys, (rows + 1) * stride + starts, side="left")
    last = np.searchsorted(start_keys, (rows + 1) * stride + ends, side="right")
    counts = np.maximum(last - first, 0)
    left = np.repeat(np.arange(runs), counts)
    right = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(first, counts)
    labels = np.arange(runs)
    while left.size:
        before = labels.copy()
        low = np.minimum(labels[left], labels[right])
        np.minimum.at(labels, labels[left], low)
        np.minimum.at(labels, labels[right], low)
        while True:  # every run points at its root
            jumped = labels[labels]
            if np.array_equal(jumped, labels):
                break
            labels = jumped
        if np.array_equal(labels, before):
            break
    _, region = np.unique(labels, return_inverse=True)
    count = int(region.max()) + 1
    boxes = np.empty((count, 4), np.int64)
    boxes[:, :2] = np.iinfo(np.int64).max
    boxes[:, 2:] = -1
    np.minimum.at(boxes[:, 0], region, rows)
    np.minimum.at(boxes[:, 1], region, starts)
    np.maximum.at(boxes[:, 2], region, rows)
    np.maximum.at(boxes[:, 3], region, ends - 1)
    return boxes


def spatial(value: np.ndarray) -> bool:
    """A map laid out as images: [N, C, H, W] (or more leading axes) with H, W >= 2."""
    return value.ndim >= 4 and value.shape[-1] >= 2 and value.shape[-2] >= 2


def region_agreement(decision: Decision, reference: list[np.ndarray], candidate: list) -> dict[str, Any] | None:
    """How far the candidate keeps the map's regions: per level (``map:T``: T alone; else each of
    MAP_LEVELS), the connected regions above it in each 2-D plane of every sample, matched by their
    bounding boxes exactly: 2 * same / (the float map's regions + the candidate's). The worst level
    counts. None where the map has no two spatial axes or nothing can be compared."""
    planes = [(r.reshape(-1, *r.shape[-2:]), c.reshape(-1, *c.shape[-2:]))
              for r, c in ((np.asarray(r), np.asarray(c)) for r, c in zip(reference, candidate) if c is not None)
              if r.shape == c.shape and spatial(r)]
    compared = [(r[k], c[k]) for r, c in planes for k in range(r.shape[0])]
    if not compared:
        return None
    if len(compared) > _REGION_PLANES:
        compared = compared[:: int(np.ceil(len(compared) / _REGION_PLANES))]
    levels = (decision.threshold,) if decision.threshold_given and decision.threshold is not None else MAP_LEVELS
    shares: dict[float, float] = {}
    counts: dict[float, int] = {}
    boxes: dict[float, tuple[int, int]] = {}  # (kept, the float map's) per level
    for level in levels:
        same = total = floats = 0
        for r, c in compared:
            boxes_r = [tuple(box) for box in regions(r > level)]
            boxes_c = [tuple(box) for box in regions(c > level)]
            kept = set(boxes_r) & set(boxes_c)
            # a box held by several regions (rare: nested ones) counts as often as both maps hold it
            same += sum(min(boxes_r.count(box), boxes_c.count(box)) for box in kept) if kept else 0
            total += len(boxes_r) + len(boxes_c)
            floats += len(boxes_r)
        shares[level] = 2 * same / total if total else 1.0
        counts[level] = total
        boxes[level] = (same, floats)
    worst = min(levels, key=lambda level: (shares[level], -counts[level]))
    return {"region_agreement": shares[worst], "region_level": worst,
            "region_levels": {f"{level:g}": round(share, 6) for level, share in shares.items()},
            "required_regions": REQUIRED_REGIONS, "regions_kept": boxes[worst][0], "regions": boxes[worst][1]}


def map_agreement(decision: Decision, reference: list[np.ndarray], candidate: list) -> float | None:
    """F1 of the elements above the threshold, pooled over the samples (1.0 when neither has any)."""
    compared = pairs(reference, candidate)
    if not compared:
        return None
    threshold = decision.threshold if decision.threshold is not None else MAP_THRESHOLD
    tp = fp = fn = 0
    for r, c in as64(compared):
        a, b = r > threshold, c > threshold
        tp += int(np.sum(a & b))
        fp += int(np.sum(~a & b))
        fn += int(np.sum(a & ~b))
    if tp + fp + fn == 0:
        return 1.0  # nothing above the threshold in either: the same (empty) decision
    return 2 * tp / (2 * tp + fp + fn)


def expected_map_agreement(decision: Decision, reference: list[np.ndarray], candidate: list,
                           more: list[np.ndarray]) -> float | None:
    """The F1 to expect on unseen inputs: each element's distance from the threshold is a margin
    (pooled with ``more``'s), the candidate's move toward it the error, elements above and below
    counted apart."""
    compared = pairs(reference, candidate)
    if not compared:
        return None
    threshold = decision.threshold if decision.threshold is not None else MAP_THRESHOLD
    reference_values = np.concatenate([np.asarray(r, np.float64).ravel() for r, _ in compared])
    candidate_values = np.concatenate([np.asarray(c, np.float64).ravel() for _, c in compared])
    above = reference_values > threshold
    pooled = (np.concatenate([reference_values] + [np.asarray(m, np.float64).ravel() for m in more]) if more
              else reference_values)
    pooled_above = pooled > threshold
    positives, negatives = int(np.sum(pooled_above)), int(np.sum(~pooled_above))
    if positives == 0:
        return 1.0
    moved = candidate_values - reference_values
    missed = positives * flip_rate(pooled[pooled_above] - threshold, -moved[above])
    added = negatives * flip_rate(threshold - pooled[~pooled_above], moved[~above]) if negatives else 0.0
    kept = positives - missed
    return float(2 * kept / (2 * kept + missed + added))


def parse_threshold(kind: str, value: str, text: str, default: float) -> float:
    """The threshold after ``KIND:`` (``default`` where none), between 0 and 1 (ValueError else)."""
    try:
        threshold = float(value) if value else default
    except ValueError:
        raise ValueError(f"{text!r}: the threshold after '{kind}:' is a number between 0 and 1") from None
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"{text!r}: a {kind} threshold lies between 0 and 1")
    return threshold


class Map(Kind):
    """Also the base of the kinds whose agreement is read as a map's (detect, dfl)."""

    name = "map"
    forms = ("map", "map:THRESHOLD")
    required = 0.98
    margins_any_shape = True
    takes_value = True

    def parse(self, value, text):
        return Decision(
            "map", parse_threshold("map", value, text, MAP_THRESHOLD), "--metric", threshold_given=bool(value)
        )

    def infer(self, output: Output) -> Decision | None:
        shape, maker = output.shape, output.maker
        if output.probability and (maker == "Sigmoid" or (maker == "Softmax" and len(shape) >= 3 and shape[1] == 1)):
            return Decision("map", MAP_THRESHOLD,
                            ranked=maker == "Sigmoid" and len(shape) == 2 and shape[-1] >= RANKED_MIN_CLASSES)
        return None

    def label(self, decision):
        return f"{decision.kind}:{decision.threshold:g}"

    def agreement(self, decision, reference, candidate):
        return map_agreement(decision, reference, candidate)

    def expected(self, decision, reference, candidate, more=None):
        return expected_map_agreement(decision, reference, candidate, self.usable(reference, more))

    def also(self, decision, record, reference, candidate, more, passed):
        kept = region_agreement(decision, reference, candidate)
        if kept is not None:
            record.update(kept)
            passed = passed and kept["region_agreement"] >= REQUIRED_REGIONS
        if decision.ranked:  # the rows' best-scored class, held as a top-1 decision is
            best = TOP1.judge(Decision("top1", chosen_by=decision.chosen_by), reference, candidate, more)
            # no row with a unique best score (every row a tie): nothing ranked to keep
            ranking_passed = best["agreement"] is None or bool(best["passed"])
            record["ranking"] = {"agreement": best["agreement"], "expected_agreement": best["expected_agreement"],
                                 "required": best["required"], "passed": ranking_passed}
            passed = passed and ranking_passed
        return passed


MAP = register(Map())
