"""int8 against float on the CPU EP, per corpus model, timed in pairs (issue 22, points 4 and 5).

quantize_yield.py reports the latency each `quantize` measured for itself (QNT004): 20 runs of each
model in turns inside the command, on whatever else the machine is doing. On sub-millisecond
models that column moved between sessions (cnn's static int8 read 2.01, 0.89 and 1.39 of float).
This script settles it for every model, from the files quantize_yield.py left:

    .venv/bin/python -m bench.suite.quantize_yield --half all      # first: writes bench/out/quantize_yield
    .venv/bin/python -m bench.suite.int8_latency [--half eval|dev|all] [--only NAME ...] [--threads 1]

For each model in the yield run's results.json, against the float model that run quantized:
- ortprep's static and dynamic int8: the written file, or where the gate refused, the refused file
  that --keep-failed kept beside it (marked "refused": what the gate turned away still has a speed);
- what `--auto` wrote where the plain command refused (a precision other than the one asked for);
- ORT's own files (quant_pre_process + quantize_static with its QDQ defaults; quantize_dynamic),
  the calls a user would otherwise make, in the same run.

Each file is timed against the float model on one input (the model's first calibration sample),
on the CPU EP with ``--threads`` intra-op threads (default 1: steady on a shared 2-core machine):
21 rounds of 5 to 40 runs of each in turns (which goes first alternates), the ratio of the two
medians per round, then the median of the 21 ratios with a distribution-free 95% interval
(common.paired_latency). Below 1: int8 is faster. Nothing else should run beside it.

Halves as quantize_yield.py's (journey_corpus.half_of); the evaluation half leads. Results:
OUT/results.json and OUT/table.md (OUT: bench/out/int8_latency).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import paired_latency
from bench.paths import OUT, ROOT

# (label, the yield run's command label: also its file's stem) in the table's order
FILES = [("ortprep static", "static"), ("ortprep dynamic", "dynamic"), ("ortprep static --auto", "static_auto"),
         ("ortprep dynamic --auto", "dynamic_auto"), ("ORT static", "peer_static"), ("ORT dynamic", "peer_dynamic")]


def first_sample(folder: Path) -> dict[str, np.ndarray] | None:
    samples = sorted((folder / "calib").glob("*.npz"))
    if not samples:
        return None
    with np.load(samples[0]) as data:
        return {name: np.ascontiguousarray(data[name]) for name in data.files}


def candidates(row: dict, folder: Path) -> list[tuple[str, dict, Path, str]]:
    """(label, the yield run's command record, file, state) for each int8 file that run left for
    ``row``'s model; state: "written" (with what --auto chose), or "refused" for the file the gate
    turned away (--keep-failed)."""
    found = []
    for label, command in FILES:
        record = (row.get("commands") or {}).get(command)
        if record is None:
            continue
        written, refused = folder / f"{command}.onnx", folder / f"{command}.failed.onnx"
        if record.get("written") and written.exists():
            chosen = (record.get("auto") or {}).get("chosen")
            found.append((label, record, written, f"written ({chosen})" if chosen else "written"))
        elif record.get("kept_failed") and refused.exists():
            found.append((label, record, refused, "refused"))
    return found


def run(args: argparse.Namespace) -> dict:
    saved = json.loads((args.yield_out / "results.json").read_text())
    rows = [r for r in saved["rows"] if not r.get("skipped") and r.get("quantizable")
            and (args.half == "all" or r.get("half") == args.half) and (not args.only or r["model"] in args.only)]
    rows.sort(key=lambda r: r.get("half") != "eval")
    results = []
    for row in rows:
        folder = args.yield_out / row["model"]
        feed = first_sample(folder)
        float_model = ROOT / row["float_model"]
        entry = {"model": row["model"], "half": row.get("half"), "float_model": row["float_model"], "files": []}
        if feed is None or not float_model.exists():
            entry["skipped"] = "no calibration sample or float model left by the yield run"
            results.append(entry)
            continue
        for label, command, path, state in candidates(row, folder):
            started = time.perf_counter()
            try:
                timed = paired_latency(float_model, path, feed, threads=args.threads)
            except (RuntimeError, OSError, ValueError) as error:  # ORT's errors: the file does not load or run
                timed = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
            record = {"label": label, "file": str(path.relative_to(ROOT)), "state": state, **timed,
                      # the ratio the quantize command measured for itself (QNT004's), for comparison
                      "quantize_reported": command.get("latency_ratio"),
                      "seconds": round(time.perf_counter() - started, 1)}
            entry["files"].append(record)
            shown = (
                f"{timed['latency_ratio']:.2f}x ({timed['latency_interval'][0]:.2f}-{timed['latency_interval'][1]:.2f})"
                if "latency_ratio" in timed
                else timed["error"]
            )
            print(f"  {row['model']} {label} [{state}]: {shown}", file=sys.stderr, flush=True)
        results.append(entry)
    return {"meta": {"threads": args.threads, "yield_run": saved.get("meta", {}).get("tree_at_start"),
                     "machine": f"{platform.processor() or platform.machine()}, {_cores()} cores",
                     "onnxruntime": _ort_version()}, "rows": results}


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def _cell(record: dict | None) -> str:
    if record is None:
        return "-"
    if "error" in record:
        return "fails: " + record["error"][:60].replace("|", "/")
    low, high = record["latency_interval"]
    mark = "" if record["state"].startswith("written") else " (refused)"
    return f"{record['latency_ratio']:.2f} ({low:.2f}-{high:.2f}){mark}"


def report(result: dict) -> str:
    meta = result["meta"]
    lines = [f"onnxruntime {meta['onnxruntime']}, {meta['machine']}, {meta['threads']} intra-op thread(s); "
             f"files from the yield run at {(meta['yield_run'] or {}).get('head')}.", "",
             "Each cell: the file's time over the float model's, median of 21 paired rounds (95% interval); "
             "below 1 is faster. (refused): the file the gate turned away (--keep-failed).", ""]
    columns = [label for label, _ in FILES]
    for half in ("eval", "dev"):
        rows = [r for r in result["rows"] if r.get("half") == half]
        if not rows:
            continue
        lines += [f"**{'Evaluation' if half == 'eval' else 'Development'} half**", "",
                  "| model | float ms | " + " | ".join(columns) + " | quantize's own figure (static / dynamic) |",
                  "|---|---:|" + "---|" * len(columns) + "---|"]
        for row in rows:
            if row.get("skipped"):
                lines.append(f"| {row['model']} | - | " + " | ".join("-" for _ in columns) + f" | {row['skipped']} |")
                continue
            by_label = {f["label"]: f for f in row["files"]}
            float_ms = next((f["float_ms"] for f in row["files"] if "float_ms" in f), None)
            own = " / ".join(
                "-"
                if by_label.get(k, {}).get("quantize_reported") is None
                else f"{by_label[k]['quantize_reported']:.2f}"
                for k in ("ortprep static", "ortprep dynamic")
            )
            lines.append(f"| {row['model']} | {'-' if float_ms is None else f'{float_ms:.3f}'} | "
                         + " | ".join(_cell(by_label.get(c)) for c in columns) + f" | {own} |")
        lines.append("")
        lines += summary(rows)
        lines.append("")
    return "\n".join(lines)


def summary(rows: list[dict]) -> list[str]:
    """Counts per file kind: faster (the whole interval below 1), slower (above 1), not told apart."""
    out = []
    for label, _ in FILES:
        faster = slower = even = 0
        for row in rows:
            record = next((f for f in row.get("files", []) if f["label"] == label and "latency_interval" in f), None)
            if record is None:
                continue
            low, high = record["latency_interval"]
            if high < 1.0:
                faster += 1
            elif low > 1.0:
                slower += 1
            else:
                even += 1
        if faster + slower + even:
            out.append(f"- {label}: faster than float on {faster}, slower on {slower}, not told apart on {even} "
                       f"(of {faster + slower + even} timed)")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--yield-out", type=Path, default=OUT / "quantize_yield")
    parser.add_argument("--out", type=Path, default=OUT / "int8_latency")
    parser.add_argument("--half", choices=["eval", "dev", "all"], default="all")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (0: ORT's default)")
    args = parser.parse_args()
    if not (args.yield_out / "results.json").exists():
        print(
            f"no {args.yield_out / 'results.json'}: run `python -m bench.suite.quantize_yield` first", file=sys.stderr
        )
        return 2
    started = time.perf_counter()
    result = run(args)
    result["meta"]["seconds"] = round(time.perf_counter() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    text = report(result)
    (args.out / "table.md").write_text(text)
    print(text)
    print(f"{len(result['rows'])} model(s) in {result['meta']['seconds']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
