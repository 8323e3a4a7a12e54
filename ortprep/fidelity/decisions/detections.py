"""``detect[:T]``: a YOLO-style detector's output ([1, 4 + C, N] or [1, N, 4 + C]: a box's centre and
size in pixels, then a score per class), judged as its application reads it: the detections after
non-maximum suppression (score >= T, IoU DETECT_NMS_IOU), matched by class and overlap (F1), the
matched boxes within DETECT_BOX_SLACK pixels, and whole scenes (every detection of an input kept),
seen and expected. Never inferred: ``--metric OUTPUT=detect``. Measurements:
docs/decisions/fidelity-decisions.md ("Detections")."""

from __future__ import annotations

from typing import Any

import numpy as np

from ortprep.fidelity.decisions.classes import REQUIRED_TOP1
from ortprep.fidelity.decisions.decision import Decision, register
from ortprep.fidelity.decisions.maps import MAP, REQUIRED_REGIONS, Map, parse_threshold
from ortprep.fidelity.decisions.margins import flip_rate

# Default T and the IoU: NudeNet 3.4.2's NMS.
DETECT_THRESHOLD = 0.25
DETECT_NMS_IOU = 0.45
DETECT_MATCH_IOU = 0.5
DETECT_BOX_SLACK = 2.0
# A scene is right only when every one of its detections is: held as a label is.
REQUIRED_SCENES = REQUIRED_TOP1
# Below this many float scenes the scenes' estimate is not made (one scene's margin says little).
DETECT_MIN_SCENES = 8
# The scores judged for the scenes' errors: within this many logits of T's, at least the nearest few.
DETECT_LOGIT_BAND = 1.5
DETECT_NEAREST = 16
_LOGIT_CLIP = 1e-4
# a score the candidate makes NaN or infinite: moved farther than any margin (the clipped logits span +-9.2)
_UNREAD_MOVE = 40.0


def detector_rows(value: np.ndarray) -> np.ndarray | None:
    """A YOLO-style detector output as [4 + C, N] (rows: box centre x, y, width, height, then a
    score per class; the axis of fewer entries is the rows'); None for another layout."""
    array = np.asarray(value, np.float64)
    if array.ndim < 2 or int(np.prod(array.shape[:-2])) != 1:
        return None
    rows = array.reshape(array.shape[-2:])
    if rows.shape[0] > rows.shape[1]:
        rows = rows.T
    return rows if rows.shape[0] >= 5 else None


def iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one (cx, cy, w, h) box with each of ``others`` ([K, 4])."""
    def corners(b):
        return (
            b[..., 0] - b[..., 2] / 2,
            b[..., 1] - b[..., 3] / 2,
            b[..., 0] + b[..., 2] / 2,
            b[..., 1] + b[..., 3] / 2,
        )

    ax1, ay1, ax2, ay2 = corners(box)
    bx1, by1, bx2, by2 = corners(others)
    inter = np.clip(np.minimum(ax2, bx2) - np.maximum(ax1, bx1), 0, None) * np.clip(
        np.minimum(ay2, by2) - np.maximum(ay1, by1), 0, None)
    union = np.abs(box[2] * box[3]) + np.abs(others[:, 2] * others[:, 3]) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def nms(rows: np.ndarray, threshold: float) -> list[int]:
    """The anchors a detector's application keeps from [4 + C, N] rows: those whose best class
    score reaches ``threshold``, highest first, each kept unless it overlaps a kept one by more than
    DETECT_NMS_IOU (class-agnostic, as NudeNet's cv2.dnn.NMSBoxes)."""
    best = rows[4:].max(axis=0)
    order = [int(i) for i in np.argsort(-best) if best[i] >= threshold]
    kept: list[int] = []
    for index in order:
        if not kept or np.all(iou(rows[:4, index], rows[:4, kept].T) <= DETECT_NMS_IOU):
            kept.append(index)
    return kept


def detections(rows: np.ndarray, threshold: float) -> list[tuple[int, np.ndarray]]:
    """(class, box) of a detector's [4 + C, N] rows after non-maximum suppression."""
    return [(int(rows[4:, i].argmax()), rows[:4, i]) for i in nms(rows, threshold)]


def logits(scores: np.ndarray) -> np.ndarray:
    clipped = np.clip(np.asarray(scores, np.float64), _LOGIT_CLIP, 1.0 - _LOGIT_CLIP)
    return np.log(clipped / (1.0 - clipped))


def scene_margin(rows: np.ndarray, threshold: float, level: float) -> float | None:
    """How near a float scene is to changing: its anchors' best class scores' nearest distance to
    ``threshold``, as logits, leaving out the anchors a kept detection suppresses."""
    if rows.shape[0] <= 4 or rows.shape[1] == 0:  # no class scores, or no anchors
        return None
    best = rows[4:].max(axis=0)
    counted = np.ones(best.size, bool)
    for index in nms(rows, threshold):
        counted &= ~((iou(rows[:4, index], rows[:4].T) > DETECT_NMS_IOU) & (best < best[index]))
    return float(np.min(np.abs(logits(best[counted]) - level)))


def expected_scene_agreement(threshold: float, reference: list[np.ndarray], candidate: list,
                             more: list[np.ndarray]) -> float | None:
    """The share of unseen scenes whose detections a candidate keeps, each scene one decision: the
    margins are each float scene's (scene_margin, over ``reference`` and ``more``), the errors the
    candidate's moves (either way) of the anchors' best class scores near ``threshold``, as logits,
    pooled over the samples. None where nothing was compared or fewer than DETECT_MIN_SCENES."""
    level = float(logits(np.array([threshold]))[0])
    margins = [m for m in (scene_margin(rows, threshold, level) for rows in [*reference, *more]) if m is not None]
    if len(margins) < DETECT_MIN_SCENES:
        return None
    distances: list[np.ndarray] = []
    errors: list[np.ndarray] = []
    for rows, other in zip(reference, candidate):
        if other is None or other.shape != rows.shape or rows.shape[0] <= 4 or rows.shape[1] == 0:
            continue
        ours, theirs = logits(rows[4:].max(axis=0)), other[4:].max(axis=0)
        distances.append(np.abs(ours - level))
        errors.append(np.where(np.isfinite(theirs), np.abs(logits(theirs) - ours), _UNREAD_MOVE))
    if not errors:
        return None
    # the scores near T; the nearest DETECT_NEAREST where fewer lie in the band
    distance, error = np.concatenate(distances), np.concatenate(errors)
    near = np.flatnonzero(distance <= DETECT_LOGIT_BAND)
    if near.size < DETECT_NEAREST:
        near = np.argsort(distance, kind="stable")[:DETECT_NEAREST]
    return 1.0 - flip_rate(np.array(margins), error[near])


def _matched(ref_rows: list, cand_rows: list, threshold: float) -> dict[str, int]:
    """Detections matched by class and IoU >= DETECT_MATCH_IOU over the samples compared."""
    counts = dict(matched=0, missed=0, added=0, held=0, compared=0, scenes_kept=0)
    for r, c in zip(ref_rows, cand_rows):
        if c is None or c.shape != r.shape:
            continue
        counts["compared"] += 1
        want, got = detections(r, threshold), detections(c, threshold)
        free = list(range(len(got)))
        changed = False
        for cls, box in want:
            same = [j for j in free if got[j][0] == cls]
            overlaps = iou(box, np.array([got[j][1] for j in same])) if same else np.array([])
            if same and overlaps.max() >= DETECT_MATCH_IOU:
                j = same[int(overlaps.argmax())]
                free.remove(j)
                counts["matched"] += 1
                kept = bool(np.max(np.abs(box - got[j][1])) <= DETECT_BOX_SLACK)
                counts["held"] += int(kept)
                changed = changed or not kept
            else:
                counts["missed"] += 1
                changed = True
        counts["added"] += len(free)
        counts["scenes_kept"] += int(not changed and not free)
    return counts


class Detect(Map):
    name = "detect"
    forms = ("detect", "detect:THRESHOLD")
    required = 0.98
    margins_any_shape = False

    def parse(self, value, text):
        threshold = parse_threshold("detect", value, text, DETECT_THRESHOLD)
        if not 10 * _LOGIT_CLIP <= threshold <= 1.0 - 10 * _LOGIT_CLIP:
            # the scenes' margins are read as logits of clipped scores: nearer 0 or 1, a score and T would tie
            raise ValueError(f"{text!r}: a detect threshold lies between {10 * _LOGIT_CLIP:g} and "
                             f"{1 - 10 * _LOGIT_CLIP:g}")
        return Decision("detect", threshold, "--metric", threshold_given=bool(value))

    def infer(self, output):
        return None

    def judge(self, decision, reference, candidate, more=None) -> dict[str, Any]:
        """The class scores judged as ``map:T`` (F1 and what to expect), then the detections after
        NMS, their boxes, and whole scenes, seen and expected (REQUIRED_SCENES)."""
        threshold = decision.threshold if decision.threshold is not None else DETECT_THRESHOLD
        ref_rows = [detector_rows(r) for r in reference]
        cand_rows = [detector_rows(c) if c is not None else None for c in candidate]
        if not ref_rows or any(r is None for r in ref_rows):
            return {**decision.record(), "agreement": None, "expected_agreement": None,
                    "passed": False if decision.gated else None,
                    "error": "not a detector output ([1, 4 + C, N] or [1, N, 4 + C])"}
        scores = Decision("map", threshold, decision.chosen_by, decision.gated, threshold_given=True)
        more_rows = [detector_rows(m) for m in more or []]
        record = MAP.judge(scores, [r[4:].ravel() for r in ref_rows],
                           [c[4:].ravel() if c is not None and c.shape == r.shape else None
                            for r, c in zip(ref_rows, cand_rows)],
                           [m[4:].ravel() for m in more_rows if m is not None])
        record.update(decision.record())
        n = _matched(ref_rows, cand_rows, threshold)
        matched, missed, added, compared = n["matched"], n["missed"], n["added"], n["compared"]
        agreed = ((1.0 if matched + missed + added == 0 else 2 * matched / (2 * matched + missed + added))
                  if compared else None)
        boxes = n["held"] / matched if matched else None
        scenes = n["scenes_kept"] / compared if compared else None
        scenes_expected = expected_scene_agreement(threshold, ref_rows, cand_rows,
                                                   [m for m in more_rows if m is not None])
        record.update(agreement=agreed, detections_kept=matched, detections_lost=missed, detections_added=added,
                      box_agreement=boxes, box_slack=DETECT_BOX_SLACK, required_regions=REQUIRED_REGIONS,
                      scene_agreement=scenes, expected_scene_agreement=scenes_expected,
                      required_scenes=REQUIRED_SCENES)
        expected = record.get("expected_agreement")
        passed = (agreed is not None and agreed >= self.required and (expected is None or expected >= self.required)
                  and (boxes is None or boxes >= REQUIRED_REGIONS)
                  and all(value is None or value >= REQUIRED_SCENES for value in (scenes, scenes_expected)))
        record["passed"] = passed if decision.gated else None
        return record


DETECT = register(Detect())
