"""quantize: static (real calibration data) or dynamic, with EP presets and an accuracy verdict.

The quantizer (onnxruntime.quantization) runs in a child process whose working directory is a
private temp folder: a crash stays there, and so does every temp file. Calibration streams its
samples. A share of the samples is held back and both models run on it; when the gate fails, the
nodes where the error starts are named, and --auto-exclude keeps them in float and tries again.
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, TensorProto

from ortprep.eps.registry import resolve_ep
from ortprep.errors import UsageError
from ortprep.findings import Finding
from ortprep.model import ModelHandle, iter_graphs
from ortprep.report import StepResult
from ortprep.runtime.calibration import CalibrationSet, discover, split
from ortprep.runtime.children import run_child
from ortprep.runtime.compare import compare_arrays
from ortprep.runtime.feeds import input_specs
from ortprep.runtime.isolated import RunOutcome, run_isolated
from ortprep.steps.base import ProgressCallback, Step, StepContext, output_path
from ortprep.steps.options import QuantizeOptions
from ortprep.transforms.fp16 import ensure_node_names
from ortprep.transforms.verify import float_intermediates, model_bytes, save_temp

log = logging.getLogger(__name__)

SCHEMA = "ortprep.quantize/1"
LATENCY_RUNS = 10
QUANT_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
TIMEOUT = 1800.0


@dataclass
class Evaluation:
    cosine: float | None
    max_abs_diff: float | None
    top1_agreement: float | None
    latency_ratio: float | None
    float_latency_ms: float | None
    quant_latency_ms: float | None
    passed: bool
    outputs: list[dict] = field(default_factory=list)
    error: str | None = None

    def to_record(self) -> dict:
        return {
            "cosine": self.cosine,
            "max_abs_diff": self.max_abs_diff,
            "top1_agreement": self.top1_agreement,
            "latency_ratio": self.latency_ratio,
            "float_latency_ms": self.float_latency_ms,
            "quant_latency_ms": self.quant_latency_ms,
            "passed": self.passed,
            "outputs": self.outputs,
            "error": self.error,
        }


def resolve_settings(options: QuantizeOptions) -> dict[str, Any]:
    """The EP's preset with the explicit overrides applied."""
    spec = resolve_ep(options.ep)
    preset = spec.quantize
    if preset is None:
        raise UsageError(f"no quantization preset for '{options.ep}'")
    settings = {
        "preset": spec.name,
        "preset_reason": preset.reason,
        "preset_source": preset.source,
        "requires_static_shapes": preset.requires_static_shapes,
        "format": options.format or preset.format,
        "per_channel": preset.per_channel if options.per_channel is None else options.per_channel,
        "weight_type": options.weight_type or preset.weight_type,
        "activation_type": options.activation_type or preset.activation_type,
        "method": options.method,
        "extra_options": {"ActivationSymmetric": True, "WeightSymmetric": True} if preset.symmetric else {},
        "op_types": None,
    }
    if options.mode == "dynamic":
        if settings["format"] == "qdq" and options.format is None:
            settings["format"] = "qoperator"  # dynamic quantization writes QOperator-style ops
        if preset.dynamic_op_types:
            # e.g. ConvInteger has no GPU kernels: keep dynamic quantization to MatMul-style ops.
            settings["op_types"] = list(preset.dynamic_op_types)
    return settings


