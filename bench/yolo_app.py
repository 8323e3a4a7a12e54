"""NudeNet's detections, float model against a deployed file: the application-level check for the
journey's YOLOv8n, whose gate judges one output that holds box coordinates in pixels beside class
scores in 0..1 (the boxes dominate its cosine).

NudeNet 3.4.2's post-processing, as its nudenet.py does it (read from the wheel): a candidate where
a class score reaches 0.2, boxes from centre to corner, non-maximum suppression at score 0.25 and
IoU 0.45; the detections it returns are (class, integer box, score). Written here without cv2:
the NMS keeps boxes in descending score order, each unless it overlaps a kept one by more than the
IoU bound.

    .venv/bin/python bench/yolo_app.py FLOAT.onnx DEPLOYED.onnx (SAMPLES_DIR | --fresh N) [--ep qnn|cpu]

``--fresh N``: N fresh scenes from the journey's own generator for yolov8n (seed 11, as
decision_rates.py) instead of a folder of samples.

The float model runs on the CPU EP, the deployed one on QNN's HTP simulator (soc_model 60, as the
journey's sessions) or the CPU EP. Prints each sample where either side detects anything and a
count of samples whose detections agree: same classes, boxes within 2 px per coordinate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

CANDIDATE, NMS_SCORE, NMS_IOU = 0.2, 0.25, 0.45  # nudenet 3.4.2, nudenet.py
BOX_SLACK = 2  # pixels per coordinate for two detections to be the same


def _overlap(a, b) -> float:
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[0] + a[2], b[0] + b[2]), min(a[1] + a[3], b[1] + b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    union = max(0.0, a[2]) * max(0.0, a[3]) + max(0.0, b[2]) * max(0.0, b[3]) - inter
    return inter / union if union > 0 else 0.0


def detections(output: np.ndarray) -> list[tuple[int, tuple[int, ...], float]]:
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
        if scores[index] >= NMS_SCORE and all(_overlap(boxes[index], boxes[k]) <= NMS_IOU for k in kept):
            kept.append(index)
    return sorted((classes[i], tuple(int(v) for v in boxes[i]), round(scores[i], 3)) for i in kept)


def same(a, b) -> bool:
    return len(a) == len(b) and all(ca == cb and max(abs(p - q) for p, q in zip(ba, bb)) <= BOX_SLACK
                                    for (ca, ba, _), (cb, bb, _) in zip(a, b))


def main() -> int:
    import onnxruntime as ort

    from decision_rates import QNN_SOC_MODEL, qnn_session

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("float_model", type=Path)
    parser.add_argument("deployed", type=Path)
    parser.add_argument("samples", type=Path, nargs="?")
    parser.add_argument("--fresh", type=int, default=0, help="fresh scenes from the journey's generator (seed 11)")
    parser.add_argument("--ep", choices=["qnn", "cpu"], default="qnn")
    args = parser.parse_args()
    reference = ort.InferenceSession(str(args.float_model), providers=["CPUExecutionProvider"])
    candidate = (qnn_session(args.deployed, QNN_SOC_MODEL) if args.ep == "qnn"
                 else ort.InferenceSession(str(args.deployed), providers=["CPUExecutionProvider"]))
    if args.fresh:
        from decision_rates import SEED
        from journey_corpus import CORPUS

        case = next(c for c in CORPUS if c.name == "yolov8n")
        rng = np.random.default_rng(SEED)
        samples = [(f"fresh {i}", case.inputs(rng, i)) for i in range(args.fresh)]
    else:
        samples = [(path.name, dict(np.load(path))) for path in sorted(args.samples.glob("*.npz"))]
    agree = found = 0
    for name, feeds in samples:
        feeds = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
        want, got = detections(reference.run(None, feeds)[0]), detections(candidate.run(None, feeds)[0])
        found += len(want)
        agree += same(want, got)
        if want or got:
            print(f"{name}: float {want} | {args.ep} {got}")
    print(f"{agree}/{len(samples)} samples with the same detections (classes, boxes within {BOX_SLACK} px); "
          f"{found} detection(s) by the float model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
