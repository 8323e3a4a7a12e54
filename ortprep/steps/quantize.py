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
from ortprep.runtime.compare import Degenerate, compare_arrays, degenerate, output_bounds
from ortprep.runtime.feeds import input_specs, random_feeds
from ortprep.runtime.isolated import RunOutcome, run_isolated
from ortprep.steps.base import ProgressCallback, Step, StepContext, output_path
from ortprep.options import QuantizeOptions
from ortprep.transforms.fp16 import ensure_node_names
from ortprep.transforms.quant_search import Trial
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
    spread: dict | None = None  # {"samples", "min", "median", "max"} of each sample's lowest output cosine
    degenerate: list[tuple[str, str]] = field(default_factory=list)  # (output, why cosine means nothing)
    sample_cosines: list[float] = field(default_factory=list)  # each sample's lowest output cosine, in order

    def to_record(self) -> dict:
        return {
            "cosine": self.cosine,
            "spread": self.spread,
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


DEGENERATE_TOL = 0.05  # a flat output's largest absolute error, relative to its range or scale


def evaluate(float_model: Path, quant_model: Path, feeds: list[dict[str, np.ndarray]], min_cosine: float,
             cache: dict[str, RunOutcome] | None = None, bounds: dict | None = None) -> Evaluation:
    """Run both models on ``feeds`` and compare. ``cache`` keeps the float model's run between
    trials (only the quantized model changes). An output that the samples leave flat (constant,
    near zero) is judged by absolute error against its range or scale, not by cosine."""
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
    per_sample: list[float] = []
    flat: dict[str, Degenerate] = {}
    for name in reference.samples[0] if reference.samples else {}:
        stacked = np.stack([np.asarray(sample[name]) for sample in reference.samples]) if reference.samples[0][name].dtype.kind == "f" else None
        found = degenerate(stacked, (bounds or {}).get(name)) if stacked is not None else None
        if found is not None:
            flat[name] = found
    for ref_sample, cand_sample in zip(reference.samples, candidate.samples):
        sample_cosines = []
        for name, value in ref_sample.items():
            diff = compare_arrays(name, value, cand_sample[name])
            per_output.setdefault(name, []).append((diff, _top1(value, cand_sample[name])))
            if diff.cosine is not None and name not in flat:
                sample_cosines.append(diff.cosine)
        if sample_cosines:
            per_sample.append(min(sample_cosines))
    outputs = []
    verdicts = []
    for name, rows in per_output.items():
        cosines = [d.cosine for d, _ in rows if d.cosine is not None]
        tops = [t for _, t in rows if t is not None]
        worst_abs = max((d.max_abs_diff for d, _ in rows if d.max_abs_diff is not None), default=None)
        record = {
            "name": name,
            "cosine": min(cosines) if cosines else None,
            "max_abs_diff": worst_abs,
            "top1_agreement": statistics.fmean(tops) if tops else None,
            "judged_by": "cosine",
        }
        if name in flat:
            limit = DEGENERATE_TOL * flat[name].scale
            record["judged_by"] = f"absolute error <= {limit:.3g} (output {flat[name].what})"
            verdicts.append(worst_abs is not None and worst_abs <= limit and all(d.shape_match and not d.nonfinite for d, _ in rows))
        else:
            verdicts.append(record["cosine"] is not None and record["cosine"] >= min_cosine)
        outputs.append(record)
    cosines = [o["cosine"] for o in outputs if o["cosine"] is not None and o["judged_by"] == "cosine"]
    tops = [o["top1_agreement"] for o in outputs if o["top1_agreement"] is not None]
    float_ms = statistics.median(reference.latency_ms) if reference.latency_ms else None
    quant_ms = statistics.median(candidate.latency_ms) if candidate.latency_ms else None
    cosine = min(cosines) if cosines else None
    spread = ({"samples": len(per_sample), "min": min(per_sample), "median": statistics.median(per_sample),
               "max": max(per_sample)} if per_sample else None)
    return Evaluation(
        cosine=cosine,
        max_abs_diff=max((o["max_abs_diff"] for o in outputs if o["max_abs_diff"] is not None), default=None),
        top1_agreement=min(tops) if tops else None,
        latency_ratio=round(quant_ms / float_ms, 3) if float_ms and quant_ms else None,
        float_latency_ms=float_ms,
        quant_latency_ms=quant_ms,
        passed=bool(verdicts) and all(verdicts),
        outputs=outputs,
        spread=spread,
        degenerate=[(name, found.what) for name, found in flat.items()],
        sample_cosines=per_sample,
    )


def worst_nodes(float_model: Path, quant_model: Path, feeds: dict[str, np.ndarray], excluded: set[str], limit: int | None = 5,
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
    return [(name, op, cosine) for _, name, op, cosine in (ranked if limit is None else ranked[:limit])]


def tensor_noise(float_model: Path, quant_model: Path, feeds: list[dict[str, np.ndarray]],
                 cache: dict[str, RunOutcome] | None = None) -> list[tuple[str, float]]:
    """(tensor, noise) for every activation the quantized model quantizes, worst first.

    As ORT's qdq_loss_debug does, each tensor's quantization is measured on its own: the float
    model's values of it, quantized and dequantized with the scale and zero point the quantizer
    chose (or, for dynamic quantization, the per-run range), against themselves. The noise is
    the RMS error over the median magnitude of the values: a tensor whose range a few outlier
    channels set leaves the other channels at the mercy of one step, and scores high even
    though cosine over the whole tensor stays near 1."""
    quant = onnx.load(str(quant_model), load_external_data=False)
    inits = {t.name: t for t in quant.graph.initializer}
    wanted: dict[str, tuple[np.ndarray | None, np.ndarray | None, int]] = {}
    float_proto = onnx.load(str(float_model), load_external_data=False)
    produced = {o for n in float_proto.graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in quant.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    for node in quant.graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) >= 2 and node.input[1] in inits:
            scale = onnx.numpy_helper.to_array(inits[node.input[1]])
            zero = onnx.numpy_helper.to_array(inits[node.input[2]]) if len(node.input) > 2 and node.input[2] in inits else None
            tensor = node.input[0]
            if tensor not in produced:
                # a graph output: the quantizer renames what writes it, and the DQ after the Q writes the name
                tensor = next((r.output[0] for r in readers.get(node.output[0], []) if r.op_type == "DequantizeLinear"
                               and r.output[0] in produced), tensor)
            if scale.size == 1:
                wanted[tensor] = (scale, zero, zero.dtype.itemsize * 8 if zero is not None else 8)
        elif node.op_type == "DynamicQuantizeLinear":
            wanted[node.input[0]] = (None, None, 8)
    names = [n for n in wanted if n in produced or n in {v.name for v in float_proto.graph.input}]
    cache = {} if cache is None else cache
    key = "noise:" + ",".join(sorted(names)) + f":{id(feeds[0])}:{len(feeds)}"
    if key not in cache:
        cache[key] = run_isolated(_with_outputs(float_model, [n for n in names if n in produced]), feeds)
    reference = cache[key]
    if not reference.ok:
        return []
    values: dict[str, list[np.ndarray]] = {}
    for sample, feed in zip(reference.samples, feeds):
        for name in names:
            value = sample.get(name, feed.get(name))
            if value is not None and np.asarray(value).dtype.kind == "f":
                values.setdefault(name, []).append(np.asarray(value, np.float64).ravel())
    noise = []
    for name, parts in values.items():
        data = np.concatenate(parts)
        data = data[np.isfinite(data)]
        if data.size == 0:
            continue
        scale, zero, bits = wanted[name]
        if scale is None:  # dynamic: uint8 over the run's range, zero included
            low, high = min(float(data.min()), 0.0), max(float(data.max()), 0.0)
            step = (high - low) / 255 or 1.0
            point = round(-low / step)
            levels = (0, 255)
        else:
            step = float(scale.ravel()[0]) or 1.0
            point = int(zero.ravel()[0]) if zero is not None else 0
            signed = zero is not None and zero.dtype.kind == "i"
            levels = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
        restored = (np.clip(np.round(data / step) + point, *levels) - point) * step
        nonzero = np.abs(data[data != 0])
        typical = float(np.median(nonzero)) if nonzero.size else 0.0
        rms = float(np.sqrt(np.mean((data - restored) ** 2)))
        noise.append((name, rms / typical if typical > 0 else (0.0 if rms == 0 else float("inf"))))
    noise.sort(key=lambda item: -item[1])
    return noise


def _with_outputs(model: Path, names: list[str]) -> Path:
    """A copy of ``model`` beside it with ``names`` added as outputs. Only the graph is read:
    external weights stay where they are (the copy points at the same data file)."""
    proto = onnx.load(str(model), load_external_data=False)
    present = {v.name for v in proto.graph.output}
    produced = {o for n in proto.graph.node for o in n.output}
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in present and n in produced)
    path = model.parent / (model.stem + ".exposed.onnx")
    onnx.save_model(proto, str(path))
    return path


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


PREPROCESS_MARGIN = 1e-3  # cosine by which quantizing without pre-processing must win to be chosen
NOISE_FLOOR = 0.02  # quantization noise (RMS over median magnitude) below which a tensor is not worth keeping float
MIN_EVAL_SAMPLES = 8  # fewer held-back samples than this and the verdict gets a warning
RANDOM_EVAL_SAMPLES = 8


def held_back_share(count: int) -> float:
    """Every fifth sample is held back, but at least 8 when 16 or more exist (half of fewer)."""
    wanted = max(count // 5, min(MIN_EVAL_SAMPLES, count // 2))
    return wanted / count if count else 0.2


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
            calib_indices, eval_indices = split(count, holdout=held_back_share(count))
        else:
            calib_indices = list(range(count))
    if evaluation_set is not None:
        return DataPlan(calibration, calib_indices, evaluation_set, list(range(evaluation_set.count)))
    return DataPlan(calibration, calib_indices, calibration, eval_indices)


QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
                 "MatMulInteger", "ConvInteger", "QLinearAdd", "QLinearMul", "QGemm", "QAttention", "DynamicQuantizeMatMul",
                 "MatMulNBits", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool", "QLinearConcat"}
INT_TYPES = (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.UINT4)


def already_quantized(proto: ModelProto) -> str | None:
    """What shows that a model is already quantized (QDQ or QOperator nodes), or None."""
    ops: dict[str, int] = {}
    for _, graph in iter_graphs(proto.graph):
        for node in graph.node:
            if node.op_type in QUANTIZED_OPS:
                ops[node.op_type] = ops.get(node.op_type, 0) + 1
    if not ops:
        return None
    weights = sum(1 for _, g in iter_graphs(proto.graph) for t in g.initializer if t.data_type in INT_TYPES and len(t.dims) >= 1
                  and int(np.prod(t.dims)) > 1)
    listed = ", ".join(f"{count} {op}" for op, count in sorted(ops.items(), key=lambda kv: -kv[1])[:5])
    return f"{listed}; {weights} 8-bit (or smaller) integer weight tensor(s)"


SENTINEL = 1e30  # a constant at least this large is a stand-in for infinity, not a value


def sentinel_readers(proto: ModelProto) -> list[str]:
    """Nodes of the main graph that read a float constant holding inf, NaN or a sentinel magnitude:
    quantizing their inputs would stretch an 8-bit range over it and erase every real value."""
    bad = set()
    for tensor in proto.graph.initializer:
        if tensor.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE) and int(np.prod(tensor.dims)) <= 1 << 20:
            values = onnx.numpy_helper.to_array(tensor)
            if values.size and (not np.all(np.isfinite(values)) or float(np.abs(values).max()) >= SENTINEL):
                bad.add(tensor.name)
    return [node.name for node in proto.graph.node if bad & set(node.input)]


def node_label(node: onnx.NodeProto, index: int) -> str:
    """A node's name, or OP#INDEX when it has none."""
    return node.name or f"{node.op_type}#{index}"


def legal_settings(proto: ModelProto, settings: dict, feeds: dict[str, np.ndarray] | None, report: StepResult
                   ) -> tuple[ModelProto, dict]:
    """Per-channel QDQ writes DequantizeLinear with an axis, which needs opset 13: upgrade the
    opset (verified) or fall back to per-tensor, and say which."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    if not (settings["per_channel"] and settings["format"] == "qdq" and opset < 13):
        return proto, settings
    from ortprep.transforms import rewrites
    from ortprep.transforms.verify import EXACT_GATE, run_model, verify_run

    try:
        upgraded = rewrites.convert_opset(proto, 13)
    except UsageError:
        upgraded = None
    if upgraded is not None and feeds is not None:
        check = verify_run(run_model(proto, feeds), run_model(upgraded, feeds), EXACT_GATE)
        if check.passed:
            report.add(Finding.of("QNT012", f"per-channel QDQ needs opset 13 (DequantizeLinear's axis); the model's opset "
                                  f"{opset} was upgraded to 13 and verified (max abs diff {check.max_abs_diff:.3g})",
                                  fix="nothing to do; --per-tensor keeps the opset"))
            return upgraded, settings
    report.add(Finding.of("QNT012", f"per-channel QDQ needs opset 13 (DequantizeLinear's axis) and the model's opset {opset} "
                          "could not be upgraded with verification: weights are quantized per tensor",
                          fix="upgrade it yourself (ortprep convert --opset 13) to get per-channel weights"))
    return proto, {**settings, "per_channel": False}


@dataclass
class Outcome:
    """What the trials ended with."""

    trial: Trial | None
    evaluation: Evaluation | None
    excluded: list[dict]
    search: dict | None = None
    failure: str | None = None  # ORT's quantizer raised or died: its whole message
    source: str = "preprocessed"
    method: str = "minmax"  # the calibration method of the result


class Trials:
    """Quantize with some nodes kept in float, into a folder of its own, and evaluate."""

    def __init__(self, workdir: Path, options: QuantizeOptions, settings: dict, plan: DataPlan, eval_feeds: list,
                 big: bool, bounds: dict, progress: ProgressCallback | None) -> None:
        self.workdir, self.options, self.settings, self.plan = workdir, options, settings, plan
        self.eval_feeds, self.big, self.bounds, self.progress = eval_feeds, big, bounds, progress
        self.count = 0
        self.fixed: list[str] = list(options.exclude_nodes)  # kept float in every trial
        self.evaluations: dict[Path, Evaluation] = {}
        self.caches: dict[Path, dict] = {}
        self.failure: str | None = None

    def attempt(self, source: Path, kept: list[str], label: str) -> Trial:
        self.count += 1
        folder = self.workdir / f"trial{self.count}"
        folder.mkdir()
        output = folder / "quantized.onnx"
        ok, error = _run_quantizer(self.workdir, source, output, self.options.mode, self.settings, self.plan.calibration,
                                   self.plan.calib_indices, kept, self.options.exclude_ops, self.big, self.progress)
        if not ok:
            self.failure = self.failure or error
            return Trial(label, list(kept), None, False, 0, None, error)
        evaluation = None
        if self.eval_feeds:
            if self.progress is not None:
                self.progress("evaluating", 0, 1)
            evaluation = evaluate(source, output, self.eval_feeds, self.options.min_cosine,
                                  self.caches.setdefault(source, {}), self.bounds)
            if self.progress is not None:
                self.progress("evaluating", 1, 1)
            self.evaluations[output] = evaluation
        passed = evaluation is None or evaluation.passed
        return Trial(label, list(kept), evaluation.cosine if evaluation else None, passed, model_bytes(output), output,
                     evaluation.error if evaluation else None)


def _search(trials: Trials, source: Path, baseline: Trial, options: QuantizeOptions, proto: ModelProto) -> tuple[Trial, dict, dict]:
    from ortprep.transforms.quant_search import Search

    float_graph = proto.graph
    producers = {out: node.name for node in float_graph.node for out in node.output}
    consumers: dict[str, list[str]] = {}
    for node in float_graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.name)

    def rank(trial: Trial, kept: list[str]) -> list[tuple[str, list[str], float]]:
        if trial.path is None:
            return []
        # the sample the trial did worst on (where calibration's ranges clip, say) and one more
        cosines = trials.evaluations[trial.path].sample_cosines if trial.path in trials.evaluations else []
        worst = cosines.index(min(cosines)) if cosines else 0
        picked = [trials.eval_feeds[worst]] + [f for i, f in enumerate(trials.eval_feeds[:2]) if i != worst][:1]
        noise = tensor_noise(source, trial.path, picked, cache=trials.caches.setdefault(source, {}))
        # a tensor stays float only when the node writing it and every node reading it are float
        return [(tensor, ([producers[tensor]] if tensor in producers else []) + consumers.get(tensor, []), score)
                for tensor, score in noise if score > NOISE_FLOOR]

    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry

    registry = (IntegerOpsRegistry if options.mode == "dynamic"
                else QDQRegistry if trials.settings["format"] == "qdq" else QLinearOpsRegistry)
    ops = set(trials.settings["op_types"] or registry)
    # the share is of the nodes the quantizer would quantize
    quantizable = {node.name for node in proto.graph.node if node.op_type in ops}
    search = Search(proto, lambda kept, label: trials.attempt(source, kept, label), rank, quantizable_nodes=quantizable,
                    max_float_share=options.max_float_share, max_trials=options.max_exclude_rounds + 1,
                    fixed=list(trials.fixed), aim=options.min_cosine + (1 - options.min_cosine) / 2)  # as in _quantize_and_search
    result = search.run(baseline)
    size_before = max(model_bytes(source), 1)
    record = {"aim": search.aim, "trials": [t.to_record(size_before) for t in result.trials], "rules": result.rules,
              "ranked": result.ranked[:50], "stopped": result.stopped}
    return result.best, record, result.reasons


def _quantize_and_search(workdir: Path, sources: list[tuple[str, Path]], options: QuantizeOptions, settings: dict,
                         plan: DataPlan, eval_feeds: list, big: bool, bounds: dict, progress: ProgressCallback | None,
                         report: StepResult, sentinels: list[str]) -> Outcome:
    """The baseline on each source (pre-processed, as given), the better kept; then the search."""
    trials = Trials(workdir, options, settings, plan, eval_feeds, big, bounds, progress)
    trials.fixed += [n for n in sentinels if n not in trials.fixed]
    baselines = [(label, path, trials.attempt(path, list(trials.fixed), f"baseline ({label})"))
                 for label, path in sources]
    usable = [(label, path, t) for label, path, t in baselines if t.path is not None]
    if not usable:
        return Outcome(None, None, [], failure=trials.failure)
    chosen = usable[0]
    if len(usable) > 1:
        with_pre, without = usable[0], usable[1]
        first, second = with_pre[2], without[2]
        # without pre-processing wins when it passes where it fails, or is clearly more accurate
        if (second.passed and not first.passed) or (second.passed == first.passed and second.cosine is not None
                                                    and (first.cosine is None or second.cosine > first.cosine + PREPROCESS_MARGIN)):
            chosen = without
            report.add(Finding.of(
                "QNT013", f"quantization pre-processing made the result worse (cosine {_fmt(with_pre[2].cosine)} with it, "
                f"{_fmt(without[2].cosine)} without): the model is quantized as given",
                fix="nothing to do; --no-preprocess skips the comparison"))
    label, source, best = chosen
    search_record = None
    reasons: dict[str, str] = {}
    calibration: list[dict] = []
    aim = options.min_cosine + (1 - options.min_cosine) / 2
    searching = not best.passed and options.auto_exclude and bool(eval_feeds)
    if not best.passed and options.auto_exclude and eval_feeds and options.mode == "static" and settings["method"] == "minmax":
        # the calibration method first: min/max ranges stretched by rare values cost every node
        # precision (PaddleOCR's detector: 0.975 with min/max, 0.994 with percentile)
        baseline_cosine, first = best.cosine, best
        # (entropy is not tried by itself: on a tensor whose range one spike stretched it took 520 s
        # for a one-MatMul model; ask for it with --method entropy)
        for method in ("percentile",):
            trials.settings = {**settings, "method": method}
            outcome = trials.attempt(source, list(trials.fixed), f"calibration: {method}")
            helped = outcome.path is not None and outcome.cosine is not None and (
                best.cosine is None or outcome.cosine > best.cosine + 1e-4)
            calibration.append({"method": method, "cosine": outcome.cosine, "passed": outcome.passed, "kept": helped})
            if helped:
                best = outcome
                settings = trials.settings
            if best.passed and best.cosine is not None and best.cosine >= aim:
                break
        trials.settings = settings
        if settings["method"] != "minmax":
            report.add(Finding.of("QNT016", f"{settings['method']} calibration kept: lowest cosine {_fmt(baseline_cosine)} "
                                  f"with min/max ranges, {_fmt(best.cosine)} with {settings['method']}",
                                  fix=f"nothing to do; --method {settings['method']} asks for it directly"))
    graph_only = onnx.load(str(source), load_external_data=False)
    if searching:  # once the search started it aims for the margin, whatever fixed the gate
        best, search_record, reasons = _search(trials, source, best, options, graph_only)
    if calibration:
        search_record = search_record or {"aim": None, "trials": [best.to_record(max(model_bytes(source), 1))], "rules": [],
                                          "ranked": [], "stopped": "the gate passed"}
        search_record["calibration"] = calibration
        search_record["trials"].insert(0, first.to_record(max(model_bytes(source), 1)))
    excluded = [{"name": n, "reason": "--exclude-node"} for n in options.exclude_nodes]
    excluded += [{"name": n, "reason": "reads a non-finite or sentinel constant (no 8-bit range holds it)"}
                 for n in trials.fixed if n not in options.exclude_nodes]
    ops = {n.name: n.op_type for n in graph_only.graph.node}
    excluded += [{"name": n, "op_type": ops.get(n, "?"), "reason": reasons.get(n, "auto-exclude")}
                 for n in best.kept if n not in trials.fixed]
    return Outcome(best, trials.evaluations.get(best.path), excluded, search_record, source=label,
                   method=trials.settings["method"])


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _base_record(handle: ModelHandle, options: QuantizeOptions, settings: dict, size_before: int) -> dict:
    return {
        "input": str(handle.path), "output": None, "mode": options.mode, "format": settings["format"],
        "preset": {"ep": settings["preset"], "reason": settings["preset_reason"], "activation_type": settings["activation_type"],
                   "weight_type": settings["weight_type"], "per_channel": settings["per_channel"], "method": settings["method"],
                   "source": settings["preset_source"]},
        "preprocess": "not run", "size_before": size_before, "size_after": None, "size_ratio": None,
        "calibration": {"samples": 0, "source": None, "kind": None}, "evaluation_samples": 0,
        "evaluation_inputs": None,
        "verify": {"cosine": None, "spread": None, "max_abs_diff": None, "top1_agreement": None, "latency_ratio": None,
                   "passed": None},
        "quantized_ops": 0, "quantized_weights": 0, "excluded_nodes": [], "search": None,
    }


def _evaluation_feeds(handle: ModelHandle, plan: DataPlan, options: QuantizeOptions, report: StepResult
                      ) -> tuple[list[dict], str | None]:
    """The held-back samples; without any, seeded inputs and a warning (never "not run")."""
    if not options.verify:
        return [], None
    if plan.eval_set is not None and plan.eval_indices:
        feeds = list(plan.eval_set.samples(plan.eval_indices))
        if len(feeds) < MIN_EVAL_SAMPLES:
            report.add(Finding.of("QNT014", f"the accuracy verdict rests on {len(feeds)} held-back sample(s); fewer than "
                                  f"{MIN_EVAL_SAMPLES} say little about real inputs",
                                  fix=f"give more samples (--calib with at least {2 * MIN_EVAL_SAMPLES}), or --eval DATA"))
        return feeds, plan.eval_set.source
    specs = input_specs(handle.proto)
    feeds = [random_feeds(specs, seed=seed) for seed in range(RANDOM_EVAL_SAMPLES)]
    report.add(Finding.of(
        "QNT011", f"no evaluation data: the quantized model was evaluated on {RANDOM_EVAL_SAMPLES} seeded random inputs, "
        "which prove little about real inputs", severity=None,
        fix="pass real samples with --eval DATA (or --calib DATA); --fail-on warning makes this fail CI"))
    return feeds, f"random ({RANDOM_EVAL_SAMPLES} seeded samples)"


def quantize_model(handle: ModelHandle, dest: Path, options: QuantizeOptions, *, force: bool = False,
                   progress: ProgressCallback | None = None) -> StepResult:
    """Quantize ``handle``'s model and write ``dest`` when the accuracy gate passes.
    ``progress(stage, done, total)`` is called during calibration and evaluation."""
    settings = resolve_settings(options)
    report = StepResult(step="quantize", schema=SCHEMA)
    size_before = model_bytes(handle.path)
    already = already_quantized(handle.proto)
    if already is not None:
        report.add(Finding.of("QNT010", f"the model is already quantized ({already}); quantizing it again would stack "
                              "a second quantization on the first", fix="quantize the float model it was made from"))
        report.data = _base_record(handle, options, settings, size_before)
        return report
    plan = plan_data(handle, options, settings, report)
    calibration, calib_indices = plan.calibration, plan.calib_indices
    handle.load_weights()
    eval_feeds, eval_source = _evaluation_feeds(handle, plan, options, report)
    bounds = output_bounds(handle.proto)
    with tempfile.TemporaryDirectory(prefix="ortprep-quantize-") as tmp:
        workdir = Path(tmp)
        proto = onnx.ModelProto()
        proto.CopyFrom(handle.proto)
        moved = constants_to_initializers(proto)
        if moved:
            report.add(Finding.of("QNT009", f"{moved} weight(s) held in Constant nodes became initializers so they can be quantized",
                                  fix="nothing to do"))
        ensure_node_names(proto)
        sentinels = sentinel_readers(proto)
        if sentinels:
            report.add(Finding.of("QNT015", f"{len(sentinels)} node(s) read a non-finite or sentinel constant (such as the -inf "
                                  "of a safe maximum) that no 8-bit range can hold; they stay float: " + ", ".join(sentinels[:6]),
                                  fix="nothing to do"))
        proto, settings = legal_settings(proto, settings, eval_feeds[0] if eval_feeds else None, report)
        big = handle.has_external_data()
        float_path = save_temp(proto, workdir, "float.onnx")
        del proto
        preprocess_detail = "skipped (--no-preprocess)"
        sources = [("as given", float_path)]
        if options.preprocess:
            preprocessed, preprocess_detail = _preprocess(workdir, float_path, report)
            if preprocessed != float_path:
                _name_nodes(preprocessed)
                # checked, not trusted: both are quantized and evaluated when there is data to judge by
                sources = [("preprocessed", preprocessed)] + (sources if eval_feeds else [])
        outcome = _quantize_and_search(workdir, sources, options, settings, plan, eval_feeds, big, bounds, progress, report,
                                       sentinels)
        settings = {**settings, "method": outcome.method}
        if outcome.source == "as given" and options.preprocess and len(sources) > 1:
            preprocess_detail += "; not used: quantizing without it evaluated better"
        report.data = _base_record(handle, options, settings, size_before)
        report.data.update({"preprocess": preprocess_detail, "evaluation_samples": len(eval_feeds),
                            "evaluation_inputs": eval_source,
                            "calibration": {"samples": len(calib_indices), "source": calibration.source if calibration else None,
                                            "kind": calibration.kind if calibration else None}})
        if outcome.trial is None:
            report.add(Finding.of("QNT008", f"ONNX Runtime's quantizer failed on this model: {outcome.failure}",
                                  fix="--exclude-op / --exclude-node for the op it names, --no-preprocess, or check the "
                                  "model first: ortprep check MODEL --ep cpu"))
            return report
        result_path = outcome.trial.path
        evaluation, excluded = outcome.evaluation, outcome.excluded
        quantized = onnx.load(str(result_path))
        stats = quantization_stats(quantized)
        if stats["quantized_ops"] == 0:
            report.add(Finding.of("QNT002", "nothing was quantized: no op computes on quantized data",
                                  fix="check --exclude-op/--exclude-node, and that the model's weights are initializers"))
        for name, what in (evaluation.degenerate if evaluation else []):
            report.add(Finding.of(
                "VFY001", f"output '{name}' is {what} on the evaluation samples: cosine similarity means nothing there, so "
                "it was judged by absolute error; these samples do not exercise it",
                fix="evaluate on real data that moves this output: --eval DATA"))
        if evaluation is not None and not evaluation.passed:
            worst = (worst_nodes(Path(float_path), result_path, eval_feeds[0], {e["name"] for e in excluded})
                     if evaluation.error is None else [])
            names = ", ".join(f"{n} ({op}, cosine {c:.4f})" for n, op, c in worst) or "none found"
            what = evaluation.error or f"lowest output cosine {_fmt(evaluation.cosine)} is below {options.min_cosine}"
            stopped = f"; the search stopped: {outcome.search['stopped']}" if outcome.search else ""
            report.add(Finding.of("QNT005", f"accuracy gate failed: {what}{stopped}; worst nodes: {names}",
                                  fix="ortprep quantize ... --auto-exclude, or --exclude-node NAME for the nodes above"))
        auto = [e for e in excluded if e["reason"] != "--exclude-node"]
        if auto and evaluation is not None:
            report.add(Finding.of("QNT006", f"--auto-exclude kept {len(auto)} node(s) in float ("
                                  + ", ".join(e["name"] for e in auto[:12]) + ("..." if len(auto) > 12 else "")
                                  + f"): lowest cosine {_fmt(evaluation.cosine)}", fix="see excluded_nodes and search"))
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
    report.data.update({
        "output": str(written) if written else None,
        "size_after": size_after,
        "size_ratio": round(size_after / size_before, 4) if size_before else None,
        "verify": evaluation.to_record() if evaluation else report.data["verify"],
        "quantized_ops": stats["quantized_ops"],
        "quantized_weights": stats["quantized_weights"],
        "excluded_nodes": excluded,
        "search": outcome.search,
    })
    report.output = written
    return report


def _name_nodes(path: Path) -> None:
    """ORT's pre-processing leaves the nodes it creates unnamed: name them (OP_INDEX) in place."""
    model = onnx.load(str(path), load_external_data=False)
    if all(node.name for _, g in iter_graphs(model.graph) for node in g.node):
        return
    ensure_node_names(model)
    onnx.save_model(model, str(path))


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
