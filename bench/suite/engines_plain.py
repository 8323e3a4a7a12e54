"""The field's quantizers called plain, as a new user calls them, for bench/suite/engines.py: each one
a small script run in its own interpreter under runner.launch (its own peak RSS and timeout).

- ORT: bench_corpus.PEER (quant_pre_process, then quantize_static with its QDQ defaults).
- NNCF: ``nncf.quantize(model, nncf.Dataset(samples))`` with every default; ``transformer`` adds
  ``model_type=nncf.ModelType.TRANSFORMER`` (NNCF then uses its MIXED preset and SmoothQuant).
  Telemetry off before the import: NNCF_CI=1 and ``sys.modules["openvino_telemetry"] = None``
  (docs/decisions/engines-nncf-aimet.md).
- AIMET-ONNX, in .venv-aimet's interpreter (the main .venv has no torch): ``QuantizationSimModel``
  with its defaults (W8A8, min-max, the default config), ``compute_encodings`` on the samples,
  exported with ``to_onnx_qdq(prequantize_constants=True)`` so that ORT loads it and the weights are
  stored as int8 (the default keeps them float before a Q/DQ pair: the same encodings in a file larger
  than the float model); ``cle`` runs ``equalize_model`` first.

The scripts are text run with ``python -c``, as bench_corpus.PEER is, so that no bench module
imports nncf, aimet_onnx or torch: the import contracts keep those libraries inside ortprep's runtime.
Each takes one JSON request (engine, source, target, data: calibration .npz files, workdir) and
prints one JSON line: the engine call's own seconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.paths import ROOT
from bench.suite import bench_corpus
from bench.suite.runner import launch

AIMET_PYTHON = ROOT / ".venv-aimet" / "bin" / "python"

NNCF = r'''
import json, os, sys, time
os.environ["NNCF_CI"] = "1"
sys.modules["openvino_telemetry"] = None
import numpy as np, onnx
import nncf
request = json.loads(sys.argv[1])
model = onnx.load(request["source"])
items = [dict(np.load(path)) for path in request["data"]]
names = {i.name for i in model.graph.input}
options = {}
if request["engine"] == "nncf_transformer":
    options["model_type"] = nncf.ModelType.TRANSFORMER
started = time.perf_counter()
quantized = nncf.quantize(model, nncf.Dataset(items, lambda item: {k: v for k, v in item.items() if k in names}),
                          **options)
seconds = time.perf_counter() - started
onnx.save_model(quantized, request["target"])
print(json.dumps({"seconds": seconds, "version": nncf.__version__}))
'''

AIMET = r'''
import json, sys, time
import numpy as np, onnx
import aimet_onnx
from aimet_onnx.quantsim import QuantizationSimModel
request = json.loads(sys.argv[1])
model = onnx.load(request["source"])
items = [dict(np.load(path)) for path in request["data"]]
names = {i.name for i in model.graph.input}
items = [{k: v for k, v in item.items() if k in names} for item in items]
started = time.perf_counter()
if request["engine"] == "aimet_cle":
    from aimet_onnx.cross_layer_equalization import equalize_model
    equalize_model(model)
sim = QuantizationSimModel(model, path=request["workdir"])
sim.compute_encodings(items)
exported = sim.to_onnx_qdq(prequantize_constants=True)
seconds = time.perf_counter() - started
onnx.save_model(exported, request["target"])
print(json.dumps({"seconds": seconds, "version": getattr(aimet_onnx, "__version__", "?")}))
'''

# engine -> (interpreter, script); the row names of the table
PLAIN = {
    "ort": (sys.executable, bench_corpus.PEER),
    "nncf": (sys.executable, NNCF),
    "nncf_transformer": (sys.executable, NNCF),
    "aimet": (str(AIMET_PYTHON), AIMET),
    "aimet_cle": (str(AIMET_PYTHON), AIMET),
}
LABELS = {"ort": "ORT quantize_static (QDQ defaults)", "nncf": "NNCF defaults",
          "nncf_transformer": "NNCF model_type=TRANSFORMER", "aimet": "AIMET-ONNX defaults",
          "aimet_cle": "AIMET-ONNX CLE + defaults"}


def plain_run(engine: str, source: Path, target: Path, calib: list[Path], folder: Path, timeout: float) -> dict:
    """One plain engine call: exit (or "timeout"), process seconds, peak RSS, the engine call's own
    seconds, and the last line of stderr where it failed (a crash is recorded, never raised)."""
    python, script = PLAIN[engine]
    work = folder / f"{engine}_work"
    work.mkdir(parents=True, exist_ok=True)
    request = {"engine": engine, "kind": "static", "source": str(source), "target": str(target),
               "data": [str(p) for p in calib], "workdir": str(work)}
    stdout, stderr = folder / f"{engine}.log", folder / f"{engine}.stderr"
    target.unlink(missing_ok=True)
    if not Path(python).exists():
        return {"exit": "not run", "error": f"no interpreter {python}", "written": False, "file": str(target)}
    code, seconds, rss = launch([python, "-c", script, json.dumps(request)], stdout, stderr, timeout, cwd=work)
    record = {"exit": code, "seconds": round(seconds, 1), "peak_rss_mb": round(rss), "written": target.exists(),
              "file": str(target), "engine_seconds": None, "error": None}
    try:
        record["engine_seconds"] = round(json.loads(stdout.read_text().strip().splitlines()[-1])["seconds"], 2)
    except (OSError, ValueError, IndexError, KeyError):
        pass
    if code != 0:
        lines = [line for line in (stderr.read_text(errors="replace") if stderr.exists() else "").splitlines()
                 if line.strip()]
        record["error"] = "timed out" if code == "timeout" else (lines[-1] if lines else f"exit {code}")[:300]
    for stale in folder.glob(f"{target.name}.pre.onnx*"):  # quant_pre_process's intermediate file
        stale.unlink()
    return record
