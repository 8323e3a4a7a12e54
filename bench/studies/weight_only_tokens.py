"""Conclusion (session 28; bench/suite/results/bench_weight_only.md): on gpt2_medium_slice
ortprep's int4 runs at 0.29x float's time one token at a time and its int8 at 0.40x (ORT's level-0
files 1.27x and 16.1x): issue 22's point 5 holds there at every token count measured.

The weight-only files bench_weight_only.py wrote for gpt2_medium_slice, timed against the float
model at 1, 8 and 32 tokens (a decode step, a short prompt, the corpus's samples), one thread, in
paired rounds (bench.common.paired_latency: 21 rounds, the median ratio and its 95% interval).
Token ids are seeded (0); a weight-only file's time does not depend on them.

    .venv/bin/python -m bench.studies.weight_only_tokens [--folder bench/out/weight_only/gpt2_medium_slice]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bench.paths import BENCH
from bench.common import paired_latency

FILES = ("ortprep.int4.auto.onnx", "ort.int4.onnx", "ortprep.int8.auto.onnx", "ort.int8.onnx")
TOKENS = (1, 8, 32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=BENCH / "out" / "weight_only" / "gpt2_medium_slice")
    args = parser.parse_args()
    source = args.folder / "gpt2_medium_slice.onnx"
    print("| file | tokens | float ms | vs float (95% interval) |\n|---|---:|---:|---:|")
    for name in FILES:
        if not (args.folder / name).exists():
            print(f"| {name} | - | - | not written |")
            continue
        for tokens in TOKENS:
            feed = {"input_ids": np.random.default_rng(0).integers(0, 512, (1, tokens)).astype(np.int64)}
            timed = paired_latency(source, args.folder / name, feed)
            low, high = timed["latency_interval"]
            print(
                f"| {name} | {tokens} | {timed['float_ms']:.2f} | {timed['latency_ratio']:.2f} ({low:.2f}-{high:.2f}) "
                f"|",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
