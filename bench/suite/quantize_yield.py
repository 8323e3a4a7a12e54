"""How many of the corpus's models int8 quantization ships on the CPU, and whether what it ships
holds the application's decision on fresh inputs, beside ONNX Runtime's own calls on the same data.

Issue 22 sets the point: on the evaluation half, static and dynamic int8 each within the gate on at
least 90% of the quantizable models, no silent failure, and every refusal names the precision that
would pass. This script runs ortprep as a user types it, with the CPU as target (no --ep), on the
float model the journey quantizes (bench/out/journey: the fixed-shape file where the model has
dynamic inputs, else the built or shipped one):

    quantize FLOAT --static --calib CALIB --auto-exclude -o static.onnx --force --json
    quantize FLOAT --dynamic --eval CALIB --auto-exclude -o dynamic.onnx --force --json

(--auto-exclude on both since session 25: the search that ends at a pass, at the float model or at
--max-float-share is what a user asking for int8 within the gate types; the table gives the share
of the weights each written file keeps quantized. Since session 25 too, each command carries the
case's --metric, as the journey passes it: what a user who knows the model's application says; and
a built or sample case the journey has not run is built here as the journey builds it.)

Both carry --keep-failed: a refused result is kept beside the output (static.failed.onnx) and judged
on the fresh inputs like a written one, so that each refusal is measured as right (the refused file
is below the bar) or needless (it holds the bar: the gate turned away a file that would have served).
Where either exits non-zero, it runs again with --auto (and where --auto measures FP16 as passing,
the `ortprep convert ... --fp16` command its QNT017 prints runs too, as printed but for the output
path, and its file is judged), to learn whether some precision passes
and whether the refusal's own findings named it. The dynamic retry is given --calib CALIB in
place of --eval: with --eval alone --auto has no calibration data and so no static precision to
try. ORT's calls run on the same float model and calibration samples (bench_corpus.PEER:
quant_pre_process + quantize_static with its QDQ defaults; quantize_dynamic with its defaults).

Every file written, ortprep's and the peers', is judged on N fresh inputs on the CPU EP against the
float model: the application's decision (bench.referee.decide on the case's decision output) agrees or
not (referee.same_decision: equal, or for detections the same classes with boxes within 2 px), with
a 95% Wilson interval; the lowest cosine over outputs and samples (referee.compare); the
pooled norm ratio sqrt(sum ||q||^2) / sqrt(sum ||f||^2) of the decision output (for a model
without a decision, the output farthest from 1).

    .venv/bin/python -m bench.suite.quantize_yield [--half eval|dev|all] [--only NAME ...] [-n 100]
                                            [--calib-samples 24] [--journey bench/out/journey]
                                            [--out bench/out/quantize_yield]

Fixed rules, set before any run:

- Samples: 24 calibration samples per model (seed 1, one .npz each: the journey's calibration
  inputs; --calib-samples gives another count, as a probe of how much data the gate needs, and
  the table says it); N fresh inputs (default 100, seed 23, which no other script uses) judge the results.
- Bars: the application's, from referee.BARS (top-1 99%, CTC text 95%, argmax per position
  95%, speech at 0.5 98%). A model without a decision (detectors, a map, hidden states) is held
  to a lowest cosine of 0.99 over its outputs and the N inputs; the table also gives how many
  inputs reach 0.99 on every output.
- Silent failure: ortprep exit 0 (the plain command or its --auto retry) and the measured
  agreement below the bar (point estimate; the lowest cosine for a model without a decision), or a
  written file that fails to load or run. Wrong by the interval: the whole Wilson interval below
  the bar (models with a decision only). A peer never refuses, so a peer file below the bar, or
  one that fails to load or run, is a silent failure of the peer.
- Quantizable: a model with at least one Conv, MatMul, Gemm, ConvTranspose, LSTM, GRU or Attention
  node whose weight (input 1) is a float tensor (an initializer or a Constant node), and no
  QuantizeLinear, DynamicQuantizeLinear, ConvInteger, MatMulInteger, QLinearConv or QLinearMatMul
  node (not already quantized). Subgraphs count. Every model is run; the percentages count the
  quantizable ones.
- Halves: journey_corpus.half_of (the first byte of sha256(name), even: evaluation).

Each ortprep command and each peer call runs under runner.launch (its own peak RSS; a timeout of
900 s ends its process group and is recorded as its outcome). Results: OUT/results.json (written
after each model; --only keeps the other models' records of the last run) and OUT/table.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from bench.paths import OUT, ROOT
from bench.referee import BARS, below_bar, judge_outputs, refusal_class, wrong_by_interval
from bench.referee import COSINE_GATE as COSINE_BAR
from bench.suite import bench_corpus
from bench.suite.journey import write_samples
from bench.suite.quantize_yield_report import CALIB, CALIB_SEED, FRESH_SEED, TIMEOUT, remedies_named, report
from bench.suite.runner import launch, ortprep, tree_state
from bench.suite.journey_corpus import CORPUS, JourneyCase, build

WEIGHTED_OPS = {"Conv", "MatMul", "Gemm", "ConvTranspose", "LSTM", "GRU", "Attention"}
QUANTIZED_OPS = {
    "QuantizeLinear",
    "DynamicQuantizeLinear",
    "ConvInteger",
    "MatMulInteger",
    "QLinearConv",
    "QLinearMatMul",
}
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
# ---------------------------------------------------------------- the models

def float_model(case: JourneyCase, journey: Path) -> Path | None:
    """The float model the journey quantizes: fixed.onnx where it fixed the shapes, else the model
    it built in the case's folder, else the one shipped in a wheel (the journey's models/)."""
    kind, _, name = case.source.partition(":")
    if case.static:  # the journey fixes its shapes: its fixed.onnx, made here where the journey has not run
        candidates = [journey / case.name / "fixed.onnx"]
    else:
        candidates = [journey / "models" / name if kind == "wheel" else journey / case.name / f"{name}.onnx"]
    return next((path for path in candidates if path.exists()), None)


def build_float_model(case: JourneyCase, journey: Path) -> Path | None:
    """Where the journey has not run a case: its model built as the journey builds it
    (journey_corpus.build; a wheel's from bench_corpus.fetch, in the journey's models/), and its
    shapes fixed with the journey's own command (convert --fix-shape) where the journey fixes them.
    Until session 29 a wheel model whose shapes the journey fixes was quantized as shipped, with its
    dynamic shapes, on a machine where the journey had not run: the same case was another file
    from one machine to the next."""
    kind, _, name = case.source.partition(":")
    folder = journey / case.name
    if kind == "wheel" and not (journey / "models" / name).exists():
        return None
    try:
        built = build(case, folder, journey / "models")
    except Exception as error:  # noqa: BLE001 - one case that cannot be built is skipped, not the run
        print(f"  {case.name}: building it failed: {error}", file=sys.stderr, flush=True)
        return None
    if not case.static:
        return built
    fixed = folder / "fixed.onnx"
    shapes = [a for name, dims in case.static.items() for a in ("--fix-shape", f"{name}={','.join(map(str, dims))}")]
    sample = write_samples(case, folder / "independent", 1, seed=7)[0]
    entry = ortprep("convert", ["convert", built, *shapes, "--inputs", sample, "-o", fixed, "--force"], folder, TIMEOUT)
    if entry["exit"] == 0 and fixed.exists():
        return fixed
    if kind != "wheel":
        built.unlink(missing_ok=True)  # not left for float_model to take with its dynamic shapes next time
    return None


def _nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attribute.g)
            for sub in attribute.graphs:
                yield from _nodes(sub)


def quantizable(path: Path) -> dict:
    """The rule in the docstring: weighted nodes with a float weight, and no quantized node."""
    model = onnx.load(str(path), load_external_data=False)
    nodes = list(_nodes(model.graph))
    floats = {t.name for t in model.graph.initializer if t.data_type in FLOAT_TYPES}
    floats |= {n.output[0] for n in nodes if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"
               and n.attribute[0].t.data_type in FLOAT_TYPES}
    weighted = [n for n in nodes if n.op_type in WEIGHTED_OPS and len(n.input) > 1 and n.input[1] in floats]
    quantized = sorted({n.op_type for n in nodes if n.op_type in QUANTIZED_OPS})
    reason = ("already quantized: " + ", ".join(quantized)) if quantized else "" if weighted else "no weighted node"
    return {
        "quantizable": bool(weighted) and not quantized,
        "weighted_nodes": len(weighted),
        "quantized_ops": quantized,
        "why_not": reason,
    }


# ---------------------------------------------------------------- ortprep and the peers

def precision_name(label: str | None) -> str | None:
    """A short name for one of --auto's labels (auto.py's _label)."""
    if not label:
        return None
    if label.startswith("dynamic"):
        return "dynamic int8"
    found = re.match(r"static (\w+) activations, (\w+) weights( per channel)?", label)
    if not found:
        return label
    acts, weights, channel = found.groups()
    name = {"uint16": "A16", "uint8": "A8", "int8": "A8"}.get(acts, acts) + {"int16": "W16", "uint16": "W16"}.get(
        weights, "W8"
    )
    name = "static int8" if name == "A8W8" else name
    return name + (" per channel" if channel else "")


def command_record(entry: dict, target: Path) -> dict:
    """What one quantize command said: exit, the gate's figures, its refusal and where it points."""
    report = entry.get("report") or {}
    verify = report.get("verify") or {}
    findings = report.get("findings") or []
    errors = [f for f in findings if f.get("severity") == "error"]
    auto = report.get("auto")
    preset = report.get("preset") or {}
    return {
        "command": entry["command"],
        "exit": entry["exit"],
        "seconds": entry["seconds"],
        "peak_rss_mb": entry["peak_rss_mb"],
        "traceback": entry.get("traceback"),
        "stderr_tail": entry.get("stderr_tail"),
        "written": target.exists(),
        "file": str(target.relative_to(ROOT)),
        "mode": report.get("mode"),
        # NAME.failed.onnx beside the output (model.failed_path), named from the target: the reported path
        # may run through a symlink that the target's does not
        "kept_failed": str(target.with_name(f"{target.stem}.failed.onnx").relative_to(ROOT))
        if report.get("kept_failed")
        else None,
        "activation_type": preset.get("activation_type"),
        "weight_type": preset.get("weight_type"),
        "gate_cosine": verify.get("cosine"),
        "gate_passed": verify.get("passed"),
        "latency_ratio": verify.get("latency_ratio"),
        "decisions": [
            {
                "output": o.get("name"),
                **{
                    k: (o.get("decision") or {}).get(k)
                    for k in (
                        "kind",
                        "agreement",
                        "expected_agreement",
                        "required",
                        "gated",
                        "passed",
                        "ranking",
                        "region_agreement",
                        "required_regions",
                        "scene_agreement",
                        "expected_scene_agreement",
                        "required_scenes",
                    )
                },
            }
            for o in verify.get("outputs") or []
            if o.get("decision")
        ],
        "excluded_nodes": len(report.get("excluded_nodes") or []),
        # the share of the weight values stored as integers (what the nodes kept float cost)
        "weight_share": report.get("quantized_weight_share"),
        "error_codes": sorted({f["code"] for f in errors}),
        "findings": [{k: f.get(k) for k in ("code", "severity", "message", "fix")} for f in findings],
        "names": remedies_named(findings),
        "auto": None
        if auto is None
        else {
            "tried": [
                {k: t.get(k) for k in ("label", "passed", "cosine", "latency_ratio", "codes")}
                for t in auto.get("tried") or []
            ],
            "chosen": auto.get("chosen"),
            "chosen_name": precision_name(auto.get("chosen")),
        },
    }


