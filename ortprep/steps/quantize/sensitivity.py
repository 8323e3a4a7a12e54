"""How much each activation's quantization alone moves the model's outputs: the order of the
search's 16-bit rung.

:func:`~ortprep.steps.quantize.diagnose.tensor_noise` scores a tensor by its own rounding error,
which misses an error that grows downstream: a LayerNorm written out as ``E[x^2] - E[x]^2``
subtracts two nearly equal 8-bit values, and the variance it leaves carries the rounding of both
at full size. Here each activation is quantized on its own (its scale and zero point from the
trial's model) inside the float model, and scored by the relative change of the outputs. One
session serves every tensor: each quantization sits behind a ``Where`` whose condition is a
graph input, so a run switches exactly one on. (AIMET's QuantAnalyzer ranks quantizers by the
same one-at-a-time measure, docs/decisions/reduce-quantize-sensitivity.md.)
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortprep.runtime.isolated import run_isolated
from ortprep.steps.quantize.diagnose import activation_encodings

GATE = "ortprep_gate_"
# runs sent to the worker at once, at most: the outputs of a chunk come back together, so a chunk
# also holds at most CHUNK_BYTES of them
CHUNK_RUNS = 8
CHUNK_BYTES = 256 * 2**20
# the change of a run whose outputs turned NaN or infinite where the float model's are finite (a
# variance quantized below zero, then its square root): above any finite change
NONFINITE_CHANGE = 1e6


def _subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """Names read inside the subgraphs of ``graph``'s nodes (outer-scope captures)."""
    names: set[str] = set()
    for node in graph.node:
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                for inner in sub.node:
                    names.update(inner.input)
                names |= _subgraph_reads(sub)
    return names


def gated_model(float_proto: onnx.ModelProto, encodings: dict) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of the float model where each tensor of ``encodings`` can be quantized and dequantized
    in place (float ops: Div, Round, Add, Clip, Sub, Mul) behind a Where on a boolean graph input;
    and the tensors so gated, in graph order. Graph outputs and tensors read inside subgraphs are
    left out (their readers cannot all be rewired here)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(float_proto)
    graph = proto.graph
    skip = {o.name for o in graph.output} | _subgraph_reads(graph)
    order = [o for n in graph.node for o in n.output if o in encodings and o not in skip]
    new_nodes: dict[str, list[onnx.NodeProto]] = {}
    renamed: dict[str, str] = {}
    for index, tensor in enumerate(order):
        scale, zero, bits = encodings[tensor]
        signed = zero is not None and zero.dtype.kind == "i"
        low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
        point = float(zero.ravel()[0]) if zero is not None else 0.0
        prefix = f"{GATE}{index}"
        graph.initializer.extend([
            numpy_helper.from_array(np.array(float(scale.ravel()[0]) or 1.0, np.float32), f"{prefix}_scale"),
            numpy_helper.from_array(np.array(point, np.float32), f"{prefix}_zero"),
            numpy_helper.from_array(np.array(low, np.float32), f"{prefix}_low"),
            numpy_helper.from_array(np.array(high, np.float32), f"{prefix}_high"),
        ])
        graph.input.append(helper.make_tensor_value_info(prefix, TensorProto.BOOL, []))
        gated = f"{prefix}_out"
        new_nodes[tensor] = [
            helper.make_node("Div", [tensor, f"{prefix}_scale"], [f"{prefix}_d"], name=f"{prefix}_div"),
            helper.make_node("Round", [f"{prefix}_d"], [f"{prefix}_r"], name=f"{prefix}_round"),
            helper.make_node("Add", [f"{prefix}_r", f"{prefix}_zero"], [f"{prefix}_a"], name=f"{prefix}_add"),
            helper.make_node("Clip", [f"{prefix}_a", f"{prefix}_low", f"{prefix}_high"], [f"{prefix}_q"],
                             name=f"{prefix}_clip"),
            helper.make_node("Sub", [f"{prefix}_q", f"{prefix}_zero"], [f"{prefix}_s"], name=f"{prefix}_sub"),
            helper.make_node("Mul", [f"{prefix}_s", f"{prefix}_scale"], [f"{prefix}_dq"], name=f"{prefix}_mul"),
            helper.make_node("Where", [prefix, f"{prefix}_dq", tensor], [gated], name=f"{prefix}_where"),
        ]
        renamed[tensor] = gated
    nodes = []
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name in renamed:
                node.input[position] = renamed[name]
        nodes.append(node)
        for output in node.output:
            nodes.extend(new_nodes.get(output, []))
    del graph.node[:]
    graph.node.extend(nodes)
    return proto, order


