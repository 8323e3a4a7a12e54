"""Conclusion (session 27; bench/suite/results/bench_weight_only.md): for a decode step
accuracy_level 4 is what makes weight-only pay (int4 0.23-0.25x float's time, int8 0.32-0.35x; level
0, ORT's default, 1.37x and 31.6x); batches of tokens are compute-bound, so ortprep keeps level 0
where level 4 is not clearly faster.

Weight-only MatMulNBits against the float MatMul on the CPU EP, by accuracy_level (issue 22,
part 5: speed is part of the verdict). The corpus's transformers are small enough that a call's
overhead hides the kernel, so the kernels are timed here on the shapes that decide it: a language
model's decode step (one token, 1x4096 by 4096x4096 and 1x1024 by 1024x1024) and an encoder's batch
of tokens (128x384 by 384x1536, a MiniLM's FFN; 8x256 by 256x512).

For each shape: the float MatMul; ORT's own MatMulNBitsQuantizer (block 32, asymmetric, what a user
calls) at accuracy_level 0 (left out: float32 compute on the CPU EP) and 4 (int8 compute), int4
and int8; `ortprep quantize --weight-only BITS` with its default --accuracy-level (auto: 4 on the
CPU EP) in a child, judged by its gate on 16 seeded inputs. Median of 200 runs after 20 warm-up
runs, one thread, all in one process; the ratio to float's median is printed.

    .venv/bin/python -m bench.studies.weight_only_speed
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

SHAPES = ((1, 4096, 4096), (1, 1024, 1024), (128, 384, 1536), (8, 256, 512))
RUNS, WARMUP = 200, 20


def matmul_model(m: int, k: int, n: int) -> onnx.ModelProto:
    weight = (np.random.default_rng(0).standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "proj",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])],
                              [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ort_call(model: onnx.ModelProto, bits: int, level: int) -> onnx.ModelProto:
    config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False, bits=bits, accuracy_level=level or None)
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=32, is_symmetric=False, algo_config=config,
                                     accuracy_level=level or None)
    quantizer.process()
    return quantizer.model.model


def median_ms(model: onnx.ModelProto | str, feed: dict) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    source = model if isinstance(model, str) else model.SerializeToString()
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    for _ in range(WARMUP):
        session.run(None, feed)
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def ortprep(model: onnx.ModelProto, bits: str, folder: Path) -> tuple[int, str | None, dict]:
    source, output = folder / f"float.{bits}.onnx", folder / f"ortprep.{bits}.onnx"
    onnx.save(model, source)
    child = subprocess.run([sys.executable, "-m", "ortprep", "quantize", str(source), "--weight-only", bits, "-o",
                            str(output), "--force", "--json"], capture_output=True, text=True)
    record = json.loads(child.stdout) if child.stdout.strip() else {}
    return child.returncode, (str(output) if output.exists() else None), record


def main() -> int:
    print("| shape (M x K by K x N) | float ms | who | bits | accuracy_level | exit | ms | vs float |")
    print("|---|---:|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for m, k, n in SHAPES:
            model = matmul_model(m, k, n)
            feed = {"x": np.random.default_rng(1).standard_normal((1, m, k)).astype(np.float32)}
            base = median_ms(model, feed)
            shape = f"{m}x{k} by {k}x{n}"
            for bits in (4, 8):
                for level in (0, 4):
                    ms = median_ms(ort_call(matmul_model(m, k, n), bits, level), feed)
                    print(f"| {shape} | {base:.3f} | ORT MatMulNBitsQuantizer | int{bits} | {level} | 0 | {ms:.3f} | "
                          f"{ms / base:.2f} |", flush=True)
                code, written, record = ortprep(model, f"int{bits}", Path(tmp))
                level = (record.get("weight_only") or {}).get("accuracy_level")
                ms = median_ms(written, feed) if written else None
                print(
                    f"| {shape} | {base:.3f} | ortprep --weight-only | int{bits} | {level} | {code} | "
                    f"{'-' if ms is None else f'{ms:.3f}'} | {'-' if ms is None else f'{ms / base:.2f}'} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
