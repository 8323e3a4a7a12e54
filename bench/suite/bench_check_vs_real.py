"""check's prediction against the real EPs that run on x86 Linux: QNN's HTP simulator
(onnxruntime-qnn) and OpenVINO's CPU device (onnxruntime-openvino in .venv-openvino).

    .venv/bin/python -m bench.suite.bench_check_vs_real [--out bench/out/real] [--quick]

The corpus: the sample models, and real models that ship inside PyPI wheels (PaddleOCR det/rec/
cls from rapidocr, magika's content-type model, Silero VAD from faster-whisper; the wheels are
fetched with pip download into bench/out). Each comes as shipped (float, dynamic shapes), with
static shapes, and quantized to QDQ with the QNN preset (uint16 activations) and with uint8
activations. Quantization uses random calibration data: the point is placement, not accuracy.
For every model and EP, `ortprep load --json` runs it on the EP and puts check's prediction next to
the EP's own assignment record: node-level agreement, partitions, verdicts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.common import models_from_wheels
from bench.paths import OUT, ROOT

ORTPREP = [sys.executable, "-m", "ortprep"]
OPENVINO = ROOT / ".venv-openvino" / "bin" / "python"

WHEELS = {  # package -> {file inside the wheel: corpus name}
    "rapidocr==3.10.0": {"rapidocr/models/PP-OCRv6_det_small.onnx": "ocr_det.onnx",
                         "rapidocr/models/PP-OCRv6_rec_small.onnx": "ocr_rec.onnx",
                         "rapidocr/models/ch_ppocr_mobile_v2.0_cls_mobile.onnx": "ocr_cls.onnx"},
    "magika==1.0.3": {"magika/models/standard_v3_3/model.onnx": "magika.onnx"},
    "faster-whisper==1.2.1": {"faster_whisper/assets/silero_vad_v6.onnx": "silero_vad.onnx"},
}
# Static shapes for the models whose inputs are dynamic (what a deployment would fix).
STATIC = {
    "ocr_det.onnx": ["x=1,3,320,320"],
    "ocr_rec.onnx": ["x=1,3,48,320"],
    "ocr_cls.onnx": ["x=1,3,48,192"],
    "magika.onnx": ["bytes=1,2048"],
    "silero_vad.onnx": ["input=1,576"],
    "transformer_block.onnx": ["hidden=1,16,64"],
    "conv1d_audio.onnx": ["audio=1,1,1024"],
}
SAMPLES = ["cnn.onnx", "transformer_block.onnx", "conv1d_audio.onnx", "control_flow.onnx"]


def ortprep(*args: str, timeout: float = 900) -> tuple[int, dict | None, str]:
    child = subprocess.run(
        [*ORTPREP, *map(str, args), "--json"], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    try:
        return child.returncode, json.loads(child.stdout), child.stderr
    except json.JSONDecodeError:
        return child.returncode, None, child.stderr


def fetch_real_models(out: Path) -> list[Path]:
    return models_from_wheels(out / "wheels", WHEELS, out / "corpus")


def shapes_of(model: Path) -> list[str]:
    base = model.name.split(".")[0] + ".onnx"
    return [arg for spec in STATIC.get(base, []) for arg in ("--fix-shape", spec)]


def build_corpus(out: Path, quick: bool) -> list[tuple[str, Path]]:
    corpus = out / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    originals = [ROOT / "sample_models" / name for name in SAMPLES] + fetch_real_models(out)
    models: list[tuple[str, Path]] = []
    for source in originals:
        stem = source.name.removesuffix(".onnx")
        models.append((f"{stem} (float, as shipped)", source))
        static = corpus / f"{stem}.static.onnx"
        if shapes_of(source) and not static.exists():
            code, _, err = ortprep("convert", source, *shapes_of(source), "--no-verify", "-o", static, "--force")
            if code != 0:
                print(f"  {stem}: static shapes failed: {err.strip()[:200]}", file=sys.stderr)
        base = static if static.exists() else source
        if static.exists():
            models.append((f"{stem} (float, static)", static))
        if quick:
            continue
        for label, extra in (
            ("qdq uint16", ["--ep", "qnn"]),
            ("qdq uint8", ["--ep", "qnn", "--activation-type", "uint8"]),
        ):
            target = corpus / f"{stem}.{label.replace(' ', '_')}.onnx"
            if not target.exists():
                code, _, err = ortprep("quantize", base, "--static", "--calib", "random", "--samples", "4", *extra,
                                       "--keep-failed", "--no-verify", "--fail-on", "never", "-o", target)
                if code not in (0, 1) or not target.exists():
                    print(f"  {stem}: {label} failed: {err.strip()[:200]}", file=sys.stderr)
                    continue
            models.append((f"{stem} ({label}, static)" if static.exists() else f"{stem} ({label})", target))
    return models


def measure(models: list[tuple[str, Path]], eps: list[str]) -> list[dict]:
    rows = []
    for label, path in models:
        for ep in eps:
            args = ["load", path, "--ep", ep, "--runs", "1", "--timeout", "600"]
            if ep == "openvino-cpu":
                args += ["--runtime", f"openvino-cpu={OPENVINO}"]
            started = time.perf_counter()
            _, record, err = ortprep(*args)
            seconds = time.perf_counter() - started
            result = (record or {}).get("results", [{}])[0]
            comparison = result.get("check_comparison") or {}
            rows.append({"model": label, "ep": ep, "status": result.get("status", "error"),
                         "on_ep": f"{result.get('nodes_on_ep')}/{result.get('nodes_total')}",
                         "agreement": comparison.get("node_agreement"), "compared": comparison.get("nodes_compared"),
                         "partitions": (comparison.get("predicted_partitions"), comparison.get("actual_partitions")),
                         "verdicts": (comparison.get("predicted_verdict"), comparison.get("actual_verdict")),
                         "differ": comparison.get("differing_op_types", {}), "seconds": round(seconds, 1),
                         "message": (result.get("message") or err or "")[:160]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| model | EP | status | nodes on EP | node agreement | partitions check/real | verdict check/real | op types "
        "that differ |",
        "|---|---|---|---|---:|---|---|---|",
    ]
    for row in rows:
        agreement = "-" if row["agreement"] is None else f"{row['agreement'] * 100:.1f}% of {row['compared']}"
        partitions = "{} / {}".format(*row["partitions"]) if row["partitions"][0] is not None else "-"
        verdicts = "{} / {}".format(*row["verdicts"]) if row["verdicts"][0] is not None else "-"
        differ = ", ".join(f"{op} {n}" for op, n in row["differ"].items()) or "-"
        lines.append(
            f"| {row['model']} | {row['ep']} | {row['status']} | {row['on_ep']} | {agreement} | {partitions} | "
            f"{verdicts} | {differ} |"
        )
    compared = [r for r in rows if r["agreement"] is not None]
    if compared:
        nodes = sum(r["compared"] for r in compared)
        agree = sum(r["agreement"] * r["compared"] for r in compared)
        verdicts = sum(1 for r in compared if r["verdicts"][0] == r["verdicts"][1])
        partitions = sum(1 for r in compared if abs(r["partitions"][0] - r["partitions"][1]) <= 1)
        lines += [
            "",
            f"Over {len(compared)} sessions: nodes agree {agree / nodes * 100:.2f}% ({int(round(agree))}/{nodes}); "
            f"verdicts agree in {verdicts}/{len(compared)}; partition count within 1 of the real one in "
            f"{partitions}/{len(compared)}.",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT / "real")
    parser.add_argument("--quick", action="store_true", help="float models only")
    args = parser.parse_args()
    models = build_corpus(args.out, args.quick)
    eps = ["qnn"] + (["openvino-cpu"] if OPENVINO.exists() else [])
    rows = measure(models, eps)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    text = table(rows)
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
