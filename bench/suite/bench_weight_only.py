"""Weight-only quantization (issue 22 part 3): `ortprep quantize --weight-only int4|int8` beside
the call a user would otherwise make, ORT's own MatMulNBitsQuantizer, on the journey corpus's
models that hold MatMuls with constant 2-D weights.

    .venv/bin/python -m bench.suite.bench_weight_only [--half eval|dev|all] [--bits int4 int8] [--only NAME ...]

Per model and bit width, in one run:
- ORT: `MatMulNBitsQuantizer(model, bits, block_size=32, is_symmetric=False).process()` in a child
  (wall time, peak RSS), the file it writes;
- ortprep: `quantize MODEL --weight-only BITS --calib DIR` in a child (wall time, peak RSS, exit,
  the gate's verdict), twice: `--rounding nearest` (ORT's levels; the gate alone) and the default
  `--rounding auto` (nearest, then levels chosen for each MatMul's output on the calibration
  samples where nearest fails the gate). DIR holds 32 realistic samples (seed 7001); with `auto`
  ortprep holds every second one back for its gate (the rounding reads the others), with `nearest`
  all 32 judge;
- every file held to the float model on 50 other realistic samples that no command saw (seed
  7000: cosine, norm ratio, the decision the journey reads from the output where it has one), and
  its CPU latency against float's, one thread: 21 rounds of 5 to 40 runs of each in turns, the median
  of the rounds' ratios and its 95% interval (paired_latency).
Halves by sha256 of the model's name (bench/journey_corpus.half_of, declared before any run);
the evaluation half leads. Results: OUT/results.json and OUT/table.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from bench.common import cpu_session as session
from bench.common import paired_latency
from bench.paths import ROOT
from bench.referee import pooled_first_output as compare
from bench.suite import bench_corpus
from bench.suite.journey_corpus import CORPUS, build

SAMPLES, SEED = 50, 7000  # the fresh samples every file is judged on
CALIB, CALIB_SEED = 32, 7001  # what ortprep gets (--calib)
ROUNDINGS = ("nearest", "auto")
# the measured command's peak RSS is its own: a small launcher forks it (bench.common says why)
_LAUNCHER = r"""
import resource, subprocess, sys
child = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
print(child.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.stderr.write(child.stderr.decode(errors="replace")[-800:])
"""
_ORT_CALL = r"""
import sys, onnx
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
quantizer = MatMulNBitsQuantizer(onnx.load(sys.argv[1]), bits=int(sys.argv[3]), block_size=32, is_symmetric=False)
quantizer.process()
quantizer.model.save_model_to_file(sys.argv[2], use_external_data_format=False)
"""


def launch(argv: list[str]) -> tuple[int, float, float, str]:
    """(exit, seconds, peak RSS in MB, stderr tail) of ``argv`` run under a small launcher."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _LAUNCHER, *argv], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    code, rss = done.stdout.split()
    return int(code), seconds, int(rss) / 1024, done.stderr


def eligible(path: Path) -> bool:
    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {t.name: len(t.dims) for t in graph.initializer}
    return any(n.op_type == "MatMul" and len(n.input) > 1 and weights.get(n.input[1]) == 2 for n in graph.node)


def outputs(path: Path, feeds: list[dict]) -> list[list[np.ndarray]]:
    s = session(path)
    return [s.run(None, feed) for feed in feeds]


def run_case(case, out: Path, bits_list: list[str]) -> dict | None:
    folder = out / case.name
    path = build(case, folder, out / "models")
    if not eligible(path):
        return None
    rng = np.random.default_rng(SEED)
    feeds = [case.inputs(rng, index) for index in range(SAMPLES)]
    data = folder / "calib"
    data.mkdir(parents=True, exist_ok=True)
    calib_rng = np.random.default_rng(CALIB_SEED)
    for index in range(CALIB):
        np.savez(data / f"{index:03d}.npz", **case.inputs(calib_rng, index))
    reference = outputs(path, feeds)
    row = {"model": case.name, "half": case.half, "float_bytes": path.stat().st_size, "bits": {}}
    for bits in bits_list:
        number = {"int4": 4, "int8": 8}[bits]
        ort_out = folder / f"ort.{bits}.onnx"
        code, seconds, rss, err = launch([sys.executable, "-c", _ORT_CALL, str(path), str(ort_out), str(number)])
        ort_entry = {
            "exit": code,
            "seconds": seconds,
            "peak_rss_mb": rss,
            "error": err.strip()[-300:] if code else None,
        }
        if code == 0:
            ort_entry.update(bytes=ort_out.stat().st_size, **paired_latency(path, ort_out, feeds[0]),
                             **compare(reference, outputs(ort_out, feeds), case.decision))
        row["bits"][bits] = {"ort": ort_entry}
        for rounding in ROUNDINGS:
            ours = folder / f"ortprep.{bits}.{rounding}.onnx"
            report = folder / f"ortprep.{bits}.{rounding}.json"
            ours.unlink(missing_ok=True)
            code, seconds, rss, err = launch(
                [
                    sys.executable,
                    "-m",
                    "ortprep",
                    "quantize",
                    str(path),
                    "--weight-only",
                    bits,
                    "--calib",
                    str(data),
                    "--rounding",
                    rounding,
                    "-o",
                    str(ours),
                    "--force",
                    "--json",
                    "--report",
                    str(report),
                    "--keep-failed",
                ]
            )
            record = json.loads(report.read_text()) if report.exists() else {}
            our_entry = {"exit": code, "seconds": seconds, "peak_rss_mb": rss,
                         "codes": sorted({f["code"] for f in record.get("findings", []) if f["severity"] != "info"}),
                         "gate_cosine": (record.get("verify") or {}).get("cosine"),
                         "rounding": (record.get("weight_only") or {}).get("rounding")}
            written = ours if ours.exists() else None
            if written is not None:
                our_entry.update(bytes=written.stat().st_size, **paired_latency(path, written, feeds[0]),
                                 **compare(reference, outputs(written, feeds), case.decision))
            elif record.get("kept_failed"):
                # a refusal, measured through the file it refused (right, or needless)
                our_entry["refused_file"] = compare(
                    reference, outputs(Path(record["kept_failed"]), feeds), case.decision
                )
            row["bits"][bits][f"ortprep {rounding}"] = our_entry
    return row


def render(rows: list[dict]) -> str:
    lines = [
        "| half | model | bits | who | exit | rounding | s | peak RSS (MB) | size vs float | cosine | norm | decision "
        "| "
        "latency vs float (1 thread; 95% interval) | ortprep's findings | the refused file: cosine, decision |",
        "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---|---:|---|---|",
    ]
    for row in sorted(rows, key=lambda r: (r["half"] != "eval", r["model"])):
        for bits, entries in row["bits"].items():
            for who, e in entries.items():
                size = f"{e['bytes'] / row['float_bytes']:.2f}" if e.get("bytes") else "-"
                cos = f"{e['cosine']:.5f}" if e.get("cosine") is not None else "-"
                norm = f"{e['norm_ratio']:.4f}" if e.get("norm_ratio") is not None else "-"
                lat = (f"{e['latency_ratio']:.2f} ({e['latency_interval'][0]:.2f}-{e['latency_interval'][1]:.2f})"
                       if e.get("latency_ratio") else "-")
                label = "ORT MatMulNBitsQuantizer" if who == "ort" else f"ortprep --rounding {who.split()[1]}"
                found = ", ".join(e.get("codes") or []) if who != "ort" else (e.get("error") or "")[:80]
                refused = e.get("refused_file")
                refused_text = f"{refused['cosine']:.5f}, {refused.get('decision', '-')}" if refused else ""
                lines.append(f"| {row['half']} | {row['model']} | {bits} | {label} | {e['exit']} | "
                             f"{e.get('rounding') or ('nearest' if who == 'ort' else '-')} | {e['seconds']:.1f} | "
                             f"{e['peak_rss_mb']:.0f} | {size} | {cos} | {norm} | {e.get('decision', '-')} | {lat} | "
                             f"{found} | {refused_text} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "weight_only")
    parser.add_argument("--half", choices=["eval", "dev", "all"], default="all")
    parser.add_argument("--bits", nargs="*", default=["int4", "int8"], choices=["int4", "int8"])
    parser.add_argument("--only", nargs="*", help="model names (results.json and table.md then hold these alone)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bench_corpus.fetch(args.out)
    rows = []
    for case in CORPUS:
        if (args.half != "all" and case.half != args.half) or (args.only and case.name not in args.only):
            continue
        row = run_case(case, args.out, args.bits)
        if row is None:
            print(f"{case.name}: no MatMul with a constant 2-D weight", flush=True)
            continue
        rows.append(row)
        print(f"{case.name} ({case.half}) done", flush=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    text = render(rows)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
