"""Conclusion (sessions 19-29; bench/suite/results/journey.md): read as rapidocr reads them, PP-OCRv4's
A16W16 recogniser keeps 29 of 30 fresh lines on QNN (47 of 50 pooled with the gate's samples, 94%,
below the 95% bar): quantize's refusals on QNN are right, and FP16 (which it names) holds.

rapidocr's reading of its two PP-OCR models, float model against a deployed file: the
application-level check for the journey's ocr_det and ocr_rec (rapidocr 3.10.0), and for
ocr_det_v4 and ocr_rec_v4 (PP-OCRv4, rapidocr-onnxruntime 1.4.4; modes det-v4 and rec-v4).

det: the text detector's probability map (its one output, 1x1x320x320) goes through rapidocr's own
DBPostProcess class, built with its shipped config.yaml values (Det: thresh 0.3, box_thresh 0.5,
max_candidates 1000, unclip_ratio 1.6, use_dilation true, score_mode fast). rapidocr needs cv2,
pyclipper and shapely, which live in bench/out/apps-venv, not in .venv. So the script works in two
stages. Stage 1 (.venv) runs both models and saves the maps in a temporary .npz. Stage 2 is this
script again, run by apps-venv's python with the hidden flag --post-det FILE. It boxes both maps
and prints the boxes as JSON.

rec: the text recogniser's probabilities (its one output, 1x40x18710; PP-OCRv4's 1x40x6625) are decoded as rapidocr's
CTCLabelDecode does it, written here: argmax per position, repeats merged, the blank (index 0)
dropped. The line's score is the mean of the top probability over the kept positions (each rounded
to 5 decimals, then the mean; 0 for an empty line). rapidocr drops a line whose score is below its
text_score, 0.5.

    .venv/bin/python -m bench.studies.ocr_app {det,rec,det-v4,rec-v4} FLOAT.onnx DEPLOYED.onnx (SAMPLES_DIR | --fresh N)
        [--ep qnn|cpu] [--json PATH]

SAMPLES_DIR holds .npz files with key x. ``--fresh N``: N fresh inputs from the journey's own
generator for ocr_det or ocr_rec (seed 11, as decision_rates.py). The float model runs on the CPU
EP. The deployed one runs on QNN's HTP simulator (soc_model 60, as the journey's sessions) or on
the CPU EP.

What "the same" means. det: both sides find as many boxes, and each float box has a deployed box
whose 4 corners are each within 2 px in x and in y. Boxes are paired greedily, closest pair first;
the distance of a pair is its worst corner. A pair beyond 2 px is "moved"; the boxes left without
a partner are "lost" (float only) or "added" (deployed only). rec: the decoded index strings are
equal, and the line is kept (score >= 0.5) on both sides or dropped on both.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.paths import BENCH, ROOT
from bench.referee import ctc_greedy, match_by_corners

APPS_PYTHON = BENCH / "out" / "apps-venv" / "bin" / "python"  # has rapidocr 3.10.0 and cv2
RAPIDOCR = "3.10.0"
# journey_corpus names: PP-OCRv6 (rapidocr 3.10.0) and PP-OCRv4 (rapidocr-onnxruntime 1.4.4, whose
# config.yaml holds the same Det post-processing values and text_score)
CASES = {"det": "ocr_det", "rec": "ocr_rec", "det-v4": "ocr_det_v4", "rec-v4": "ocr_rec_v4"}
SHAPES = {"det": (1, 3, 320, 320), "rec": (1, 3, 48, 320), "det-v4": (1, 3, 320, 320),
          "rec-v4": (1, 3, 48, 320)}  # input x, as the journey fixes it
# rapidocr 3.10.0, config.yaml, Det section
DET_POST = {"thresh": 0.3, "box_thresh": 0.5, "max_candidates": 1000, "unclip_ratio": 1.6,
            "use_dilation": True, "score_mode": "fast"}
CORNER_SLACK = 2  # pixels, in x and in y, per corner, for two boxes to be the same
BLANK = 0  # CTC blank index
TEXT_SCORE = 0.5  # rapidocr 3.10.0, config.yaml, Global.text_score


# ---------------------------------------------------------------- det


def post_det(path: Path) -> int:
    """Stage 2, in apps-venv: rapidocr's DBPostProcess on both maps of every sample."""
    from importlib.metadata import version

    from rapidocr.ch_ppocr_det.utils import DBPostProcess

    if version("rapidocr") != RAPIDOCR:
        print(f"warning: rapidocr {version('rapidocr')} here, not {RAPIDOCR}", file=sys.stderr)
    post = DBPostProcess(**DET_POST)
    data = np.load(path)
    result = {"rapidocr": version("rapidocr"), "float": [], "deployed": []}
    for side in ("float", "deployed"):
        for pred in data[side]:
            height, width = pred.shape[-2:]
            boxes, scores = post(pred, (height, width))
            result[side].append({"boxes": [[[int(x), int(y)] for x, y in box] for box in boxes],
                                 "scores": [round(float(s), 5) for s in scores]})
    print(json.dumps(result))
    return 0