def _change(reference: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> float:
    """The largest relative L2 change over the float outputs."""
    worst = 0.0
    for name, value in reference.items():
        moved = other.get(name)
        if moved is None or value.dtype.kind != "f":
            continue
        a, b = value.astype(np.float64).ravel(), moved.astype(np.float64).ravel()
        if np.any(np.isfinite(a) & ~np.isfinite(b)):
            return NONFINITE_CHANGE
        finite = np.isfinite(a) & np.isfinite(b)
        norm = float(np.linalg.norm(a[finite]))
        worst = max(worst, float(np.linalg.norm(a[finite] - b[finite])) / norm if norm > 0 else 0.0)
    return worst


def tensor_sensitivity(float_model: Path, quant_model: Path, feeds: list[dict[str, np.ndarray]],
                       seconds: float, first: list[str] | None = None) -> list[tuple[str, float]]:
    """(tensor, change) for the activations ``quant_model`` quantizes, the largest change of the
    outputs first: each tensor quantized alone in the float model, on ``feeds``. The tensors named
    in ``first`` (the noise ranking's order) are run first, the others in graph order. No run
    starts after ``seconds``, and none may run past them: tensors not reached are left out (the
    caller orders them otherwise). Empty where the gated model cannot be written or run."""
    started = time.monotonic()
    if seconds <= 0:
        return []
    float_proto = onnx.load(str(float_model), load_external_data=False)
    produced = {o for n in float_proto.graph.node for o in n.output}
    encodings = activation_encodings(onnx.load(str(quant_model), load_external_data=False), produced)
    proto, order = gated_model(float_proto, encodings)
    if not order or not feeds:
        return []
    path = float_model.parent / (float_model.stem + ".gated.onnx")  # beside it: external data resolves
    position = {name: index for index, name in enumerate(order)}
    runs_order = [position[n] for n in dict.fromkeys(first or []) if n in position]
    named = set(runs_order)
    runs_order += [i for i in range(len(order)) if i not in named]
    off = {f"{GATE}{i}": np.array(False) for i in range(len(order))}

    def left() -> float:
        return seconds - (time.monotonic() - started)

    changes: dict[int, float] = {}
    try:
        onnx.save_model(proto, str(path))
        del proto, float_proto
        base = run_isolated(path, [{**feed, **off} for feed in feeds], timeout=max(left(), 1.0))
        if not base.ok:
            return []
        per_run = sum(np.asarray(v).nbytes for v in base.samples[0].values()) if base.samples else 0
        chunk_runs = max(1, min(CHUNK_RUNS, CHUNK_BYTES // max(per_run, 1)))
        runs = [(index, sample) for index in runs_order for sample in range(len(feeds))]
        for start in range(0, len(runs), chunk_runs):
            if left() <= 0:
                break
            chunk = runs[start:start + chunk_runs]
            batch = [{**feeds[sample], **off, f"{GATE}{index}": np.array(True)} for index, sample in chunk]
            outcome = run_isolated(path, batch, timeout=max(left(), 1.0))
            if not outcome.ok:
                break  # what was measured stands; the rest is left to the caller's order
            for (index, sample), outputs in zip(chunk, outcome.samples):
                changes[index] = max(changes.get(index, 0.0), _change(base.samples[sample], outputs))
    except (OSError, ValueError):  # the copy could not be written (disk, protobuf's 2 GB)
        return []
    finally:
        path.unlink(missing_ok=True)
    ranked = [(order[index], change) for index, change in changes.items()]
    ranked.sort(key=lambda item: -item[1])
    return ranked
