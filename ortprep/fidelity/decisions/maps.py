"""``map[:T[:exact]]``: a probability map made by a Sigmoid (or, with one channel, a Softmax), values
in [0, 1]: the elements above T (0.5 by default) compared by F1; a map with two spatial axes also by
its connected regions' bounding boxes at each of MAP_LEVELS (or at T alone when given), since an
application that boxes a map crops by those boxes: a region is kept where a candidate's region
covers its box at IoU >= REGION_IOU (``:exact``: where its box stays identical); a [N, C] map from a
Sigmoid is also *ranked*: each row's best class held as ``top1``. Measurements:
docs/decisions/fidelity-decisions.md ("Maps"), docs/decisions/gate-evidence.md (the IoU)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ortprep.fidelity.decisions.classes import TOP1, form_of
from ortprep.fidelity.decisions.decision import Decision, Kind, Output, register
from ortprep.fidelity.decisions.evidence import by_evidence, hold, upper_bound
from ortprep.fidelity.decisions.margins import MAP_LEVELS, as64, flip_rate, pairs

MAP_THRESHOLD = 0.5
# The share of a map's regions kept (matched by REGION_IOU, or with an identical box under ``:exact``).
REQUIRED_REGIONS = 0.95
# A region is kept where the candidate's region over its box reaches this IoU: a line split in two or
# merged with its neighbour is lost, a box a pixel off (the detector's post-processing unclips it by
# half its size again) is kept; the detection field's own match (AP50; detections.DETECT_MATCH_IOU).
REGION_IOU = 0.5
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


def box_iou(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """IoU of each of ``ours`` with each of ``theirs`` (pixel boxes [K, 4], last row and column
    inclusive), as [K, M]."""
    top = np.maximum(ours[:, None, 0], theirs[None, :, 0])
    left = np.maximum(ours[:, None, 1], theirs[None, :, 1])
    bottom = np.minimum(ours[:, None, 2], theirs[None, :, 2])
    right = np.minimum(ours[:, None, 3], theirs[None, :, 3])
    inter = np.clip(bottom - top + 1, 0, None) * np.clip(right - left + 1, 0, None)

    def area(boxes):
        return (boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1)

    union = area(ours)[:, None] + area(theirs)[None, :] - inter
    return inter / np.maximum(union, 1)


def matched_regions(ours: np.ndarray, theirs: np.ndarray, exact: bool) -> int:
    """How many of ``ours`` boxes a box of ``theirs`` keeps, one to one: identical (``exact``), or
    at IoU >= REGION_IOU, the best overlaps matched first."""
    if not len(ours) or not len(theirs):
        return 0
    if exact:
        boxes_r, boxes_c = [tuple(b) for b in ours], [tuple(b) for b in theirs]
        # a box held by several regions (rare: nested ones) counts as often as both maps hold it
        return sum(min(boxes_r.count(box), boxes_c.count(box)) for box in set(boxes_r) & set(boxes_c))
    same = 0
    for start in range(0, len(ours), 512):  # in blocks: a noisy map at a low level has thousands of regions
        block = box_iou(ours[start:start + 512], theirs)
        rows, cols = np.nonzero(block >= REGION_IOU)
        if not rows.size:
            continue
        order = np.argsort(-block[rows, cols], kind="stable")
        used_r, used_c = set(), set()
        for i in order:
            r, c = int(rows[i]) + start, int(cols[i])
            if r not in used_r and c not in used_c:
                used_r.add(r)
                used_c.add(c)
        same += len(used_r)
        theirs = np.delete(theirs, sorted(used_c), axis=0)  # each of theirs keeps one of ours
        if not len(theirs):
            break
    return same


def spatial(value: np.ndarray) -> bool:
    """A map laid out as images: [N, C, H, W] (or more leading axes) with H, W >= 2."""
    return value.ndim >= 4 and value.shape[-1] >= 2 and value.shape[-2] >= 2


def region_agreement(decision: Decision, reference: list[np.ndarray], candidate: list,
                     evidence: bool = False) -> dict[str, Any] | None:
    """How far the candidate keeps the map's regions: per level (``map:T``: T alone; else each of
    MAP_LEVELS), the connected regions above it in each 2-D plane of every sample, matched by their
    bounding boxes at IoU >= REGION_IOU (``map:T:exact``: exactly): 2 * kept / (the float map's
    regions + the candidate's). The worst level counts (by the evidence rule's upper bound where
    the decision is assumed). None where the map has no two spatial axes or nothing can be
    compared."""
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
            boxes_r, boxes_c = regions(r > level), regions(c > level)
            same += matched_regions(boxes_r, boxes_c, decision.exact_boxes)
            total += len(boxes_r) + len(boxes_c)
            floats += len(boxes_r)
        shares[level] = 2 * same / total if total else 1.0
        counts[level] = total
        boxes[level] = (same, floats)

    def seen(level: float) -> float:  # what the rule reads of a level: its share, or its upper bound
        return upper_bound(shares[level], counts[level] / 2) if evidence and counts[level] else shares[level]

    worst = min(levels, key=lambda level: (seen(level), -counts[level]))
    return {"region_agreement": shares[worst], "region_level": worst,
            "region_levels": {f"{level:g}": round(share, 6) for level, share in shares.items()},
            "required_regions": REQUIRED_REGIONS, "regions_kept": boxes[worst][0], "regions": boxes[worst][1],
            "region_match": "identical boxes" if decision.exact_boxes else f"IoU >= {REGION_IOU:g}",
            "region_units": counts[worst] / 2}


def map_agreement(decision: Decision, reference: list[np.ndarray], candidate: list) -> float | None:
    """F1 of the elements above the threshold, pooled over the samples (1.0 when neither has any)."""
    counted = map_counts(decision, reference, candidate)
    if counted is None:
        return None
    tp, fp, fn = counted
    if tp + fp + fn == 0:
        return 1.0  # nothing above the threshold in either: the same (empty) decision
    return 2 * tp / (2 * tp + fp + fn)


def map_units(decision: Decision, reference: list[np.ndarray], candidate: list) -> float | None:
    """F1's units: tp + (fp + fn) / 2, of which F1 is the share tp (None: nothing above the threshold)."""
    counted = map_counts(decision, reference, candidate)
    if counted is None or sum(counted) == 0:
        return None
    tp, fp, fn = counted
    return tp + (fp + fn) / 2