def peer_run(kind: str, source: Path, target: Path, calib: list[Path], folder: Path) -> dict:
    """ORT's calls (bench_corpus.PEER) under journey.launch: its time, peak RSS, error."""
    request = json.dumps({"kind": kind, "source": str(source), "target": str(target), "data": [str(p) for p in calib]})
    stdout, stderr = folder / f"peer_{kind}.log", folder / f"peer_{kind}.stderr"
    code, seconds, rss = launch([sys.executable, "-c", bench_corpus.PEER, request], stdout, stderr, TIMEOUT, cwd=folder)
    error = None
    if code != 0:
        lines = [
            line
            for line in (stderr.read_text(errors="replace") if stderr.exists() else "").splitlines()
            if line.strip()
        ]
        error = "timed out" if code == "timeout" else (lines[-1] if lines else f"exit {code}")[:300]
    for stale in folder.glob(f"{target.name}.pre.onnx*"):  # quant_pre_process's intermediate file
        stale.unlink()
    return {
        "exit": code,
        "seconds": round(seconds, 1),
        "peak_rss_mb": round(rss),
        "error": error,
        "written": target.exists(),
        "file": str(target.relative_to(ROOT)),
    }


# ---------------------------------------------------------------- judging a file on fresh inputs

def cpu_session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # the machine is shared; one thread keeps the runs comparable
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_all(session, feeds: list[dict]) -> dict[int, list[np.ndarray]]:
    names = {i.name for i in session.get_inputs()}
    return {index: session.run(None, {k: v for k, v in feed.items() if k in names}) for index, feed in enumerate(feeds)}


