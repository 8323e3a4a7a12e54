"""How often the journey's quantized models change the application's decision, measured on many
fresh inputs, beside the agreement ortprep's gate expected.

The journey judges each written QDQ model on 8 unseen samples; a decision that flips on 1 input in
100 passes 8 samples 92% of the time, so "0 passes of a wrong output" on 8 samples says little.
This script draws N fresh realistic inputs per model (the journey's own generators, seed 11: the
journey's calibration samples are seed 1, its unseen samples seed 7), runs the float model and the
QDQ model the journey wrote, both on the CPU EP, and counts the application's decisions that differ
(referee.decide: top-1 class, greedy CTC text, argmax per position, speech at 0.5). Beside it: the
bar the application holds (the bench/suite/apps bars: 99% of labels, 95% of strings, 98% of VAD frames),
the 95% Wilson interval of the measured agreement, and the expected agreement that quantize's gate
reported for the same output (its ``verify.outputs[].decision.expected_agreement``, and the
confirmation's over held-back and calibration samples together, on the CPU EP and on QNN).

A model whose measured agreement is below its bar with its whole interval, and that quantize
passed, is a pass of a wrong output that 8 samples could not show.

    .venv/bin/python -m bench.suite.decision_rates [--journey bench/out/journey] [-n 400] [--only NAME ...]
        [--ep cpu|qnn] [--qdq NAME=PATH]

By default the CPU EP runs the QDQ model (the QNN simulator takes seconds per sample on the
larger models; the journey's own table compares QNN with the CPU EP per model); ``--ep qnn`` runs
it on the HTP simulator at ortprep's default device. ``--qdq NAME=PATH`` measures another QDQ file
of that model (a refused one that ``--keep-failed`` wrote: was the refusal needless?).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.paths import OUT
from bench.referee import BARS, decide, same_decision, wilson
from bench.suite.journey_corpus import CORPUS

SEED = 11
QNN_SOC_MODEL = "60"  # ortprep's default QNN device (Snapdragon X Elite), as the journey's sessions


def gate_expected(report: dict, output: str) -> dict:
    """The gate's expected agreement for the decided output: on the held-back samples (CPU, QNN),
    and in the confirmation over held-back and calibration samples (CPU, QNN). For a ranked map
    (a [N, C] Sigmoid output) the ranking's figure: the application's decision here is the best
    score, not the threshold."""
    verify = report.get("verify") or {}

    def expected(outputs: list[dict]) -> float | None:
        for entry in outputs:
            decision = entry.get("decision") or {}
            if entry.get("name") == output and decision:
                return (decision.get("ranking") or decision).get("expected_agreement")
        return None

    confirmation = verify.get("confirmation") or {}
    return {"held_back_cpu": expected(verify.get("outputs") or []),
            "held_back_qnn": expected((verify.get("ep") or {}).get("outputs") or []),
            "confirmation_cpu": expected((confirmation.get("cpu") or {}).get("outputs") or []),
            "confirmation_qnn": expected((confirmation.get("ep") or {}).get("outputs") or [])}


def qnn_session(model: Path, soc_model: str):
    """The QDQ model on QNN's HTP (the simulator here), as the journey builds it: the plugin EP
    registered, then added through its device; CPU fallback for the nodes QNN does not take."""
    import onnxruntime as ort
    import onnxruntime_qnn

    provider = "QNNExecutionProvider"
    if not any(d.ep_name == provider for d in ort.get_ep_devices()):
        ort.register_execution_provider_library(provider, onnxruntime_qnn.get_library_path())
    options = ort.SessionOptions()
    options.log_severity_level = 3
    devices = [d for d in ort.get_ep_devices() if d.ep_name == provider]
    options.add_provider_for_devices(
        devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "soc_model": soc_model}
    )
    session = ort.InferenceSession(str(model), sess_options=options)
    session.disable_fallback()  # a failed QNN run stays a failure, never the CPU EP's outputs
    return session


def measure(case, folder: Path, count: int, qdq: Path | None = None, ep: str = "cpu") -> dict | None:
    import onnxruntime as ort

    report_path, qdq = folder / "quantize.json", qdq or folder / "qdq.onnx"
    if not report_path.exists() or not qdq.exists():
        return None
    report = json.loads(report_path.read_text())
    # the float model quantize read: the fixed-shape file, a model built in the case's folder, or
    # the one shipped in a wheel (the journey's models/)
    candidates = [
        folder / "fixed.onnx",
        folder / f"{case.name}.onnx",
        folder.parent / "models" / Path(report["input"]).name,
    ]
    float_model = next((path for path in candidates if path.exists()), Path(report["input"]))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    reference = ort.InferenceSession(str(float_model), options, providers=["CPUExecutionProvider"])
    candidate = (qnn_session(qdq, QNN_SOC_MODEL) if ep == "qnn"
                 else ort.InferenceSession(str(qdq), options, providers=["CPUExecutionProvider"]))
    output = reference.get_outputs()[case.decision_output].name
    rng = np.random.default_rng(SEED)
    agree = 0
    started = time.perf_counter()
    for index in range(count):
        feeds = {k: np.ascontiguousarray(v) for k, v in case.inputs(rng, index).items()}
        want = decide(case.decision, reference.run(None, feeds)[case.decision_output])
        got = decide(case.decision, candidate.run(None, feeds)[case.decision_output])
        agree += same_decision(case.decision, want, got)
    low, high = wilson(agree, count)
    bar = BARS[case.decision]
    return {"model": case.name, "half": case.half, "decision": case.decision, "ep": ep, "file": str(qdq),
            "samples": count, "agree": agree,
            "agreement": agree / count, "interval": [low, high], "bar": bar,
            "below_bar": high < bar, "above_bar": low >= bar,
            "precision": (report.get("auto") or {}).get("chosen"), "excluded": len(report.get("excluded_nodes") or []),
            "expected": gate_expected(report, output), "seconds": round(time.perf_counter() - started, 1)}


def table(rows: list[dict]) -> str:
    lines = ["| model | half | decision | precision written | measured agreement (95% interval) | bar | verdict | "
             "gate expected: held-back CPU / QNN | with calibration samples: CPU / QNN |",
             "|---|---|---|---|---|---|---|---|---|"]

    def pct(value) -> str:
        return "-" if value is None else f"{value * 100:.2f}%"

    for row in rows:
        verdict = ("**below the bar**" if row["below_bar"] else "above the bar" if row["above_bar"]
                   else "at the bar (interval holds it)")
        e = row["expected"]
        lines.append(f"| {row['model']} | {row['half']} | {row['decision']} | {row['precision'] or '-'} "
                     f"({row['excluded']} float) | {row['agree']}/{row['samples']} = {pct(row['agreement'])} "
                     f"({pct(row['interval'][0])}-{pct(row['interval'][1])}) | {pct(row['bar'])} | {verdict} | "
                     f"{pct(e['held_back_cpu'])} / {pct(e['held_back_qnn'])} | "
                     f"{pct(e['confirmation_cpu'])} / {pct(e['confirmation_qnn'])} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--journey", type=Path, default=OUT / "journey")
    parser.add_argument("-n", type=int, default=400, help="fresh inputs per model (default 400)")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--ep", choices=["cpu", "qnn"], default="cpu",
                        help="where the QDQ model runs (qnn: the HTP simulator, soc_model 60; slow on large models)")
    parser.add_argument("--qdq", action="append", default=[], metavar="NAME=PATH",
                        help="measure this QDQ file for model NAME instead of the journey's (e.g. a --keep-failed one)")
    args = parser.parse_args()
    files = dict(text.split("=", 1) for text in args.qdq)
    rows = []
    for case in CORPUS:
        if case.decision is None or (args.only and case.name not in args.only):
            continue
        given = Path(files[case.name]) if case.name in files else None
        row = measure(case, args.journey / case.name, args.n, given, args.ep)
        if row is None:
            print(f"{case.name}: no QDQ model written by the journey", file=sys.stderr)
            continue
        print(f"{case.name}: {row['agree']}/{row['samples']} in {row['seconds']} s", file=sys.stderr, flush=True)
        rows.append(row)
    rows.sort(key=lambda r: (r["half"] != "eval", r["model"]))
    if not files:  # the journey's own files: the record sits beside them
        (args.journey / f"decision_rates{'' if args.ep == 'cpu' else '_' + args.ep}.json").write_text(
            json.dumps(rows, indent=1)
        )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
