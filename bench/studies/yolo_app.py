"""Conclusion (sessions 18-26; bench/suite/results/journey.md): on NudeNet's own detections the
quantized YOLOv8n with its move kept 24/24 calibration and 100/100 fresh scenes on QNN, while the
cosine that passed an earlier file could not see 2 of its 3 detecting scenes change; the journey now
passes `--metric output0=detect:0.25`. The figures rest on 3 detections.

NudeNet's detections, float model against a deployed file: the application-level check for the
journey's YOLOv8n, whose gate judges one output that holds box coordinates in pixels beside class
scores in 0..1 (the boxes dominate its cosine).

NudeNet 3.4.2's post-processing, as its nudenet.py does it (read from the wheel): a candidate where
a class score reaches 0.2, boxes from centre to corner, non-maximum suppression at score 0.25 and
IoU 0.45; the detections it returns are (class, integer box, score); bench.referee.detections
writes it without cv2.

    .venv/bin/python -m bench.studies.yolo_app FLOAT.onnx DEPLOYED.onnx (SAMPLES_DIR | --fresh N) [--ep qnn|cpu]

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

from bench.referee import BOX_SLACK, detections
from bench.referee import same_detections as same


def main() -> int:
    import onnxruntime as ort

    from bench.suite.decision_rates import QNN_SOC_MODEL, qnn_session

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
        from bench.suite.decision_rates import SEED
        from bench.suite.journey_corpus import CORPUS

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