def judge(case: JourneyCase, path: Path, reference: dict[int, list[np.ndarray]], feeds: list[dict],
          session=None) -> dict:
    """The file at ``path`` against the float model's outputs ``reference`` on ``feeds``
    (``session``: one already open on it, for a caller judging it batch by batch)."""
    if session is None:
        try:
            session = cpu_session(path)
        except Exception as error:  # noqa: BLE001 - a file that does not load is the finding
            return {"loads": False, "error": " ".join(str(error).split())[:300]}
    try:
        outputs = run_all(session, feeds)
    except Exception as error:  # noqa: BLE001
        return {"loads": True, "runs": False, "error": " ".join(str(error).split())[:300]}
    return judge_outputs(case, reference, outputs, len(feeds))


# ---------------------------------------------------------------- one model

def run_case(case: JourneyCase, journey: Path, out: Path, count: int, calib_count: int = CALIB) -> dict:
    started = time.perf_counter()
    row: dict = {"model": case.name, "half": case.half, "decision": case.decision,
                 "bar": BARS[case.decision] if case.decision else COSINE_BAR,
                 "tree": tree_state()}  # others work in the same tree: the code this model's commands ran
    source = float_model(case, journey) or build_float_model(case, journey)
    if source is None:
        print(f"  {case.name}: no float model in {journey}; skipped", file=sys.stderr, flush=True)
        return {**row, "skipped": f"no float model in {journey.relative_to(ROOT)}/{case.name}"}
    folder = out / case.name
    shutil.rmtree(folder, ignore_errors=True)  # this script's own folder: a stale file must not be judged
    folder.mkdir(parents=True)
    row.update(float_model=str(source.relative_to(ROOT)), **quantizable(source))
    calib = write_samples(case, folder / "calib", calib_count, seed=CALIB_SEED)
    rng = np.random.default_rng(FRESH_SEED)
    feeds = [{k: np.ascontiguousarray(v) for k, v in case.inputs(rng, i).items()} for i in range(count)]
    float_session = cpu_session(source)
    reference = run_all(float_session, feeds)
    row["decision_output_name"] = float_session.get_outputs()[case.decision_output].name
    print(
        f"  {case.name}: float model {row['float_model']}, quantizable {row['quantizable']}, {count} fresh inputs run",
        file=sys.stderr,
        flush=True,
    )

    commands: dict[str, dict] = {}
    calib_dir = folder / "calib"
    # what the application reads, as the journey passes it (a user who knows the model says it)
    metric_args = [a for name, kind in case.metrics.items() for a in ("--metric", f"{name}={kind}")]
    plain = {"static": ["--static", "--calib", calib_dir, "--auto-exclude", "--keep-failed", *metric_args],
             "dynamic": ["--dynamic", "--eval", calib_dir, "--auto-exclude", "--keep-failed", *metric_args]}
    retry = {"static": ["--static", "--calib", calib_dir, "--auto-exclude", "--auto", *metric_args],
             "dynamic": ["--dynamic", "--calib", calib_dir, "--auto-exclude", "--auto", *metric_args]}
    for kind in ("static", "dynamic"):
        target = folder / f"{kind}.onnx"
        entry = ortprep(kind, ["quantize", source, *plain[kind], "-o", target, "--force"], folder, TIMEOUT)
        commands[kind] = command_record(entry, target)
        print(f"  {case.name} {kind}: exit {entry['exit']} in {entry['seconds']} s", file=sys.stderr, flush=True)
        if entry["exit"] != 0:
            target = folder / f"{kind}_auto.onnx"
            entry = ortprep(
                f"{kind}_auto", ["quantize", source, *retry[kind], "-o", target, "--force"], folder, TIMEOUT
            )
            commands[f"{kind}_auto"] = command_record(entry, target)
            print(f"  {case.name} {kind} --auto: exit {entry['exit']} in {entry['seconds']} s, chose "
                  f"{(commands[f'{kind}_auto']['auto'] or {}).get('chosen')}", file=sys.stderr, flush=True)
            probe = (((entry.get("report") or {}).get("auto") or {}).get("fp16") or {})
            if entry["exit"] == 1 and probe.get("passed"):
                # --auto measured FP16 as passing and printed a convert command: typed as printed, then
                # judged like every file written
                target = folder / f"{kind}_fp16.onnx"
                printed = shlex.split(probe["command"])[2:]  # after "ortprep convert"
                at = printed.index("-o")
                printed[at + 1] = str(target)  # this script's folder, not the model's
                entry = ortprep(f"{kind}_fp16", ["convert", *printed, "--force"], folder, TIMEOUT)
                commands[f"{kind}_fp16"] = command_record(entry, target)
                print(
                    f"  {case.name} {kind} FP16 as printed: exit {entry['exit']} in {entry['seconds']} s",
                    file=sys.stderr,
                    flush=True,
                )
        target = folder / f"peer_{kind}.onnx"
        commands[f"peer_{kind}"] = peer_run(kind, source, target, calib, folder)
        print(
            f"  {case.name} peer {kind}: exit {commands[f'peer_{kind}']['exit']} in "
            f"{commands[f'peer_{kind}']['seconds']} s",
            file=sys.stderr,
            flush=True,
        )

    for label, record in commands.items():
        record["judged"] = judge(case, ROOT / record["file"], reference, feeds) if record["written"] else None
        record["below_bar"] = below_bar(case, record["judged"])
        kept = ROOT / record["kept_failed"] if record.get("kept_failed") else None
        if record.get("exit") not in (0, None) and kept is not None and kept.exists():
            # the refused file the gate turned away, measured as a written one is
            judged = judge(case, kept, reference, feeds)
            record["refused_judged"] = judged
            record["refusal"] = refusal_class(case, judged, record["error_codes"])
        record["wrong_by_interval"] = wrong_by_interval(case, record["judged"])
        if label.startswith("peer"):  # a peer never refuses: a file below the bar is its silent failure
            record["silent_failure"] = bool(record["written"] and record["below_bar"])
        else:
            record["silent_failure"] = record["exit"] == 0 and (not record["written"] or bool(record["below_bar"]))
        if record["judged"]:
            j = record["judged"]
            print(
                f"  {case.name} judged {label}: "
                + (
                    f"{j['agree']}/{j['samples']}, lowest cosine {j['lowest_cosine']}"
                    if j.get("runs")
                    else j.get("error")
                ),
                file=sys.stderr,
                flush=True,
            )
    row["commands"] = commands
    row["tree_after"] = tree_state()
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def versions() -> dict[str, str]:
    import importlib.metadata

    found = {}
    for name in ("onnx", "onnxruntime", "numpy"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--journey", type=Path, default=OUT / "journey")
    parser.add_argument("--out", type=Path, default=OUT / "quantize_yield")
    parser.add_argument("--only", nargs="*", help="model names (the others' records of the last run are kept)")
    parser.add_argument("--half", choices=["eval", "dev", "all"], default="all")
    parser.add_argument("-n", type=int, default=100, help="fresh inputs per model (default 100)")
    parser.add_argument("--calib-samples", type=int, default=CALIB,
                        help=f"calibration samples per model (default {CALIB}); static holds back every fifth, "
                             "plain dynamic (--eval) is judged on all, its --auto retry (--calib) holds back a share")
    parser.add_argument("--report-only", action="store_true", help="write table.md from the last run's results.json")
    args = parser.parse_args()
    if args.report_only:
        saved = json.loads((args.out / "results.json").read_text())
        for row in saved["rows"]:  # a run before the share was recorded: read it from the command's own report
            for label, record in (row.get("commands") or {}).items():
                answer = args.out / row["model"] / f"{label}.json"
                if "weight_share" not in record and not label.startswith("peer") and answer.exists():
                    try:
                        record["weight_share"] = json.loads(answer.read_text()).get("quantized_weight_share")
                    except ValueError:
                        pass
        text = report(saved["rows"], saved["meta"])
        (args.out / "table.md").write_text(text)
        print(text)
        return 0
    known = {case.name for case in CORPUS}
    unknown = set(args.only or []) - known
    if unknown:
        parser.error(f"unknown model(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"versions": versions(), "tree_at_start": tree_state(), "fresh": args.n, "calib": args.calib_samples,
            "timeout_s": TIMEOUT}
    saved = args.out / "results.json"
    rows: dict[str, dict] = {}
    if saved.exists() and (args.only or args.half != "all"):
        last = json.loads(saved.read_text())
        if last.get("meta", {}).get("calib", CALIB) != args.calib_samples:  # one count per table
            parser.error(f"{saved} holds a run with {last['meta'].get('calib', CALIB)} calibration samples; "
                         f"--calib-samples {args.calib_samples} needs another --out")
        rows = {row["model"]: row for row in last.get("rows", []) if row["model"] in known}
    chosen = [
        c for c in CORPUS if (not args.only or c.name in args.only) and (args.half == "all" or c.half == args.half)
    ]
    chosen.sort(key=lambda c: c.half != "eval")  # the evaluation half first
    started = time.perf_counter()
    for case in chosen:
        print(f"{case.name} ({case.half})", file=sys.stderr, flush=True)
        rows[case.name] = run_case(case, args.journey, args.out, args.n, args.calib_samples)
        saved.write_text(json.dumps({"meta": meta, "rows": list(rows.values())}, indent=1, default=str))
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["tree_at_end"] = tree_state()
    saved.write_text(json.dumps({"meta": meta, "rows": list(rows.values())}, indent=1, default=str))
    text = report(list(rows.values()), meta)
    (args.out / "table.md").write_text(text)
    print(text)
    print(f"{len(chosen)} model(s) in {meta['seconds']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
