"""Evaluation of a quantized model against the float one: both run on the same samples, the
outputs are compared (cosine per output, absolute error where an output is flat, top-1
agreement, latency) and the accuracy gate is decided; and, where the gate fails, where the error
comes from (the nodes that add it, the tensors whose quantization is noisiest).

Every model run of quantize starts here, in a child process: :func:`_run_model` for the runs
compared here, :func:`opset_upgrade_verified` for the check of an opset upgrade.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto

from ortprep.findings import Finding
from ortprep.runtime.compare import Degenerate, compare_arrays, degenerate
from ortprep.runtime.isolated import RunOutcome, run_isolated
from ortprep.steps.quantize.edits import QUANT_OPS, with_outputs
from ortprep.transforms.verify import EXACT_GATE, VerifyResult, float_intermediates, run_model, verify_run

LATENCY_RUNS = 10


def _run_model(model: Path, feeds: dict[str, np.ndarray] | list[dict[str, np.ndarray]], *, latency_runs: int = 0
               ) -> RunOutcome:
    """Run ``model`` on ``feeds`` in a child process (timed ``latency_runs`` times)."""
    return run_isolated(model, feeds, latency_runs=latency_runs)


def opset_upgrade_verified(original: ModelProto, upgraded: ModelProto, feeds: dict[str, np.ndarray]) -> VerifyResult:
    """Whether ``upgraded`` (an opset conversion of ``original``) computes the same outputs on
    ``feeds``: both run in child processes (ortprep.transforms.verify), judged by the exact gate."""
    return verify_run(run_model(original, feeds), run_model(upgraded, feeds), EXACT_GATE)


def fmt_cosine(value: float | None) -> str:
    """A cosine for a message: four decimals, or n/a."""
    return "n/a" if value is None else f"{value:.4f}"


@dataclass
class Evaluation:
    """How a quantized model compares with the float one on the evaluation samples, and the verdict."""

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
        cache["evaluation"] = _run_model(float_model, feeds, latency_runs=LATENCY_RUNS)
    reference = cache["evaluation"]
    candidate = _run_model(quant_model, feeds, latency_runs=LATENCY_RUNS)
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
        cache["intermediates"] = _run_model(with_outputs(float_model, names), feeds)
    reference = cache["intermediates"]
    candidate = _run_model(with_outputs(quant_model, list(seen.values())), feeds)
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
        cache[key] = _run_model(with_outputs(float_model, [n for n in names if n in produced]), feeds)
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
