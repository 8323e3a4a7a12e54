"""Conclusion (session 27-28; bench/suite/results/bench_weight_only.md): int4 with compensated
rounding passes this 57M-weight stack (lowest cosine 0.9963; nearest rounding 0.9750, refused) at a
peak RSS of 1,374 MB, within issue 22's bound of 1,672 MB.

Time and peak memory of `quantize --weight-only int4` on a model of a language model's size
class (issue 22, part 4: memory bounded; part 3: weight-only), beside ORT's own call.

The model: 12 blocks of MatMul 768->3072, Relu, MatMul 3072->768 and a residual Add (57M float
weights, 226 MB of external data), seeded random weights; 16 calibration samples of [1, 128, 768]
whose features move together (32 directions and noise), as a layer's inputs do. Each command runs
in a child under a small launcher (bench_weight_only.launch: wall time, the child's peak RSS):
- ORT: MatMulNBitsQuantizer(block 32, asymmetric).process() and a save with external data;
- ortprep: `quantize MODEL --weight-only int4 --calib DIR --rounding nearest|gptq`.
Every written file is judged on 8 other samples (seed 7) against the float model: lowest cosine.

    .venv/bin/python -m bench.studies.weight_only_memory [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from bench.paths import BENCH
from bench.referee import cosine
from bench.suite.bench_weight_only import launch

BLOCKS, HIDDEN, INNER, TOKENS = 12, 768, 3072, 128
_ORT_CALL = r"""
import sys, onnx
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
quantizer = MatMulNBitsQuantizer(onnx.load(sys.argv[1]), bits=4, block_size=32, is_symmetric=False)
quantizer.process()
quantizer.model.save_model_to_file(sys.argv[2], use_external_data_format=True)
"""


def build(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(BLOCKS):
        weights += [
            numpy_helper.from_array(
                (rng.standard_normal((HIDDEN, INNER)) / np.sqrt(HIDDEN)).astype(np.float32), f"up{i}.w"
            ),
            numpy_helper.from_array(
                (rng.standard_normal((INNER, HIDDEN)) / np.sqrt(INNER)).astype(np.float32), f"down{i}.w"
            ),
        ]
        nodes += [helper.make_node("MatMul", [x, f"up{i}.w"], [f"h{i}"], name=f"up{i}"),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"act{i}"),
                  helper.make_node("MatMul", [f"r{i}", f"down{i}.w"], [f"d{i}"], name=f"down{i}"),
                  helper.make_node("Add", [x, f"d{i}"], [f"x{i}"], name=f"residual{i}")]
        x = f"x{i}"
    graph = helper.make_graph(
        nodes,
        "stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, HIDDEN])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, TOKENS, HIDDEN])],
        weights,
    )
    path = folder / "stack.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path, save_as_external_data=True,
              location="stack.onnx.data")
    return path


def samples(seed: int, count: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    basis = np.random.default_rng(99).standard_normal((32, HIDDEN))
    return [
        {
            "x": (rng.standard_normal((1, TOKENS, 32)) @ basis + 0.3 * rng.standard_normal((1, TOKENS, HIDDEN))).astype(
                np.float32
            )
        }
        for _ in range(count)
    ]


def lowest_cosine(reference: Path, candidate: Path, feeds: list[dict]) -> float:
    want, got = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (reference, candidate))
    cosines = []
    for feed in feeds:
        cosines.append(cosine(want.run(None, feed)[0], got.run(None, feed)[0]))
    return min(cosines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BENCH / "out" / "weight_only_memory")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = build(args.out)
    calib = args.out / "calib"
    calib.mkdir(exist_ok=True)
    for index, feed in enumerate(samples(1, 16)):
        np.savez(calib / f"{index:03d}.npz", **feed)
    fresh = samples(7, 8)
    size_mb = (model.stat().st_size + (args.out / "stack.onnx.data").stat().st_size) / 2 ** 20
    print(f"model: {size_mb:.0f} MB; the bound 3x the model + 1 GB: {3 * size_mb + 1024:.0f} MB\n")
    print("| who | exit | s | peak RSS (MB) | rounding | accuracy_level | lowest cosine on 8 unseen samples |")
    print("|---|---:|---:|---:|---|---:|---:|")
    out = args.out / "ort.int4.onnx"
    code, seconds, rss, _ = launch([sys.executable, "-c", _ORT_CALL, str(model), str(out)])
    print(f"| ORT MatMulNBitsQuantizer | {code} | {seconds:.0f} | {rss:.0f} | nearest | 0 | "
          f"{lowest_cosine(model, out, fresh):.4f} |", flush=True)
    for rounding in ("nearest", "gptq"):
        out, report = args.out / f"ortprep.{rounding}.onnx", args.out / f"ortprep.{rounding}.json"
        out.unlink(missing_ok=True)
        code, seconds, rss, _ = launch(
            [
                sys.executable,
                "-m",
                "ortprep",
                "quantize",
                str(model),
                "--weight-only",
                "int4",
                "--calib",
                str(calib),
                "--rounding",
                rounding,
                "-o",
                str(out),
                "--force",
                "--json",
                "--report",
                str(report),
                "--keep-failed",
            ]
        )
        record = json.loads(report.read_text()) if report.exists() else {}
        judged = out if out.exists() else (Path(record["kept_failed"]) if record.get("kept_failed") else None)
        level = (record.get("weight_only") or {}).get("accuracy_level")
        cosine = (
            f"{lowest_cosine(model, judged, fresh):.4f}" + ("" if judged == out else " (refused file)")
            if judged
            else "-"
        )
        print(
            f"| ortprep --rounding {rounding} | {code} | {seconds:.0f} | {rss:.0f} | {rounding} | {level} | {cosine} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
