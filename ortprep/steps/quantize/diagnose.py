"""Where a quantized model's error comes from, for the gate's finding and the accuracy search: the
nodes where it starts (worst_nodes) and the tensors whose quantization is noisiest (tensor_noise),
from runs that expose intermediates in groups of bounded memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from ortprep.fidelity.compare import compare_arrays
from ortprep.runtime.isolated import RunOutcome, run_isolated
from ortprep.steps.quantize.calibrate import exposure_chunks
from ortprep.transforms.qdq.facts import QUANT_OPS, with_outputs
from ortprep.transforms.qdq.saturation import reader_bounds
from ortprep.transforms.verify import float_intermediates


def _exposed_run(model: Path, feeds: dict[str, np.ndarray] | list[dict[str, np.ndarray]]) -> RunOutcome:
    """A run that exposes intermediates, with ORT's graph optimizations off: which tensors one
    group exposes must not change the values of the others (a fusion happens only where its
    intermediates are not exposed, and a fused Q/DQ pair computes in integers): each group then
    sees what a run exposing every tensor saw."""
    return run_isolated(model, feeds, optimization="disable")


def worst_nodes(
    float_model: Path,
    quant_model: Path,
    feeds: dict[str, np.ndarray],
    excluded: set[str],
    limit: int | None = 5,
    cache: dict[str, RunOutcome] | None = None,
) -> list[tuple[str, str, float]]:
    """(node, op, cosine) of the nodes where the quantization error starts, worst first.

    Every tensor both models compute is compared. A node of the quantized model is blamed when
    its output is worse than what it reads (its inputs traced back through Q/DQ pairs to the
    tensors they quantize): the error starts there. The quantizer may fold nodes (a Relu into
    the preceding MatMul's Q/DQ range), so blame goes to the node that produces the tensor in
    the quantized model. A tensor whose readers are flat past known bounds (qdq.saturation) is
    compared within them: values its readers do not tell apart are no error."""
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
    bounds = reader_bounds(quant_proto)
    cache = {} if cache is None else cache
    chunks = exposure_chunks(float_model, names, [feeds])  # groups of at most EXPOSED_BYTES
    quality: dict[str, float] = {}
    for chunk in chunks:
        # one chunk: the float model's run is kept for the next trial; more: run again per chunk
        # (holding every intermediate of both models at once is what bounded memory rules out)
        reference = cache.get("intermediates") if len(chunks) == 1 else None
        if reference is None:
            reference = _exposed_run(with_outputs(float_model, chunk), feeds)
            if len(chunks) == 1:
                cache["intermediates"] = reference
        candidate = _exposed_run(with_outputs(quant_model, [seen[name] for name in chunk]), feeds)
        if not reference.ok or not candidate.ok:
            return []
        for name, value in reference.outputs.items():
            other = candidate.outputs.get(seen.get(name, name))
            if name not in quality and other is not None and value.dtype.kind == "f":
                if name in bounds:
                    value = np.clip(value, *bounds[name]).astype(value.dtype)
                diff = compare_arrays(name, value, other.astype(value.dtype))
                quality[name] = diff.cosine if diff.cosine is not None else 0.0
        del reference, candidate
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


def _noise(data: np.ndarray, quantization: tuple, bounds: tuple[float, float] | None = None) -> float | None:
    """One tensor's quantization noise (RMS error over the median magnitude); None when it holds
    no finite value. ``bounds``: the range its readers tell apart (qdq.saturation.reader_bounds),
    where its values are measured."""
    data = data[np.isfinite(data)]
    if bounds is not None:
        data = np.clip(data, *bounds)
    if data.size == 0:
        return None
    scale, zero, bits = quantization
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
    return rms / typical if typical > 0 else (0.0 if rms == 0 else float("inf"))


def activation_encodings(quant: onnx.ModelProto, produced: set[str]
                         ) -> dict[str, tuple[np.ndarray, np.ndarray | None, int]]:
    """tensor -> (scale, zero point, bits) of every activation ``quant`` quantizes per tensor, named as
    the float model names it (``produced``: the float model's tensors)."""
    inits = {t.name: t for t in quant.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in quant.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    wanted = {}
    for node in quant.graph.node:
        if node.op_type != "QuantizeLinear" or len(node.input) < 2 or node.input[1] not in inits:
            continue
        scale = onnx.numpy_helper.to_array(inits[node.input[1]])
        has_zero = len(node.input) > 2 and node.input[2] in inits
        zero = onnx.numpy_helper.to_array(inits[node.input[2]]) if has_zero else None
        tensor = node.input[0]
        if tensor not in produced:
            # a graph output: the quantizer renames what writes it, and the DQ after the Q writes the name
            tensor = next((r.output[0] for r in readers.get(node.output[0], []) if r.op_type == "DequantizeLinear"
                           and r.output[0] in produced), tensor)
        if scale.size == 1:
            wanted[tensor] = (scale, zero, zero.dtype.itemsize * 8 if zero is not None else 8)
    return wanted


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
    float_proto = onnx.load(str(float_model), load_external_data=False)
    produced = {o for n in float_proto.graph.node for o in n.output}
    wanted: dict[str, tuple[np.ndarray | None, np.ndarray | None, int]] = dict(activation_encodings(quant, produced))
    for node in quant.graph.node:
        if node.op_type == "DynamicQuantizeLinear":
            wanted[node.input[0]] = (None, None, 8)
    names = [n for n in wanted if n in produced or n in {v.name for v in float_proto.graph.input}]
    bounds = reader_bounds(quant)
    cache = {} if cache is None else cache
    noise = []
    chunks = exposure_chunks(float_model, names, feeds)
    for chunk in chunks:
        key = "noise:" + ",".join(sorted(chunk)) + f":{id(feeds[0])}:{len(feeds)}"
        reference = cache.get(key)
        if reference is None:
            reference = _exposed_run(with_outputs(float_model, [n for n in chunk if n in produced]), feeds)
            if len(chunks) == 1:  # kept for the next trial only when it is small
                cache[key] = reference
        if not reference.ok:
            return []
        values: dict[str, list[np.ndarray]] = {}
        for sample, feed in zip(reference.samples, feeds):
            for name in chunk:
                value = sample.get(name, feed.get(name))
                if value is not None and np.asarray(value).dtype.kind == "f":
                    values.setdefault(name, []).append(np.asarray(value).ravel())  # float64 one tensor at a time
        del reference
        noise += [
            (name, _noise(np.concatenate(parts).astype(np.float64), wanted[name], bounds.get(name)))
            for name, parts in values.items()
        ]
    noise = [(name, value) for name, value in noise if value is not None]
    noise.sort(key=lambda item: -item[1])
    return noise
