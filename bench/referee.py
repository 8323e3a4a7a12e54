"""The bench's own judge: how the bench compares outputs, reads an application's decision from them,
matches boxes, and decides a verdict.

Deliberately independent of ortprep's judging (``ortprep.fidelity`` and what it replaces): it
imports numpy only and nothing of ortprep, so a bug in ortprep's judge shows in the bench instead of
being repeated by it. Every bench script judges through this module and nowhere else.

Rules held here (the figures' reasons are in bench/RESULTS.md and the tables it links):
- a "wrong output": lowest cosine below COSINE_GATE, a norm ratio beyond 1 +- NORM_GATE, or NaN/Inf;
- decisions: top-1 class, argmax per position, greedy CTC (blank 0), speech at 0.5, NudeNet's
  detections (NMS; boxes within BOX_SLACK px);
- an agreement is judged by its 95% Wilson interval against the application's bar (BARS).
"""

from __future__ import annotations

import math

import numpy as np

COSINE_GATE, NORM_GATE = 0.99, 0.02  # a "pass of a wrong output": cosine below, or norm ratio beyond 1 +- this
# the application's bar per decision kind: bench/suite/apps (labels 99%, strings 95%, VAD frames 98%)
BARS = {"top1": 0.99, "ctc": 0.95, "argmax_seq": 0.95, "speech": 0.98, "detect": 0.99}


# ---------------------------------------------------------------- tensors

