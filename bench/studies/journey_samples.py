"""Conclusion (session 12, 2026-11-26; bench/studies/journey_samples.md): three of session 11's four
passes of a wrong output (ocr_rec, dddd_det, silero_vad) fail on the samples they were calibrated on;
quantize's gate now confirms a passing result over held-back and calibration samples together
(`verify.confirmation`).

How a journey's QDQ models do on each group of samples: the ones quantize calibrated on, the ones
it held back (its gate's evidence), and the unseen ones the journey judges with, on the CPU EP and
(with --qnn) on QNN's HTP simulator, against the float model on the CPU EP.

    .venv/bin/python -m bench.studies.journey_samples [--out bench/out/journey] [--only NAME ...] [--qnn]

Per model and group: quantize's own gate on that group alone (evaluate.judge with the decisions
ortprep infers: the lowest cosine, the norm ratio as the gate takes it, each gated decision's
agreement and expected agreement), and whether it passes. The split is quantize's own (calibrate.held_back_share
and calibration.split over the CALIB folder's sorted files), so "held back" is what the gate saw.
Written for the question "do the calibration samples show what the held-back ones miss?" (issue
20: a result that passed on its 8 held-back samples failed on unseen ones).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bench.paths import OUT
from ortprep import calibration_split as split
from ortprep import held_back_share, infer_decisions


def float_model(out: Path, folder: Path) -> Path | None:
    for candidate in (folder / "fixed.onnx", folder / f"{folder.name}.onnx", out / "models" / f"{folder.name}.onnx"):
        if candidate.exists():
            return candidate
    return None


def session(model: Path, qnn: bool, soc_model: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not qnn:
        return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    import onnxruntime_qnn

    provider = "QNNExecutionProvider"
    if not any(d.ep_name == provider for d in ort.get_ep_devices()):
        ort.register_execution_provider_library(provider, onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == provider]
    options.add_provider_for_devices(
        devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "soc_model": soc_model}
    )
    created = ort.InferenceSession(str(model), sess_options=options, enable_fallback=0)
    created.disable_fallback()  # a failed QNN run stays one (no silent CPU re-run)
    return created


def outputs(created, paths: list[Path]) -> list[dict[str, np.ndarray]]:
    names = [o.name for o in created.get_outputs()]
    inputs = {i.name for i in created.get_inputs()}
    found = []
    for path in paths:
        feeds = {k: v for k, v in np.load(path).items() if k in inputs}
        found.append(dict(zip(names, created.run(None, feeds))))
    return found


def figures(proto, reference: list[dict], candidate: list[dict]) -> dict:
    """The gate's own judgement (quantize's evaluate.judge: cosine per sample, norm ratio, decisions
    with their expected agreement) of ``candidate`` on one group of samples."""
    from ortprep import gate_flat_outputs as flat_outputs
    from ortprep import gate_judge as judge

    decisions = infer_decisions(proto, reference)
    judged = judge("group", reference, candidate, 0.99, flat_outputs(reference, None), decisions)
    decided = {o["name"]: {key: o["decision"].get(key) for key in ("kind", "agreement", "expected_agreement",
                                                                  "sequence_agreement", "region_agreement", "passed")}
               for o in judged.outputs if (o.get("decision") or {}).get("gated")}
    return {"samples": len(reference), "lowest_cosine": judged.cosine, "norm_ratio": judged.norm_ratio,
            "passed": judged.passed, "decisions": decided}


def model_rows(out: Path, folder: Path, qnn: bool) -> list[dict]:
    import onnx

    source, qdq = float_model(out, folder), folder / "qdq.onnx"
    if source is None or not qdq.exists():
        return []
    calib = sorted((folder / "calib").glob("*.npz"))
    calibrated, held = split(len(calib), holdout=held_back_share(len(calib)))
    groups = {"calibrated on": [calib[i] for i in calibrated], "held back": [calib[i] for i in held],
              "unseen": sorted((folder / "independent").glob("*.npz"))}
    proto = onnx.load(str(source), load_external_data=False)
    float_session = session(source, False, "60")
    sides = {"cpu": session(qdq, False, "60")}
    if qnn:
        check = json.loads((folder / "check_qnn.json").read_text()) if (folder / "check_qnn.json").exists() else {}
        soc_model = str(((check.get("device") or {}).get("soc_model")) or "60")
        sides["qnn"] = session(qdq, True, soc_model)
    rows = []
    for group, paths in groups.items():
        reference = outputs(float_session, paths)
        for side, created in sides.items():
            rows.append({"model": folder.name, "group": group, "ep": side,
                         **figures(proto, reference, outputs(created, paths))})
    return rows


def render(rows: list[dict]) -> str:
    lines = [
        "| model | samples | EP | n | lowest cosine | norm ratio | decisions (agreement; whole sequences) | the gate |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        decided = "; ".join(
            f"{name} {d['kind']} {d['agreement']:.4f}" + (f", whole {d['sequence_agreement']:.4f}"
                                                        if d.get("sequence_agreement") is not None else "")
            + (f", regions {d['region_agreement']:.4f}" if d.get("region_agreement") is not None else "")
            + ("" if d["passed"] else " (fails)") for name, d in row["decisions"].items()) or "-"
        cosine = "-" if row["lowest_cosine"] is None else f"{row['lowest_cosine']:.4f}"
        ratio = "-" if row["norm_ratio"] is None else f"{row['norm_ratio']:.4f}"
        verdict = "passes" if row["passed"] else "**fails**"
        lines.append(
            f"| {row['model']} | {row['group']} | {row['ep']} | {row['samples']} | {cosine} | {ratio} | {decided} "
            f"| {verdict} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT / "journey")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--qnn", action="store_true", help="also run the QDQ models on QNN's HTP simulator (slow)")
    args = parser.parse_args()
    folders = sorted(p for p in args.out.iterdir() if p.is_dir() and (p / "calib").is_dir())
    rows = []
    for folder in folders:
        if args.only and folder.name not in args.only:
            continue
        found = model_rows(args.out, folder, args.qnn)
        rows += found
        print(f"{folder.name}: {len(found)} rows", file=sys.stderr, flush=True)
    (args.out / "samples.json").write_text(json.dumps(rows, indent=1))
    print(render(rows))


if __name__ == "__main__":
    main()
