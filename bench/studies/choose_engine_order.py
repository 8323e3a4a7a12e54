"""Which engine's baseline passes ortprep's gate most often, and at what cost, on the DEVELOPMENT half of
journey_corpus (issue 51: `--engine auto` tries the engines in an order learned there; the evaluation
half is never looked at). The record: docs/decisions/choose-engine-order.md.

    nice -n 10 .venv/bin/python -m bench.studies.choose_engine_order [--only NAME ...] [--timeout 150]

Per model: the float model and 24 calibration samples as bench/suite/engines.py makes them (seed 1), then
``ortprep quantize FLOAT --static --calib CALIB --engine E --keep-failed [--metric ...] --json`` for E in
ort, nncf, aimet (no search: the engine's baseline under the gate). Each command runs under
runner.launch with a timeout; its exit, the gate's verdict and figures, the engine's own seconds and
the whole command's seconds are kept in bench/out/choose/results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.paths import OUT, ROOT
from bench.suite.engines import CALIB, CALIB_SEED
from bench.suite.journey import write_samples
from bench.suite.journey_corpus import CORPUS
from bench.suite.quantize_yield import build_float_model, float_model
from bench.suite.runner import ortprep

ENGINES = ("ort", "nncf", "aimet")
# gpt2_medium_slice: hundreds of MB of weights, three quantizes of it are past this study's budget
SKIPPED = {"gpt2_medium_slice"}
ORDER = ("transformer_block", "lstm_keywords", "gru_tagger", "gpt2_tiny", "control_flow_classifier",
         "unet_small", "silero_vad", "dddd_det", "ocr_rec_v4", "ocr_rec")


def run_engine(case, source: Path, calib: Path, folder: Path, engine: str, timeout: float) -> dict:
    metric_args = [a for name, kind in case.metrics.items() for a in ("--metric", f"{name}={kind}")]
    target = folder / f"{engine}.onnx"
    args = ["quantize", source, "--static", "--calib", calib, "--engine", engine, "--keep-failed", *metric_args,
            "-o", target, "--force"]
    entry = ortprep(engine, args, folder, timeout)
    report = entry.get("report") or {}
    candidates = (report.get("engine") or {}).get("candidates") or []
    mine = next((c for c in candidates if c.get("engine") == engine), {})
    return {"exit": entry["exit"], "seconds": entry["seconds"], "peak_rss_mb": entry["peak_rss_mb"],
            "status": mine.get("status"), "passed": mine.get("passed"), "cosine": mine.get("cosine"),
            "engine_seconds": mine.get("seconds"), "error": mine.get("error") or mine.get("reason"),
            "codes": [f.get("code") for f in report.get("findings") or []],
            "stderr_tail": (entry.get("stderr_tail") or "")[-300:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--journey", type=Path, default=OUT / "journey")
    parser.add_argument("--out", type=Path, default=OUT / "choose")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--timeout", type=float, default=150.0)
    args = parser.parse_args()
    cases = {c.name: c for c in CORPUS if c.half == "dev" and c.name not in SKIPPED}
    names = [n for n in ORDER if n in cases and (not args.only or n in args.only)]
    saved = args.out / "results.json"
    rows = json.loads(saved.read_text()) if saved.exists() else {}
    for name in names:
        case = cases[name]
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        source = float_model(case, args.journey) or build_float_model(case, args.journey)
        if source is None:
            rows[name] = {"skipped": "no float model"}
            continue
        calib = folder / "calib"
        write_samples(case, calib, CALIB, seed=CALIB_SEED)
        started = time.perf_counter()
        rows[name] = {"decision": case.decision, "engines": {}}
        for engine in ENGINES:
            record = run_engine(case, source, calib, folder, engine, args.timeout)
            rows[name]["engines"][engine] = record
            print(f"{name} {engine}: exit {record['exit']} passed {record['passed']} cosine {record['cosine']} "
                  f"engine {record['engine_seconds']} s, command {record['seconds']} s {record['error'] or ''}",
                  file=sys.stderr, flush=True)
        rows[name]["seconds"] = round(time.perf_counter() - started, 1)
        args.out.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(rows, indent=1))
    print(json.dumps({"results": str(saved.relative_to(ROOT)) if saved.is_relative_to(ROOT) else str(saved)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
