#!/usr/bin/env bash
# The CUDA and TensorRT paths on a real GPU (not part of make test: CI has no GPU).
# Needs an onnxruntime-gpu on the path (and onnxconverter-common for the FP16 step); writes the
# JSON reports to $OUT (default bench/out/gpu). Figures in bench/RESULTS.md.
set -u
OUT=${OUT:-bench/out/gpu}
mkdir -p "$OUT"
run() { echo "+ ortprep $*" >&2; python3 -m ortprep "$@"; echo "  exit $?" >&2; }
run doctor --json > "$OUT/doctor.json"
run load sample_models/cnn.onnx --ep cuda --ep tensorrt --ep cpu --runs 200 --json > "$OUT/load_cnn.json"
run load sample_models/transformer_block.onnx --ep cuda --ep cpu --runs 200 --shape hidden=8,128,64 --json > "$OUT/load_tb.json"
run convert sample_models/transformer_block.onnx --fp16 --ep cuda -o /tmp/tb.fp16.onnx --json > "$OUT/convert_fp16.json"
run load /tmp/tb.fp16.onnx --ep cuda --runs 200 --shape hidden=8,128,64 --json > "$OUT/load_tb_fp16.json"
run quantize sample_models/transformer_block.onnx --dynamic --ep cuda --calib random -o /tmp/tb.int8.onnx --fail-on never --json > "$OUT/quantize_dynamic.json"
run load /tmp/tb.int8.onnx --ep cuda --runs 200 --shape hidden=8,128,64 --json > "$OUT/load_tb_int8.json"
