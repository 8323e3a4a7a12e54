#!/usr/bin/env bash
# Conclusion (2026-11-22/25; bench/studies/gpu.md): without TensorRT's libraries TensorRT takes no node and
# the session silently runs on the CPU; load says so (LOD005) and doctor names the missing library.
# The CUDA and TensorRT paths on a real GPU (not part of make test: CI has no GPU).
# Needs an onnxruntime-gpu on the path (and onnxconverter-common for the FP16 step); writes the
# JSON reports to $OUT (default bench/out/gpu). Figures in bench/studies/gpu.md.
#
# On a lent machine with no network: carry the onnxruntime-gpu wheel in pieces and set
# WHEELS=folder-with-the-wheels; this script installs them into /tmp/site first, and puts the
# CUDA libraries of NVIDIA's pip packages (the machine's own) on LD_LIBRARY_PATH.
set -u
. "$(dirname "$0")/gpu_env.sh"
run doctor --json > "$OUT/doctor.json"
run load sample_models/cnn.onnx --ep cuda --ep tensorrt --ep cpu --runs 200 --json > "$OUT/load_cnn.json"
run load sample_models/transformer_block.onnx --ep cuda --ep cpu --runs 200 --shape hidden=8,128,64 --json > "$OUT/load_tb.json"
run convert sample_models/transformer_block.onnx --fp16 --ep cuda -o /tmp/tb.fp16.onnx --json > "$OUT/convert_fp16.json"
run load /tmp/tb.fp16.onnx --ep cuda --runs 200 --shape hidden=8,128,64 --json > "$OUT/load_tb_fp16.json"
# a package made here (the CUDA variant proven by a session), and the variant ORT's rules pick for each EP
rm -rf /tmp/tb.pkg
run package sample_models/transformer_block.onnx -o /tmp/tb.pkg --target cpu --target cuda --shape hidden=8,128,64 --json > "$OUT/package_tb.json"
run load --package /tmp/tb.pkg --shape hidden=8,128,64 --runs 200 --json > "$OUT/load_package_tb.json"
# the seeds' CUDA-context clash, without TensorRT (its libraries are not on the machine)
python3 bench/studies/gpu_context_clash.py > "$OUT/context_clash.jsonl" 2> "$OUT/context_clash.err"
cat "$OUT/context_clash.jsonl"
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_package.py 2>&1 | tail -15 | tee "$OUT/pytest.txt"