def constants_to_initializers(proto: ModelProto) -> int:
    """Weights held in Constant nodes become initializers (ORT's quantizer wants initializers)."""
    moved = 0
    for _, graph in iter_graphs(proto.graph):
        keep = []
        for node in graph.node:
            value = next((a for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and value is not None and len(node.attribute) == 1:
                tensor = TensorProto()
                tensor.CopyFrom(value.t)
                tensor.name = node.output[0]
                graph.initializer.append(tensor)
                moved += 1
            else:
                keep.append(node)
        if len(keep) != len(graph.node):
            del graph.node[:]
            graph.node.extend(keep)
    return moved


def quantization_stats(proto: ModelProto) -> dict[str, int]:
    """Ops computed on quantized data, and quantized weights, over all graphs."""
    dq_outputs = set()
    ops = weights = 0
    nodes = [n for _, g in iter_graphs(proto.graph) for n in g.node]
    for node in nodes:
        if node.op_type == "DequantizeLinear":
            dq_outputs.update(node.output)
    for node in nodes:
        if node.op_type in QUANT_OPS:
            continue
        if node.op_type.startswith("QLinear") or node.op_type.endswith("Integer") or any(i in dq_outputs for i in node.input):
            ops += 1
    for _, graph in iter_graphs(proto.graph):
        weights += sum(1 for t in graph.initializer if t.data_type in (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16, TensorProto.INT4, TensorProto.UINT4) and len(t.dims) >= 1 and np.prod(t.dims) > 1)
    return {"quantized_ops": ops, "quantized_weights": weights}


def _run_quantizer(workdir: Path, model: Path, output: Path, mode: str, settings: dict, calibration: CalibrationSet | None,
                   indices: list[int], exclude_nodes: list[str], exclude_ops: tuple[str, ...], big: bool,
                   progress: ProgressCallback | None = None) -> tuple[bool, str]:
    op_types = settings["op_types"]
    if exclude_ops:
        if op_types is None:
            from onnxruntime.quantization.registry import (
                IntegerOpsRegistry,
                QDQRegistry,
                QLinearOpsRegistry,
            )

            registry = IntegerOpsRegistry if mode == "dynamic" else (QDQRegistry if settings["format"] == "qdq" else QLinearOpsRegistry)
            op_types = list(registry)
        op_types = [op for op in op_types if op not in exclude_ops]
    request = {
        "workdir": str(workdir),
        "model": str(model),
        "output": str(output),
        "mode": mode,
        "status": str(workdir / "quantize-status.json"),
        "calibration": calibration.to_json() if calibration else None,
        "calibration_indices": indices,
        "options": {**settings, "op_types": op_types, "exclude_nodes": exclude_nodes, "external_data": big},
        "progress": str(workdir / "quantize-progress.txt"),
    }
    request_path = workdir / "quantize-request.json"
    request_path.write_text(json.dumps(request), encoding="utf-8")

    def poll() -> None:
        done_total = _read_progress(Path(request["progress"])) if progress is not None else None
        if done_total:
            progress("calibrating", *done_total)

    child = run_child("ortprep.runtime.quantize_worker", request_path, timeout=TIMEOUT, cwd=workdir, poll=poll,
                      stderr_file=workdir / "quantize-stderr.txt")
    if child.timed_out:
        return False, f"the quantizer did not finish within {TIMEOUT:.0f} s"
    poll()
    stderr_text = child.stderr
    status_path = workdir / "quantize-status.json"
    if child.returncode != 0 or not status_path.exists():
        return False, f"the quantizer's process died ({child.how_it_died()}): {stderr_text.strip()[-300:]}"
    status = json.loads(status_path.read_text(encoding="utf-8"))
    status_path.unlink()
    if not status["ok"]:
        log.debug("quantizer traceback:\n%s", status.get("traceback"))
        return False, f"{status.get('type')}: {status.get('error')}"
    return True, ""


def _read_progress(path: Path) -> tuple[int, int] | None:
    try:
        done, total = path.read_text(encoding="utf-8").split()
        return int(done), int(total)
    except (OSError, ValueError):
        return None


def _preprocess(workdir: Path, source: Path, report: StepResult) -> tuple[Path, str]:
    """ORT's quantization pre-processing (shape inference, graph optimization), in a child."""
    target = workdir / "preprocessed.onnx"
    try:
        import sympy  # noqa: F401 - ORT's symbolic shape inference needs it

        symbolic = True
    except ImportError:
        symbolic = False
    request = {
        "workdir": str(workdir),
        "model": str(source),
        "output": str(target),
        "mode": "preprocess",
        "status": str(workdir / "preprocess-status.json"),
        "options": {"symbolic": symbolic, "external_data": source.with_name(source.name + ".data").exists()},
    }
    request_path = workdir / "preprocess-request.json"
    request_path.write_text(json.dumps(request), encoding="utf-8")
    child = run_child("ortprep.runtime.quantize_worker", request_path, timeout=TIMEOUT, cwd=workdir)
    status = json.loads(Path(request["status"]).read_text(encoding="utf-8")) if Path(request["status"]).exists() else {}
    if not status.get("ok") or not target.exists():
        reason = status.get("error") or f"its process died ({child.how_it_died()})"
        report.add(Finding.of("QNT007", f"pre-processing failed ({reason}); quantizing the model as it is",
                              fix="pass --no-preprocess to skip it, or simplify the model first"))
        return source, "skipped (failed)"
    detail = "ORT optimization and onnx shape inference"
    if "Optimization Failed" in child.stderr:
        # quant_pre_process swallows this failure and writes the model unoptimized.
        report.add(Finding.of("QNT007", "pre-processing could not run ORT's optimizations on this model; quantizing it "
                              "with shape inference only", fix="check the model: ortprep check MODEL --ep cpu"))
        detail = "onnx shape inference only (ORT optimization failed)"
    if not symbolic:
        detail += " (symbolic shape inference skipped: it needs sympy)"
    return target, detail


def _top1(reference: np.ndarray, candidate: np.ndarray) -> float | None:
    if reference.ndim < 2 or reference.shape[-1] < 2 or reference.dtype.kind != "f":
        return None
    return float(np.mean(np.argmax(reference, axis=-1) == np.argmax(candidate, axis=-1)))


def evaluate(float_model: Path, quant_model: Path, feeds: list[dict[str, np.ndarray]], min_cosine: float,
             cache: dict[str, RunOutcome] | None = None) -> Evaluation:
    """Run both models on ``feeds`` and compare. ``cache`` keeps the float model's run between
    rounds (only the quantized model changes)."""
    cache = {} if cache is None else cache
    if "evaluation" not in cache:
        cache["evaluation"] = run_isolated(float_model, feeds, latency_runs=LATENCY_RUNS)
    reference = cache["evaluation"]
    candidate = run_isolated(quant_model, feeds, latency_runs=LATENCY_RUNS)
    if not reference.ok or not candidate.ok:
        which = "float" if not reference.ok else "quantized"
        message = reference.message if not reference.ok else candidate.message
        return Evaluation(None, None, None, None, None, None, False, error=f"the {which} model failed: {message}")
    per_output: dict[str, list] = {}
    for ref_sample, cand_sample in zip(reference.samples, candidate.samples):
        for name, value in ref_sample.items():
            diff = compare_arrays(name, value, cand_sample[name])
            per_output.setdefault(name, []).append((diff, _top1(value, cand_sample[name])))
    outputs = []
    for name, rows in per_output.items():
        cosines = [d.cosine for d, _ in rows if d.cosine is not None]
        tops = [t for _, t in rows if t is not None]
        outputs.append({
            "name": name,
            "cosine": min(cosines) if cosines else None,
            "max_abs_diff": max((d.max_abs_diff for d, _ in rows if d.max_abs_diff is not None), default=None),
            "top1_agreement": statistics.fmean(tops) if tops else None,
        })
    cosines = [o["cosine"] for o in outputs if o["cosine"] is not None]
    tops = [o["top1_agreement"] for o in outputs if o["top1_agreement"] is not None]
    float_ms = statistics.median(reference.latency_ms) if reference.latency_ms else None
    quant_ms = statistics.median(candidate.latency_ms) if candidate.latency_ms else None
    cosine = min(cosines) if cosines else None
    return Evaluation(
        cosine=cosine,
        max_abs_diff=max((o["max_abs_diff"] for o in outputs if o["max_abs_diff"] is not None), default=None),
        top1_agreement=min(tops) if tops else None,
        latency_ratio=round(quant_ms / float_ms, 3) if float_ms and quant_ms else None,
        float_latency_ms=float_ms,
        quant_latency_ms=quant_ms,
        passed=cosine is not None and cosine >= min_cosine,
        outputs=outputs,
    )


def worst_nodes(float_model: Path, quant_model: Path, feeds: dict[str, np.ndarray], excluded: set[str], limit: int = 5,
                cache: dict[str, RunOutcome] | None = None) -> list[tuple[str, str, float]]:
    """(node, op, cosine) of the nodes where the quantization error starts, worst first.

    Every tensor both models compute is compared. A node of the quantized model is blamed when
    its output is worse than what it reads (its inputs traced back through Q/DQ pairs to the
    tensors they quantize): the error starts there. The quantizer may fold nodes (a Relu into
    the preceding MatMul's Q/DQ range), so blame goes to the node that produces the tensor in
    the quantized model."""
    float_proto = onnx.load(str(float_model), load_external_data=False)
    quant_proto = onnx.load(str(quant_model), load_external_data=False)
    names = float_intermediates(float_proto)
    source_of = {}  # DQ/Q output -> the tensor it quantizes
    dequantized = {}  # tensor -> the DQ output its consumers read
    for node in quant_proto.graph.node:
        if node.op_type in QUANT_OPS and node.input:
            source_of[node.output[0]] = source_of.get(node.input[0], node.input[0])
            if node.op_type == "DequantizeLinear":
                dequantized[source_of[node.output[0]]] = node.output[0]
    # Compare what consumers read: the dequantized value where the tensor is quantized (a Relu
    # folded into a Q/DQ range only shows there).
    seen = {name: dequantized.get(name, name) for name in names}
    cache = {} if cache is None else cache
    if "intermediates" not in cache:
        cache["intermediates"] = run_isolated(_with_outputs(float_model, names), feeds)
    reference = cache["intermediates"]
    candidate = run_isolated(_with_outputs(quant_model, list(seen.values())), feeds)
    if not reference.ok or not candidate.ok:
        return []
    quality = {}
    for name, value in reference.outputs.items():
        other = candidate.outputs.get(seen.get(name, name))
        if other is not None and value.dtype.kind == "f":
            diff = compare_arrays(name, value, other.astype(value.dtype))
            quality[name] = diff.cosine if diff.cosine is not None else 0.0
    graph_inputs = {v.name for v in quant_proto.graph.input}

    def input_quality(name: str) -> float | None:
        original = source_of.get(name, name)
        if original in quality:
            return quality[original]
        return 1.0 if original in graph_inputs else None

    ranked = []
    for node in quant_proto.graph.node:
        if node.name in excluded or node.op_type in QUANT_OPS:
            continue
        outs = [quality[o] for o in node.output if o in quality]
        if not outs:
            continue
        ins = [q for q in (input_quality(i) for i in node.input) if q is not None]
        introduced = (min(ins) if ins else 1.0) - min(outs)
        if introduced > 1e-4:
            ranked.append((introduced, node.name, node.op_type, min(outs)))
    if not ranked:
        # The error shows at nodes already kept in float: what produces their inputs goes too.
        producers = {out: node for node in quant_proto.graph.node for out in node.output}
        for node in quant_proto.graph.node:
            outs = [quality[o] for o in node.output if o in quality]
            if node.name not in excluded or not outs or min(outs) >= 0.9999:
                continue
            for name in node.input:
                upstream = producers.get(name)
                while upstream is not None and upstream.op_type in QUANT_OPS:
                    upstream = producers.get(upstream.input[0])
                if upstream is not None and upstream.name not in excluded:
                    ranked.append((1.0 - min(outs), upstream.name, upstream.op_type, min(outs)))
    ranked.sort(reverse=True)
    return [(name, op, cosine) for _, name, op, cosine in ranked[:limit]]


def _with_outputs(model: Path, names: list[str]) -> Path:
    proto = onnx.load(str(model))
    present = {v.name for v in proto.graph.output}
    produced = {o for n in proto.graph.node for o in n.output}
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in present and n in produced)
    return save_temp(proto, model.parent, model.stem + ".exposed.onnx")


def latency_finding(evaluation: Evaluation | None) -> Finding | None:
    """QNT004 when the quantized model ran slower than the float one on this CPU."""
    if evaluation is None or evaluation.latency_ratio is None or evaluation.latency_ratio <= 1.0:
        return None
    return Finding.of(
        "QNT004",
        f"the quantized model is slower than the float one on this CPU "
        f"({evaluation.quant_latency_ms:.3f} ms vs {evaluation.float_latency_ms:.3f} ms per run)",
        fix="expected without VNNI/AVX-512 int8 kernels, for tiny models, or with ConvInteger; measure on the target EP",
    )


@dataclass
class DataPlan:
    """Which samples calibrate and which evaluate."""

    calibration: CalibrationSet | None
    calib_indices: list[int]
    eval_set: CalibrationSet | None
    eval_indices: list[int]


def plan_data(handle: ModelHandle, options: QuantizeOptions, settings: dict[str, Any], report: StepResult) -> DataPlan:
    """Check the data against the model (names, shapes, dtypes) before any work; split it."""
    specs = input_specs(handle.proto)
    if settings["requires_static_shapes"]:
        dynamic = [s.name for s in specs if s.shape is None or any(not isinstance(d, int) or d <= 0 for d in s.shape)]
        if dynamic:
            raise UsageError(
                f"the {settings['preset']} preset needs static shapes; dynamic inputs: {', '.join(dynamic)}",
                hint="fix them first: ortprep convert MODEL --fix-dim NAME=VALUE -o MODEL.static.onnx",
            )
    image = options.image()
    calibration = discover(str(options.calib), specs, image=image) if options.calib else None
    evaluation_set = discover(str(options.eval), specs, image=image) if options.eval else None
    if calibration is not None and calibration.kind == "random":
        used_for = "calibration" if options.mode == "static" else "the evaluation"
        report.add(Finding.of("QNT001", f"{used_for} used random data: the result says little about real inputs",
                              fix="pass real samples with --calib DIR"))
    calib_indices: list[int] = []
    eval_indices: list[int] = []
    if calibration is not None:
        count = min(calibration.count, options.samples) if options.samples else calibration.count
        if options.mode == "dynamic":
            eval_indices = list(range(count))  # dynamic quantization calibrates nothing: all samples evaluate
        elif evaluation_set is None:
            calib_indices, eval_indices = split(count)
        else:
            calib_indices = list(range(count))
    if evaluation_set is not None:
        return DataPlan(calibration, calib_indices, evaluation_set, list(range(evaluation_set.count)))
    return DataPlan(calibration, calib_indices, calibration, eval_indices)


@dataclass
class Rounds:
    """What the quantize / evaluate / exclude rounds ended with."""

    evaluation: Evaluation | None
    excluded: list[str]
    auto_excluded: list[dict]
    failure: str | None = None  # ORT's quantizer raised or died: its whole message


def _quantize_rounds(workdir: Path, float_path: Path, result_path: Path, options: QuantizeOptions, settings: dict,
                     plan: DataPlan, eval_feeds: list, float_runs: dict, big: bool,
                     progress: ProgressCallback | None) -> Rounds:
    """Quantize, evaluate on the held-back samples, and with --auto-exclude keep the worst nodes in
    float and try again (at most ``max_exclude_rounds`` more times)."""
    excluded: list[str] = list(options.exclude_nodes)
    auto_excluded: list[dict] = []
    evaluation: Evaluation | None = None
    for round_number in range(1, options.max_exclude_rounds + 2):
        ok, error = _run_quantizer(workdir, float_path, result_path, options.mode, settings, plan.calibration,
                                   plan.calib_indices, excluded, options.exclude_ops, big, progress)
        if not ok:
            return Rounds(evaluation, excluded, auto_excluded, failure=error)
        if not eval_feeds:
            break
        if progress is not None:
            progress("evaluating", 0, 1)
        evaluation = evaluate(float_path, result_path, eval_feeds, options.min_cosine, float_runs)
        if progress is not None:
            progress("evaluating", 1, 1)
        if evaluation.passed or not options.auto_exclude or round_number > options.max_exclude_rounds:
            break
        culprits = worst_nodes(float_path, result_path, eval_feeds[0], set(excluded), limit=2, cache=float_runs)
        if not culprits:
            break
        for name, op_type, cosine in culprits:
            excluded.append(name)
            auto_excluded.append({"name": name, "op_type": op_type, "cosine": cosine, "round": round_number})
    return Rounds(evaluation, excluded, auto_excluded)


def quantize_model(handle: ModelHandle, dest: Path, options: QuantizeOptions, *, force: bool = False,
                   progress: ProgressCallback | None = None) -> StepResult:
    """Quantize ``handle``'s model and write ``dest`` when the accuracy gate passes.
    ``progress(stage, done, total)`` is called during calibration and evaluation."""
    settings = resolve_settings(options)
    report = StepResult(step="quantize", schema=SCHEMA)
    plan = plan_data(handle, options, settings, report)
    calibration, calib_indices, eval_set, eval_indices = plan.calibration, plan.calib_indices, plan.eval_set, plan.eval_indices

    size_before = model_bytes(handle.path)
    handle.load_weights()
    with tempfile.TemporaryDirectory(prefix="ortprep-quantize-") as tmp:
        workdir = Path(tmp)
        proto = onnx.ModelProto()
        proto.CopyFrom(handle.proto)
        moved = constants_to_initializers(proto)
        if moved:
            report.add(Finding.of("QNT009", f"{moved} weight(s) held in Constant nodes became initializers so they can be quantized",
                                  fix="nothing to do"))
        ensure_node_names(proto)
        big = handle.has_external_data()
        float_path = save_temp(proto, workdir, "float.onnx")
        del proto
        preprocess_detail = "skipped (--no-preprocess)"
        if options.preprocess:
            float_path, preprocess_detail = _preprocess(workdir, float_path, report)
        result_path = workdir / "quantized.onnx"
        eval_feeds = list(eval_set.samples(eval_indices)) if (eval_set is not None and options.verify) else []
        float_runs: dict[str, RunOutcome] = {}
        rounds = _quantize_rounds(workdir, float_path, result_path, options, settings, plan, eval_feeds, float_runs, big,
                                  progress)
        evaluation, excluded, auto_excluded = rounds.evaluation, rounds.excluded, rounds.auto_excluded
        if rounds.failure is not None:
            report.add(Finding.of("QNT008", f"ONNX Runtime's quantizer failed on this model: {rounds.failure}",
                                  fix="--exclude-op / --exclude-node for the op it names, --no-preprocess, or check the "
                                  "model first: ortprep check MODEL --ep cpu"))
            report.data = {"input": str(handle.path), "output": None, "mode": options.mode, "format": settings["format"],
                           "preset": {"ep": settings["preset"], "reason": settings["preset_reason"],
                                      "activation_type": settings["activation_type"], "weight_type": settings["weight_type"],
                                      "per_channel": settings["per_channel"], "method": settings["method"],
                                      "source": settings["preset_source"]},
                           "preprocess": preprocess_detail, "size_before": size_before, "size_after": None,
                           "size_ratio": None, "calibration": {"samples": len(calib_indices),
                                                               "source": calibration.source if calibration else None,
                                                               "kind": calibration.kind if calibration else None},
                           "evaluation_samples": len(eval_feeds), "verify": {"cosine": None, "max_abs_diff": None,
                                                                             "top1_agreement": None, "latency_ratio": None,
                                                                             "passed": None},
                           "quantized_ops": 0, "quantized_weights": 0, "excluded_nodes": []}
            return report
        quantized = onnx.load(str(result_path))
        stats = quantization_stats(quantized)
        if stats["quantized_ops"] == 0:
            report.add(Finding.of("QNT002", "nothing was quantized: no op computes on quantized data",
                                  fix="check --exclude-op/--exclude-node, and that the model's weights are initializers"))
        if evaluation is not None and not evaluation.passed:
            worst = worst_nodes(float_path, result_path, eval_feeds[0], set(excluded), cache=float_runs) if evaluation.error is None else []
            names = ", ".join(f"{n} ({op}, cosine {c:.4f})" for n, op, c in worst) or "none found"
            what = evaluation.error or f"lowest output cosine {evaluation.cosine:.4f} is below {options.min_cosine}"
            report.add(Finding.of("QNT005", f"accuracy gate failed: {what}; worst nodes: {names}",
                                  fix="ortprep quantize ... --auto-exclude, or --exclude-node NAME for the nodes above"))
        if auto_excluded and evaluation is not None:
            report.add(Finding.of("QNT006", f"--auto-exclude kept {len(auto_excluded)} node(s) in float: "
                                  + ", ".join(a["name"] for a in auto_excluded), fix="see excluded_nodes"))
        slower = latency_finding(evaluation)
        if slower is not None:
            report.add(slower)
        failed = evaluation is not None and not evaluation.passed
        written = None
        if not failed or options.keep_failed:
            written = ModelHandle(proto=quantized, path=None).save(dest, force=force, external_data=True if big else None)
            report.artifacts.append(str(written))
        size_after = model_bytes(written) if written else model_bytes(result_path)
        if size_after >= size_before:
            report.add(Finding.of("QNT003", f"the quantized model is not smaller ({size_after} bytes vs {size_before})",
                                  fix="few weights were quantized; check the findings above"))
    report.data = {
        "input": str(handle.path),
        "output": str(written) if written else None,
        "mode": options.mode,
        "format": settings["format"],
        "preset": {"ep": settings["preset"], "reason": settings["preset_reason"], "activation_type": settings["activation_type"],
                   "weight_type": settings["weight_type"], "per_channel": settings["per_channel"], "method": settings["method"],
                   "source": settings["preset_source"]},
        "preprocess": preprocess_detail,
        "size_before": size_before,
        "size_after": size_after,
        "size_ratio": round(size_after / size_before, 4) if size_before else None,
        "calibration": {"samples": len(calib_indices), "source": calibration.source if calibration else None,
                        "kind": calibration.kind if calibration else None},
        "evaluation_samples": len(eval_feeds),
        "verify": evaluation.to_record() if evaluation else {"cosine": None, "max_abs_diff": None, "top1_agreement": None,
                                                             "latency_ratio": None, "passed": None},
        "quantized_ops": stats["quantized_ops"],
        "quantized_weights": stats["quantized_weights"],
        "excluded_nodes": [{"name": n, "reason": "--exclude-node"} for n in options.exclude_nodes]
        + [{"name": a["name"], "reason": f"--auto-exclude round {a['round']}: output cosine {a['cosine']:.4f}", "op_type": a["op_type"]} for a in auto_excluded],
    }
    report.output = written
    return report


class QuantizeStep(Step):
    name = "quantize"
    Options = QuantizeOptions
    memory_factor = 2.0
    refuses_ep_context = True
    reports_progress = True
    writes_model = True
    needs_ort = "always"
    default_suffix = ".int8.onnx"

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        return quantize_model(model, output_path(self, model, ctx), self.options, force=ctx.force, progress=ctx.progress)
