"""issue 51: the journey's quantize step alone, timed, on the models named (bench/suite/journey.py
step 3, the same command and samples: `quantize FIXED --static --ep qnn --auto --auto-exclude
--calib CALIB/` with --ep-total-seconds and --search-seconds at their defaults), so that the step's
time can be measured without the rest of the journey (docs/decisions/speed-ep-verdict.md).

    PYTHONPATH=. .venv/bin/python -m bench.studies.journey_quantize_time --models DIR --out OUT NAME ...

DIR: the wheels' models (bench_corpus.fetch's folder, bench/out/journey/models). Per model: the
step's exit, seconds, peak RSS, its report's ``timing`` and the machine's load average before and
after, into OUT/NAME/quantize.json (the report) and OUT/times.json (one record per model).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench.suite.journey import CALIB, INDEPENDENT, write_samples
from bench.suite.journey_corpus import CORPUS, build
from bench.suite.runner import ortprep

STEP_TIMEOUT = 1800.0  # the journey's bound is 900 s: the study lets a step overrun it, to measure by how much


def quantize_step(name: str, out: Path, models: Path) -> dict:
    case = next(c for c in CORPUS if c.name == name)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    source = build(case, folder, models)
    write_samples(case, folder / "calib", CALIB, seed=1)
    sample = write_samples(case, folder / "independent", INDEPENDENT, seed=7)[0]
    fixed = folder / "fixed.onnx"
    if case.static:
        shapes = [a for k, dims in case.static.items() for a in ("--fix-shape", f"{k}={','.join(map(str, dims))}")]
        converted = ortprep("convert", ["convert", source, *shapes, "--inputs", sample, "-o", fixed, "--force"],
                            folder, STEP_TIMEOUT)
        if converted["exit"] != 0:
            return {"model": name, "error": "convert failed", "convert": converted}
    else:
        fixed = source
    metrics = [a for k, kind in case.metrics.items() for a in ("--metric", f"{k}={kind}")]
    load_before = os.getloadavg()
    entry = ortprep("quantize", ["quantize", fixed, "--static", "--ep", "qnn", "--auto", "--auto-exclude", "--calib",
                                 folder / "calib", "-o", folder / "qdq.onnx", "--force", *metrics], folder,
                    STEP_TIMEOUT)
    report = entry.pop("report") or {}
    findings = [f"{f.get('code')}: {f.get('message', '')[:200]}" for f in report.get("findings", [])
                if f.get("severity") in ("error", "ERROR")]
    data = report.get("data") or report
    return {"model": name, **entry, "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()], "timing": data.get("timing"),
            "auto": [(t.get("label"), t.get("passed")) for t in (data.get("auto") or {}).get("tried", [])],
            "errors": findings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", choices=[c.name for c in CORPUS])
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    times = args.out / "times.json"
    records = json.loads(times.read_text()) if times.exists() else {}
    for name in args.names:
        record = quantize_step(name, args.out, args.models)
        records[name] = record
        times.write_text(json.dumps(records, indent=1))
        print(f"{name}: exit {record.get('exit')} in {record.get('seconds')} s (load {record.get('load_before')} -> "
              f"{record.get('load_after')}); timing {record.get('timing')}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
