# Sourced by the GPU scripts: with WHEELS=folder (a lent machine has no network, so the
# onnxruntime-gpu wheel is carried in pieces and put together there), install the wheels into
# /tmp/site and put the CUDA libraries of NVIDIA's pip packages (the machine's own) on
# LD_LIBRARY_PATH; then name the runtime and the GPU in $OUT/ort.txt.
OUT=${OUT:-bench/out/gpu}
mkdir -p "$OUT"
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
  LIBS=$(python3 -c "import glob, nvidia; print(':'.join(p for d in nvidia.__path__ for p in glob.glob(d + '/*/lib') + glob.glob(d + '/*/*/lib')))")
  export LD_LIBRARY_PATH=$LIBS:${LD_LIBRARY_PATH:-}
fi
python3 -c "import onnxruntime as o, onnx; print('onnxruntime', o.__version__, o.get_available_providers(), 'onnx', onnx.__version__)" | tee "$OUT/ort.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/ort.txt"
run() { echo "+ ortprep $*" >&2; python3 -m ortprep "$@"; echo "  exit $?" >&2; }