def boxes_of(float_maps: list[np.ndarray], deployed_maps: list[np.ndarray]) -> dict:
    """Stage 1's call to stage 2: the maps go to apps-venv's python, the boxes come back."""
    if not APPS_PYTHON.exists():
        raise SystemExit(f"no {APPS_PYTHON}: det mode needs the applications' environment (rapidocr, cv2)")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "maps.npz"
        np.savez(path, float=np.stack(float_maps), deployed=np.stack(deployed_maps))
        done = subprocess.run([str(APPS_PYTHON), "-m", "bench.studies.ocr_app", "--post-det", str(path)],
                              capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"stage 2 (--post-det in apps-venv) failed, exit {done.returncode}:\n{done.stderr}")
    sys.stderr.write(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare_boxes(want: list, got: list) -> dict:
    return match_by_corners(want, got, CORNER_SLACK)


def run_det(samples, reference, candidate, ep: str) -> tuple[list[dict], dict, str]:
    float_maps, deployed_maps = [], []
    for name, feeds in samples:
        for session, maps in ((reference, float_maps), (candidate, deployed_maps)):
            out = session.run(None, feeds)[0]  # each model's only output
            if out.shape != (1, 1) + SHAPES["det"][2:]:
                raise SystemExit(f"{name}: the map has shape {out.shape}, expected {(1, 1) + SHAPES['det'][2:]}")
            maps.append(np.asarray(out, dtype=np.float32))  # cv2.mean in rapidocr takes float32, not float16
    boxed = boxes_of(float_maps, deployed_maps)
    records = []
    for (name, _), want, got in zip(samples, boxed["float"], boxed["deployed"]):
        record = {"sample": name, **compare_boxes(want["boxes"], got["boxes"]),
                  "float": want, "deployed": got}
        records.append(record)
        if not record["same"]:
            print(f"{name}: float {record['float_boxes']} box(es), {ep} {record['deployed_boxes']}; "
                  f"lost {record['lost']}, added {record['added']}, moved {record['moved']}; "
                  f"worst corner {record['worst_corner_px'] if record['worst_corner_px'] is not None else '-'} px")
    summary = {"samples": len(records), "same": sum(r["same"] for r in records),
               "float_boxes": sum(r["float_boxes"] for r in records),
               "deployed_boxes": sum(r["deployed_boxes"] for r in records),
               "lost": sum(r["lost"] for r in records), "added": sum(r["added"] for r in records),
               "moved": sum(r["moved"] for r in records), "rapidocr": boxed["rapidocr"]}
    line = (f"{summary['same']}/{summary['samples']} samples with the same boxes (as many, every corner within "
            f"{CORNER_SLACK} px); {summary['float_boxes']} box(es) by the float model, {summary['deployed_boxes']} "
            f"by {ep}; lost {summary['lost']}, added {summary['added']}, moved {summary['moved']}")
    return records, summary, line


# ---------------------------------------------------------------- rec


def decode(probs: np.ndarray) -> tuple[list[int], float]:
    """rapidocr's greedy CTC decode of one line: the kept indices and the line's score."""
    return ctc_greedy(probs, BLANK)


def rec_probs(session, name: str, feeds: dict) -> np.ndarray:
    out = session.run(None, feeds)[0]  # each model's only output
    if out.ndim != 3 or out.shape[0] != 1:
        raise SystemExit(f"{name}: the output has shape {out.shape}, expected (1, positions, characters)")
    return out


def run_rec(samples, reference, candidate, ep: str) -> tuple[list[dict], dict, str]:
    records = []
    for name, feeds in samples:
        (want, want_score), (got, got_score) = (decode(rec_probs(s, name, feeds)) for s in (reference, candidate))
        record = {"sample": name, "equal": want == got, "float": want, "deployed": got,
                  "float_score": want_score, "deployed_score": got_score,
                  "float_kept": want_score >= TEXT_SCORE, "deployed_kept": got_score >= TEXT_SCORE,
                  "score_change": round(abs(want_score - got_score), 5)}
        record["keep_changed"] = record["float_kept"] != record["deployed_kept"]
        records.append(record)
        if not record["equal"] or record["keep_changed"]:
            first = next((k for k, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
            where = f"first difference at character {first}" if not record["equal"] else "strings equal"
            print(f"{name}: float {len(want)} char(s) score {want_score} "
                  f"{'kept' if record['float_kept'] else 'dropped'}, {ep} {len(got)} char(s) score {got_score} "
                  f"{'kept' if record['deployed_kept'] else 'dropped'}; {where}")
    summary = {"samples": len(records), "equal": sum(r["equal"] for r in records),
               "keep_changed": sum(r["keep_changed"] for r in records),
               "largest_score_change": max((r["score_change"] for r in records), default=0.0)}
    line = (f"{summary['equal']}/{summary['samples']} strings equal; {summary['keep_changed']} line(s) kept on one "
            f"side and dropped on the other (text_score {TEXT_SCORE}); largest score change "
            f"{summary['largest_score_change']:.5f}")
    return records, summary, line


# ---------------------------------------------------------------- both


def load_samples(mode: str, folder: Path | None, fresh: int) -> list[tuple[str, dict]]:
    if fresh:
        from bench.suite.decision_rates import SEED
        from bench.suite.journey_corpus import CORPUS

        case = next(c for c in CORPUS if c.name == CASES[mode])
        rng = np.random.default_rng(SEED)
        samples = [(f"fresh {i}", case.inputs(rng, i)) for i in range(fresh)]
    else:
        samples = [(path.name, dict(np.load(path))) for path in sorted(folder.glob("*.npz"))]
        if not samples:
            raise SystemExit(f"no .npz files in {folder}")
    for name, feeds in samples:
        if set(feeds) != {"x"} or tuple(feeds["x"].shape) != SHAPES[mode]:
            shapes = {k: tuple(v.shape) for k, v in feeds.items()}
            raise SystemExit(f"{name}: inputs {shapes}, the {mode} model takes x {SHAPES[mode]} only")
    return [(name, {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in feeds.items()})
            for name, feeds in samples]


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--post-det":
        return post_det(Path(sys.argv[2]))

    import onnxruntime as ort

    from bench.suite.decision_rates import QNN_SOC_MODEL, qnn_session

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=sorted(CASES))
    parser.add_argument("float_model", type=Path)
    parser.add_argument("deployed", type=Path)
    parser.add_argument("samples", type=Path, nargs="?")
    parser.add_argument("--fresh", type=int, default=0, help="fresh inputs from the journey's generator (seed 11)")
    parser.add_argument("--ep", choices=["qnn", "cpu"], default="qnn")
    parser.add_argument("--json", type=Path, help="write the per-sample records and the summary here")
    args = parser.parse_args()
    if bool(args.samples) == bool(args.fresh):
        parser.error("give either SAMPLES_DIR or --fresh N")
    samples = load_samples(args.mode, args.samples, args.fresh)
    reference = ort.InferenceSession(str(args.float_model), providers=["CPUExecutionProvider"])
    candidate = (qnn_session(args.deployed, QNN_SOC_MODEL) if args.ep == "qnn"
                 else ort.InferenceSession(str(args.deployed), providers=["CPUExecutionProvider"]))
    run = run_det if args.mode.startswith("det") else run_rec
    records, summary, line = run(samples, reference, candidate, args.ep)
    print(line)
    if args.json:
        args.json.write_text(json.dumps({"mode": args.mode, "float_model": str(args.float_model),
                                         "deployed": str(args.deployed), "ep": args.ep,
                                         "samples": records, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
