#!/usr/bin/env bash
# Conclusion (2026-11-26; bench/studies/gpu.md): weight-only int4/int8 on CUDA, check held to the real
# placement; figures in bench/studies/gpu.md.
# Weight-only int4/int8 (MatMulNBits, issue 22) on the CUDA EP of a real GPU: does check's table
# (cuda runs MatMulNBits) hold against the real session, do the outputs match the CPU EP's, and is
# it faster than float there? Not part of make test (CI has no GPU). Figures in bench/studies/gpu.md.
#
# On a lent machine with no network: WHEELS=folder holding the onnxruntime-gpu wheel (carried in
# pieces: cat them together first) and this script installs it into /tmp/site, with the CUDA
# libraries of NVIDIA's pip packages (the machine's own) on LD_LIBRARY_PATH, as gpu_proof.sh does.
set -u
. "$(dirname "$0")/gpu_env.sh"
# A GPT-2-like decoder of GPT-2-small's width (hidden 768, 12 heads), 4 layers, 512-token vocabulary,
# built by the journey corpus's own builder; 16 Zipf token samples of 128 tokens (8 to judge, 1 to time).
HIDDEN=${HIDDEN:-768} HEADS=${HEADS:-12} python3 - <<'EOF' || exit 3
import sys
from pathlib import Path
import os
import numpy as np, onnx
from bench.suite.journey_corpus import _gpt_inputs  # (run from the repository root)
from bench.suite.journey_models import gpt2_tiny
model = gpt2_tiny(hidden=int(os.environ["HIDDEN"]), heads=int(os.environ["HEADS"]), layers=4, max_len=256)
onnx.save(model, "/tmp/gpt2_768.onnx")
rng = np.random.default_rng(11)
Path("/tmp/gpt_eval").mkdir(exist_ok=True)
for i in range(16):
    np.savez(f"/tmp/gpt_eval/s{i:02d}.npz", **_gpt_inputs(rng, i, tokens=128))
np.savez("/tmp/gpt_one.npz", **_gpt_inputs(rng, 99, tokens=128))
print("built", Path("/tmp/gpt2_768.onnx").stat().st_size, "bytes")
EOF
M=/tmp/gpt2_768.onnx
run check $M --ep cuda --prove --json > "$OUT/check_float.json"
run load $M --ep cuda --ep cpu --inputs /tmp/gpt_one.npz --runs 200 --json > "$OUT/load_float.json"
for bits in int4 int8; do
  run quantize $M --weight-only $bits --ep cuda --eval /tmp/gpt_eval -o /tmp/gpt2_768.$bits.onnx --json > "$OUT/quantize_$bits.json"
  if [ -f /tmp/gpt2_768.$bits.onnx ]; then
    run check /tmp/gpt2_768.$bits.onnx --ep cuda --prove --json > "$OUT/check_$bits.json"
    run load /tmp/gpt2_768.$bits.onnx --ep cuda --ep cpu --reference $M --inputs /tmp/gpt_one.npz --runs 200 --json > "$OUT/load_$bits.json"
  fi
done
ls -la /tmp/gpt2_768*.onnx | tee -a "$OUT/ort.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -5 | tee "$OUT/pytest.txt"