def cosine(a, b) -> float:
    """Cosine of two arrays, flattened in float64 (0.0 where either is all zeros)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    norm = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / norm) if norm else 0.0


def compare(reference: dict[int, list[np.ndarray]], candidate: dict[int, list[np.ndarray]]) -> dict | None:
    """Per output: the lowest cosine over the samples and the norm ratio (candidate / reference)
    farthest from 1, as `load` judges one run. An output of one value per sample (a probability, a
    score), or one flat on every sample, is judged over the samples stacked: a single value has
    no direction, and its ratio alone is a relative error, not a scale."""
    samples = sorted(set(reference) & set(candidate))
    if not samples:
        return None
    per_output = []
    for position in range(len(reference[samples[0]])):
        pairs = [(np.asarray(reference[s][position], np.float64).ravel(),
                  np.asarray(candidate[s][position], np.float64).ravel()) for s in samples]
        if any(a.shape != b.shape for a, b in pairs):
            per_output.append({"output": position, "cosine": 0.0, "norm_ratio": None, "nonfinite": False,
                               "judged": "shape differs"})
            continue
        nonfinite = any(not np.all(np.isfinite(b)) for _, b in pairs)
        spread = [a.size > 1 and np.ptp(a) > 1e-6 * max(float(np.abs(a).max()), 1e-12) for a, _ in pairs]
        if not any(spread):
            pairs = [(np.concatenate([a for a, _ in pairs]), np.concatenate([b for _, b in pairs]))]
            judged = "samples stacked"
        else:
            pairs, judged = [pair for pair, varied in zip(pairs, spread) if varied], "per sample"
        cosines, ratios = [], []
        for a, b in pairs:
            if not np.all(np.isfinite(b)):
                continue
            norm_a, norm_b = np.linalg.norm(a), np.linalg.norm(b)
            if norm_a > 1e-12:
                ratios.append(norm_b / norm_a)
                cosines.append(float(a @ b / (norm_a * norm_b)) if norm_b else 0.0)
        per_output.append({"output": position, "cosine": min(cosines) if cosines else None,
                           "norm_ratio": max(ratios, key=lambda r: abs(r - 1)) if ratios else None,
                           "nonfinite": nonfinite, "judged": judged})
    cosines = [o["cosine"] for o in per_output if o["cosine"] is not None]
    ratios = [o["norm_ratio"] for o in per_output if o["norm_ratio"] is not None]
    return {"samples": len(samples), "outputs": per_output, "cosine": min(cosines) if cosines else None,
            "norm_ratio": max(ratios, key=lambda r: abs(r - 1)) if ratios else None,
            "nonfinite": any(o["nonfinite"] for o in per_output)}


def lowest_cosine_skipping_flat(reference: list, candidate: list) -> tuple[float, list[int]]:
    """One sample's outputs: the lowest cosine (0.0 for NaN/Inf), skipping outputs that are flat
    or near zero in the reference (no direction to compare); returns it with the skipped positions."""
    worst, flat = 1.0, []
    for index, (a, b) in enumerate(zip(reference, candidate)):
        a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
        if a.size == 0:
            continue
        if np.ptp(a) < 1e-6 * max(np.abs(a).max(), 1e-12) or np.abs(a).max() < 1e-6:
            flat.append(index)
            continue
        if not np.all(np.isfinite(b)):
            worst = min(worst, 0.0)
            continue
        worst = min(worst, cosine(a, b))
    return worst, flat


def pooled_norm_ratio(reference: dict, outputs: dict, position: int) -> float | None:
    """The norm of one output over every sample, candidate over reference."""
    float_norm = np.sqrt(sum(np.sum(np.asarray(reference[i][position], np.float64) ** 2) for i in reference))
    quant_norm = np.sqrt(sum(np.sum(np.asarray(outputs[i][position], np.float64) ** 2) for i in reference))
    return float(quant_norm / float_norm) if float_norm > 0 else None


def pooled_first_output(reference: list[list[np.ndarray]], candidate: list[list[np.ndarray]],
                        decision: str | None) -> dict:
    """The first output over every sample stacked: cosine, norm ratio, and for argmax decisions the
    number of samples whose argmax agrees."""
    ref = np.concatenate([np.asarray(r[0], np.float64).ravel() for r in reference])
    cand = np.concatenate([np.asarray(c[0], np.float64).ravel() for c in candidate])
    value = float(ref @ cand / (np.linalg.norm(ref) * np.linalg.norm(cand) or 1.0))
    record = {"cosine": value, "norm_ratio": float(np.linalg.norm(cand) / (np.linalg.norm(ref) or 1.0))}
    if decision in ("top1", "argmax_seq", "ctc"):
        same = sum(bool(np.array_equal(np.argmax(r[0], axis=-1), np.argmax(c[0], axis=-1)))
                   for r, c in zip(reference, candidate))
        record["decision"] = f"{same}/{len(reference)}"
    return record


# ---------------------------------------------------------------- detections (NudeNet's YOLOv8n)

CANDIDATE, NMS_SCORE, NMS_IOU = 0.2, 0.25, 0.45  # nudenet 3.4.2, nudenet.py
BOX_SLACK = 2  # pixels per coordinate for two detections to be the same


def overlap_xywh(a, b) -> float:
    """IoU of two (x, y, width, height) boxes."""
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[0] + a[2], b[0] + b[2]), min(a[1] + a[3], b[1] + b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    union = max(0.0, a[2]) * max(0.0, a[3]) + max(0.0, b[2]) * max(0.0, b[3]) - inter
    return inter / union if union > 0 else 0.0


def iou_xyxy(a, b) -> float:
    """IoU of two (x0, y0, x1, y1) boxes."""
    x1, y1, x2, y2 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def iou_corners(a, b) -> float:
    """IoU of the bounding rectangles of two polygons given by their corner points (rapidocr's boxes)."""
    def rect(box) -> tuple[float, float, float, float]:
        points = np.asarray(box, np.float64)
        return points[:, 0].min(), points[:, 1].min(), points[:, 0].max(), points[:, 1].max()

    (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = rect(a), rect(b)
    w, h = max(0.0, min(ax1, bx1) - max(ax0, bx0)), max(0.0, min(ay1, by1) - max(ay0, by0))
    union = (ax1 - ax0) * (ay1 - ay0) + (bx1 - bx0) * (by1 - by0) - w * h
    return w * h / union if union > 0 else 0.0


def detections(output: np.ndarray) -> list[tuple[int, tuple[int, ...], float]]:
    """NudeNet 3.4.2's post-processing, as its nudenet.py does it, without cv2: a candidate where a
    class score reaches CANDIDATE, boxes from centre to corner, NMS at NMS_SCORE / NMS_IOU (boxes
    kept in descending score order unless they overlap a kept one by more than the bound)."""
    rows = np.transpose(np.squeeze(output))
    boxes, scores, classes = [], [], []
    for row in rows:
        best = float(row[4:].max())
        if best >= CANDIDATE:
            x, y, w, h = (float(v) for v in row[:4])
            boxes.append((x - w / 2, y - h / 2, w, h))
            scores.append(best)
            classes.append(int(row[4:].argmax()))
    kept: list[int] = []
    for index in sorted(range(len(scores)), key=lambda i: -scores[i]):
        if scores[index] >= NMS_SCORE and all(overlap_xywh(boxes[index], boxes[k]) <= NMS_IOU for k in kept):
            kept.append(index)
    return sorted((classes[i], tuple(int(v) for v in boxes[i]), round(scores[i], 3)) for i in kept)


def same_detections(a, b) -> bool:
    """The same classes, in order, with boxes within BOX_SLACK px per coordinate."""
    return len(a) == len(b) and all(ca == cb and max(abs(p - q) for p, q in zip(ba, bb)) <= BOX_SLACK
                                    for (ca, ba, _), (cb, bb, _) in zip(a, b))


def match_by_class(reference: list, candidate: list) -> dict:
    """Each reference (class, xyxy box) matched to the candidate's best unused box of its class."""
    used, ious, moves = set(), [], []
    for cls, box in reference:
        best, index = 0.0, None
        for j, (other_cls, other) in enumerate(candidate):
            if j not in used and other_cls == cls and iou_xyxy(box, other) > best:
                best, index = iou_xyxy(box, other), j
        if index is not None:
            used.add(index)
            moves.append(max(abs(x - y) for x, y in zip(box, candidate[index][1])))
        ious.append(best)
    return {"boxes": len(reference), "kept_iou_0.5": sum(v >= 0.5 for v in ious),
            "kept_iou_0.9": sum(v >= 0.9 for v in ious), "lowest_iou": min(ious) if ious else None,
            "largest_move_px": max(moves) if moves else None, "added": len(candidate) - len(used)}


def corner_distance(a, b) -> int:
    """The worst corner of two boxes: the largest x or y difference over their corners, in order."""
    return int(np.abs(np.asarray(a) - np.asarray(b)).max())


def match_by_corners(want: list, got: list, slack: int) -> dict:
    """Boxes paired greedily by their worst corner; a pair farther than ``slack`` px has moved."""
    pairs = sorted((corner_distance(a, b), i, j) for i, a in enumerate(want) for j, b in enumerate(got))
    used_want, used_got, distances = set(), set(), []
    for distance, i, j in pairs:
        if i not in used_want and j not in used_got:
            used_want.add(i)
            used_got.add(j)
            distances.append(distance)
    moved = sum(d > slack for d in distances)
    lost, added = len(want) - len(distances), len(got) - len(distances)
    return {"same": not (lost or added or moved), "float_boxes": len(want), "deployed_boxes": len(got),
            "lost": lost, "added": added, "moved": moved, "worst_corner_px": max(distances, default=None)}


def dfl_distances(value: np.ndarray) -> np.ndarray | None:
    """A DFL box head's output decoded as its application decodes it: [positions, 4] expected
    distances in bins (the softmax over each side's bins, times 0..bins-1). The 4 x bins values lie
    on the last axis or the one before it: the smaller of those that holds a multiple of 4 (at
    least 8); None where neither does."""
    array = np.asarray(value, np.float64)
    axes = [axis for axis in (-1, -2) if array.ndim >= -axis and array.shape[axis] >= 8 and array.shape[axis] % 4 == 0]
    if not axes:
        return None
    axis = min(axes, key=lambda a: array.shape[a])
    sides = np.moveaxis(array, axis, -1).reshape(-1, 4, array.shape[axis] // 4)
    weights = np.exp(sides - sides.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights @ np.arange(sides.shape[-1], dtype=np.float64)


# ---------------------------------------------------------------- an application's decision

def ctc_greedy(probs: np.ndarray, blank: int = 0) -> tuple[list[int], float]:
    """rapidocr's greedy CTC decode of one line ([1, T, C]): the kept indices and the line's score."""
    index, top = probs[0].argmax(axis=-1), probs[0].max(axis=-1)
    keep = index != blank
    keep[1:] &= index[1:] != index[:-1]
    confs = [round(float(p), 5) for p in top[keep]]
    return [int(i) for i in index[keep]], round(float(np.mean(confs)), 5) if confs else 0.0


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance of two strings."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def decide(kind: str, output: np.ndarray):
    """The application's decision from one output."""
    values = np.asarray(output, np.float64)
    if kind == "top1":
        return tuple(int(i) for i in values.reshape(-1, values.shape[-1]).argmax(axis=-1))
    if kind == "argmax_seq":
        return tuple(int(i) for i in values.reshape(-1, values.shape[-1]).argmax(axis=-1))
    if kind == "ctc":
        text, last = [], None
        for index in values.reshape(-1, values.shape[-1]).argmax(axis=-1):
            if index != last and index != 0:
                text.append(int(index))
            last = index
        return tuple(text)
    if kind == "speech":
        return tuple(bool(v > 0.5) for v in values.ravel())
    if kind == "detect":
        return tuple((cls, box) for cls, box, _ in detections(values))
    raise ValueError(kind)


def same_decision(kind: str, want, got) -> bool:
    """Whether two decisions agree: equal, or for detections the same classes with boxes within
    BOX_SLACK px."""
    if kind == "detect":
        return same_detections([(c, b, 0.0) for c, b in want], [(c, b, 0.0) for c, b in got])
    return want == got


def margin(kind: str, output: np.ndarray, spread: float) -> float | None:
    """How close the float decision was: the gap between the top two values over ``spread`` (the
    standard deviation of that output over every sample), or the distance from the threshold
    (speech); None for sequences."""
    values = np.asarray(output, np.float64)
    if kind == "top1":
        ordered = np.sort(values.reshape(-1, values.shape[-1]), axis=-1)
        return round(float(np.min(ordered[:, -1] - ordered[:, -2]) / (spread + 1e-12)), 4)
    if kind == "speech":
        return round(float(np.min(np.abs(values - 0.5))), 4)
    return None


def decisions(case, reference: dict, candidate: dict) -> dict | None:
    """``case.decision`` read from output ``case.decision_output`` on every sample both sides ran:
    how many agree, and for each that differs how close the float decision was."""
    if case.decision is None:
        return None
    samples = sorted(set(reference) & set(candidate))
    if not samples:
        return None
    differing, distinct = [], set()
    spread = float(np.std([np.asarray(reference[s][case.decision_output], np.float64) for s in samples]))
    for sample in samples:
        want = decide(case.decision, reference[sample][case.decision_output])
        distinct.add(want)
        got = decide(case.decision, candidate[sample][case.decision_output])
        if not same_decision(case.decision, want, got):
            entry = {"sample": sample, "margin": margin(case.decision, reference[sample][case.decision_output], spread)}
            if case.decision in ("ctc", "argmax_seq"):
                entry.update(float_length=len(want),
                             differing=sum(a != b for a, b in zip(want, got)) + abs(len(want) - len(got)))
            differing.append(entry)
    return {"agree": len(samples) - len(differing), "samples": len(samples), "differing": differing,
            "distinct_float_decisions": len(distinct)}


def wrong(measure: dict | None, decision: dict | None) -> list[str]:
    """What makes an output wrong by this benchmark's rule (empty: it is right, or unmeasured)."""
    reasons = []
    if measure:
        if measure["cosine"] is not None and measure["cosine"] < COSINE_GATE:
            reasons.append(f"cosine {measure['cosine']:.4f} < {COSINE_GATE}")
        if measure["norm_ratio"] is not None and abs(measure["norm_ratio"] - 1) > NORM_GATE:
            reasons.append(f"norm ratio {measure['norm_ratio']:.4f} beyond 1 +- {NORM_GATE}")
        if measure["nonfinite"]:
            reasons.append("NaN/Inf")
    if decision and decision["agree"] < decision["samples"]:
        details = []
        for entry in decision["differing"]:
            if entry.get("margin") is not None:
                details.append(f"float margin {entry['margin']:g}")
            elif "differing" in entry:
                details.append(f"{entry['differing']} of {entry['float_length']} positions")
        reasons.append(f"decision differs on {decision['samples'] - decision['agree']}/{decision['samples']} samples"
                       + (f" ({', '.join(details)})" if details else ""))
    return reasons


def session_verdict(reply: dict | None) -> str | None:
    """A real session's outcome by check's rule: none (no session, no run, or no node on the EP),
    full, partial."""
    if not reply:
        return None
    if not reply.get("created") or reply.get("run_error") or reply.get("runs", 0) < reply.get("expected_runs", 1):
        return "none"
    on_ep, total = reply.get("nodes_on_ep", 0), reply.get("nodes_total", 0)
    return "none" if on_ep == 0 else "full" if on_ep == total else "partial"


# ---------------------------------------------------------------- agreements and intervals

def wilson(agree: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion."""
    if total == 0:
        return (0.0, 1.0)
    p = agree / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (max(0.0, centre - half), min(1.0, centre + half))


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of ``values``: the order statistics k and n-k+1
    whose binomial(n, 1/2) coverage first reaches ``level``."""
    ordered, n = sorted(values), len(values)
    for k in range(n // 2, 0, -1):
        # P(X_(k) <= median <= X_(n-k+1)) = 1 - 2 P(Binomial(n, 1/2) <= k - 1)
        if 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n >= level:
            return ordered[k - 1], ordered[n - k]
    return ordered[0], ordered[-1]


def judge_outputs(case, reference: dict[int, list[np.ndarray]], outputs: dict[int, list[np.ndarray]],
                  samples: int) -> dict:
    """A file's outputs against the float model's on the same ``samples`` feeds: the lowest cosine,
    samples at the cosine bar, the decision's agreement (or the cosine's where the case has none)
    with its Wilson interval, and the pooled norm ratio farthest from 1."""
    measure = compare(reference, outputs)
    per_sample = [compare({i: reference[i]}, {i: outputs[i]})["cosine"] for i in reference]
    cosine_ok = sum(c is None or c >= COSINE_GATE for c in per_sample)
    if case.decision:
        out = case.decision_output
        # equal, or for detections the same classes with boxes within BOX_SLACK px (NudeNet's
        # integer boxes: exact equality counted a 1 px move)
        agree = sum(same_decision(case.decision, decide(case.decision, reference[i][out]),
                                  decide(case.decision, outputs[i][out])) for i in reference)
        ratios = [pooled_norm_ratio(reference, outputs, out)]
    else:
        agree = cosine_ok
        ratios = [pooled_norm_ratio(reference, outputs, o) for o in range(len(reference[0]))]
    ratios = [r for r in ratios if r is not None]
    low, high = wilson(agree, samples)
    return {"loads": True, "runs": True, "samples": samples, "agree": agree, "interval": [low, high],
            "lowest_cosine": measure["cosine"] if measure else None,
            "nonfinite": bool(measure and measure["nonfinite"]), "samples_at_cosine_bar": cosine_ok,
            "norm_ratio": max(ratios, key=lambda r: abs(r - 1)) if ratios else None}


def below_bar(case, judged: dict | None) -> bool | None:
    """True: the file is wrong by the bench's rule (or does not load or run); None: not judged."""
    if not judged:
        return None
    if not judged.get("runs"):
        return True
    if case.decision:
        return judged["agree"] / judged["samples"] < BARS[case.decision]
    return judged["nonfinite"] or (judged["lowest_cosine"] is not None and judged["lowest_cosine"] < COSINE_GATE)


def refusal_class(case, judged: dict | None, codes: list[str]) -> str | None:
    """A refusal measured by its refused file: "right" (below the bar, or it does not run), "for
    size" (refused for not being smaller alone, QNT003, and the file holds the bar), "needless" (an
    accuracy refusal whose file is at or above the bar), "needless by the interval" (the whole
    interval at or above the bar); None when there was no file to judge."""
    is_wrong = below_bar(case, judged)
    if is_wrong is None:
        return None
    if is_wrong:
        return "right"
    if set(codes) == {"QNT003"}:
        return "for size"
    if case.decision and judged["interval"][0] >= BARS[case.decision]:
        return "needless by the interval"
    return "needless"


def wrong_by_interval(case, judged: dict | None) -> bool:
    """The whole 95% interval of the decision's agreement lies below the application's bar."""
    return bool(case.decision and judged and judged.get("runs") and judged["interval"][1] < BARS[case.decision])


# ---------------------------------------------------------------- an application's verdict (bench/suite/apps)

def within_bound(value: float | None, bound: tuple[str, float]) -> bool | None:
    """``bound``: ("max", limit) or ("min", limit) on the app's metric; None when unmeasured."""
    if value is None:
        return None
    kind, limit = bound
    return value <= limit if kind == "max" else value >= limit


def app_verdict(entry: dict, bound: tuple[str, float]) -> str:
    """One ortprep run swapped into an app: kept, silent failure, rightly refused, needless refusal, ..."""
    app = entry.get("app") or {}
    ok = within_bound(app.get("value"), bound) if app else None
    if app and app.get("error"):
        ok = False
    if app and app.get("not_opened"):
        return "harness error: the swapped file was not opened"
    if entry["exit"] == 0:
        if not entry["written"]:
            return "silent failure (exit 0, nothing written)"
        return "kept" if ok else "SILENT FAILURE"
    if entry["exit"] not in (0, 1):
        return f"exit {entry['exit']}"
    if ok is None:
        return "refused (nothing to measure)"
    return "NEEDLESS REFUSAL" if ok else "rightly refused"


def percent_equal(pairs: list[tuple], key) -> float:
    """The share (%) of (reference, candidate) pairs whose ``key`` values are equal."""
    return 100.0 * sum(key(a) == key(b) for a, b in pairs) / max(1, len(pairs))