def map_counts(decision: Decision, reference: list[np.ndarray], candidate: list) -> tuple[int, int, int] | None:
    """(true positives, false positives, false negatives) of the elements above the threshold."""
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
    return tp, fp, fn


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
        value, _, exact = value.partition(":")
        if exact and exact != "exact" or value == "exact" and not exact:
            raise ValueError(f"{text!r}: write map:T:exact for identical region boxes at the threshold T")
        return Decision("map", parse_threshold("map", value, text, MAP_THRESHOLD), "--metric",
                        threshold_given=bool(value), exact_boxes=bool(exact))

    def infer(self, output: Output) -> Decision | None:
        shape, maker = output.shape, output.maker
        if output.probability and (maker == "Sigmoid" or (maker == "Softmax" and len(shape) >= 3 and shape[1] == 1)):
            return Decision("map", MAP_THRESHOLD, because=form_of(output),
                            ranked=maker == "Sigmoid" and len(shape) == 2 and shape[-1] >= RANKED_MIN_CLASSES)
        return None

    def label(self, decision):
        return f"{decision.kind}:{decision.threshold:g}" + (":exact" if decision.exact_boxes else "")

    def agreement(self, decision, reference, candidate):
        return map_agreement(decision, reference, candidate)

    def units(self, decision, reference, candidate):
        return map_units(decision, reference, candidate)

    def expected(self, decision, reference, candidate, more=None):
        return expected_map_agreement(decision, reference, candidate, self.usable(reference, more))

    def also(self, decision, record, reference, candidate, more, passed):
        evidence = by_evidence(decision)
        kept = region_agreement(decision, reference, candidate, evidence)
        if kept is not None:
            units = kept.pop("region_units")
            record.update(kept)
            passed = passed and hold(record, "region_agreement", kept["region_agreement"], units, None,
                                     REQUIRED_REGIONS, evidence)
        if decision.ranked:  # the rows' best-scored class, held as a top-1 decision is
            best = TOP1.judge(Decision("top1", chosen_by=decision.chosen_by), reference, candidate, more)
            # no row with a unique best score (every row a tie): nothing ranked to keep
            ranking_passed = best["agreement"] is None or bool(best["passed"])
            record["ranking"] = {"agreement": best["agreement"], "expected_agreement": best["expected_agreement"],
                                 "required": best["required"], "passed": ranking_passed}
            passed = passed and ranking_passed
        return passed


MAP = register(Map())
