"""Measure an EP's operator support instead of transcribing it: every single-op test model that
onnx ships (onnx.backend.test.case.node, ~1,900 cases over ~200 ops, each with typical attributes,
its own opset and real inputs) is loaded on the real EP with CPU fallback allowed and the
assignment record on, and run once. For QNN each float case is also wrapped in Q/DQ (uint8), the
form the HTP backend is built for. What the EP claimed and ran becomes the measured table.

    .venv/bin/python tools/probe_ep_ops.py qnn
    .venv/bin/python tools/probe_ep_ops.py openvino-cpu --runtime .venv-openvino/bin/python

Writes ortprep/eps/data/measured/<ep>.json (read by ortprep.eps.tables, which then prefers the
measurement over the documented table for that EP) and docs/measured-<ep>.md (where the two
disagree). Rerun it whenever the EP package updates.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ortprep.eps.registry import resolve_ep  # noqa: E402
from ortprep.eps.tables import load_documented_table  # noqa: E402
from ortprep.runtime.requests import OpProbe  # noqa: E402
from ortprep.runtime.worker import workers_scope  # noqa: E402
from ortprep.options import LoadOptions  # noqa: E402
from ortprep.runtime.targets import ep_runtime, session_options  # noqa: E402

BATCH = 40  # progress is reported every BATCH models


def cases(max_opset: int) -> list[dict]:
    """Single-node test cases whose opset the runtime loads, with their first data set."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        testcases = collect_testcases(None)
    for case in testcases:
        model = case.model
        if "expanded" in case.name or len(model.graph.node) != 1 or not case.data_sets:
            continue
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
        if opset is None or opset > max_opset:
            continue
        inputs = case.data_sets[0][0]
        if not all(isinstance(value, np.ndarray) for value in inputs):
            continue  # sequences, optionals: not a tensor feed
        node = model.graph.node[0]
        if not node.name:
            node.name = "probe"
        base = {"name": case.name, "inputs": inputs, "outputs": case.data_sets[0][1], "op": node.op_type,
                "domain": node.domain or "ai.onnx", "opset": opset}
        found.append({**base, "model": model, "constant_params": False})
        if len(model.graph.input) > 1:
            # The form models use: the data input fed at run time, the others (weights, scales,
            # shapes) constant initializers, as EPs such as QNN require.
            found.append(
                {**base, "model": _params_constant(model, inputs), "inputs": inputs[:1], "constant_params": True}
            )
    return found


def _params_constant(model: onnx.ModelProto, inputs: list[np.ndarray]) -> onnx.ModelProto:
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    for value, data in list(zip(graph.input, inputs))[1:]:
        graph.initializer.append(numpy_helper.from_array(data, value.name))
    keep = graph.input[0]
    del graph.input[:]
    graph.input.append(keep)
    return result


def _qparams(values: np.ndarray) -> tuple[float, int]:
    finite = values[np.isfinite(values)] if values.size else values
    if finite.size == 0:
        return 1.0, 128
    low, high = float(min(finite.min(), 0.0)), float(max(finite.max(), 0.0))
    scale = (high - low) / 255.0 or 1.0
    return scale, int(min(255, max(0, round(-low / scale))))


def qdq_wrapped(case: dict) -> onnx.ModelProto | None:
    """The case with every float32 graph input and output passed through QuantizeLinear ->
    DequantizeLinear (uint8), so the op sits between DQ and Q as in a QDQ model."""
    model = onnx.ModelProto()
    model.CopyFrom(case["model"])
    graph = model.graph
    node = graph.node[0]
    weights = _quantize_initializers(graph, node)
    floats_in = [
        (i, value) for i, value in enumerate(graph.input) if value.type.tensor_type.elem_type == TensorProto.FLOAT
    ]
    floats_out = [
        (i, value) for i, value in enumerate(graph.output) if value.type.tensor_type.elem_type == TensorProto.FLOAT
    ]
    if not floats_in or len(floats_out) != len(graph.output) or case["opset"] < 13:
        return None
    new_nodes = []
    for index, value in floats_in:
        scale, zero = _qparams(case["inputs"][index])
        graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), f"{value.name}_s"),
                                  numpy_helper.from_array(np.array(zero, np.uint8), f"{value.name}_z")])
        new_nodes += [
            helper.make_node("QuantizeLinear", [value.name, f"{value.name}_s", f"{value.name}_z"], [f"{value.name}_q"]),
            helper.make_node(
                "DequantizeLinear", [f"{value.name}_q", f"{value.name}_s", f"{value.name}_z"], [f"{value.name}_dq"]
            ),
        ]
        for position, name in enumerate(node.input):
            if name == value.name:
                node.input[position] = f"{value.name}_dq"
    tail = []
    for index, value in floats_out:
        reference = (
            case["outputs"][index]
            if index < len(case["outputs"]) and isinstance(case["outputs"][index], np.ndarray)
            else None
        )
        if reference is None or reference.size == 0:
            return None
        scale, zero = _qparams(reference.astype(np.float32))
        inner = f"{value.name}_f"
        for position, name in enumerate(node.output):
            if name == value.name:
                node.output[position] = inner
        graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), f"{value.name}_os"),
                                  numpy_helper.from_array(np.array(zero, np.uint8), f"{value.name}_oz")])
        tail += [
            helper.make_node("QuantizeLinear", [inner, f"{value.name}_os", f"{value.name}_oz"], [f"{value.name}_oq"]),
            helper.make_node(
                "DequantizeLinear", [f"{value.name}_oq", f"{value.name}_os", f"{value.name}_oz"], [value.name]
            ),
        ]
    nodes = weights + new_nodes + [node] + tail
    del graph.node[:]
    graph.node.extend(nodes)
    return model


BIAS_OPS = ("Conv", "ConvTranspose", "Gemm")


def _quantize_initializers(graph, node) -> list:
    """Float initializers the node reads become uint8 (int32 for a Conv/Gemm bias) + DequantizeLinear."""
    by_name = {t.name: t for t in graph.initializer}
    added = []
    input_scale = None
    for position, name in enumerate(list(node.input)):
        tensor = by_name.get(name)
        if tensor is None or tensor.data_type != TensorProto.FLOAT:
            continue
        values = numpy_helper.to_array(tensor)
        if node.op_type in BIAS_OPS and position == 2:
            scale = (input_scale or 1.0) * 0.02
            quantized = np.round(values / scale).astype(np.int32)
            zero = np.array(0, np.int32)
        else:
            scale, zero_point = _qparams(values)
            quantized = np.clip(np.round(values / scale) + zero_point, 0, 255).astype(np.uint8)
            zero = np.array(zero_point, np.uint8)
            input_scale = scale if position == 1 else input_scale
        graph.initializer.remove(tensor)
        graph.initializer.extend([numpy_helper.from_array(quantized, f"{name}_wq"),
                                  numpy_helper.from_array(np.array(scale, np.float32), f"{name}_ws"),
                                  numpy_helper.from_array(zero, f"{name}_wz")])
        added.append(helper.make_node("DequantizeLinear", [f"{name}_wq", f"{name}_ws", f"{name}_wz"], [f"{name}_wdq"]))
        node.input[position] = f"{name}_wdq"
    return added


def run_probes(spec, target, options: LoadOptions, work: Path, models: list[dict]) -> dict[str, dict]:
    """One OpProbe request per model, on a worker of the EP's interpreter that lives for the whole
    probe; a worker that dies loses only the model it died on (the next one starts afresh)."""
    results: dict[str, dict] = {}
    provider_options = session_options(target, options.provider_options)
    with workers_scope() as pool:
        for model in models:
            with np.load(
                model["inputs"], allow_pickle=True
            ) as data:  # written by this tool (string inputs are object arrays)
                feeds = {key: data[key] for key in data.files}
            request = OpProbe(model=model["path"], op=model["op"], feeds=feeds, provider=spec.provider,
                              provider_options=provider_options, plugin=target.plugin)
            reply = pool.call(request, python=target.python, timeout=60)
            if reply.status in ("crashed", "timeout"):
                results[model["id"]] = {"id": model["id"], "claimed": False, "ran": False,
                                        "error": f"the process died on it ({reply.died})"}
            else:
                results[model["id"]] = {
                    "id": model["id"],
                    "claimed": reply.claimed,
                    "ran": reply.ran,
                    "error": reply.error,
                }
            if len(results) % BATCH == 0:
                print(f"  {len(results)} probed", file=sys.stderr, flush=True)
    return results


def summarize(probes: list[dict], results: dict[str, dict]) -> dict[str, dict]:
    ops: dict[str, dict] = defaultdict(
        lambda: {
            "probes": 0,
            "claimed": 0,
            "ran": 0,
            "qdq_probes": 0,
            "qdq_claimed": 0,
            "qdq_ran": 0,
            "dtypes_ran": set(),
            "dtypes_failed": set(),
            "reasons": [],
        }
    )
    for probe in probes:
        result = results.get(probe["id"], {})
        entry = ops[f"{probe['domain']}:{probe['op']}"]
        prefix = "qdq_" if probe["qdq"] else ""
        entry[prefix + "probes"] += 1
        entry[prefix + "claimed"] += int(bool(result.get("claimed")))
        entry[prefix + "ran"] += int(bool(result.get("claimed")) and bool(result.get("ran")))
        if not probe["qdq"]:
            (entry["dtypes_ran"] if result.get("claimed") and result.get("ran") else entry["dtypes_failed"]).add(
                probe["dtype"]
            )
        if result.get("error") and len(entry["reasons"]) < 3 and result["error"] not in entry["reasons"]:
            entry["reasons"].append(result["error"])
    return {
        op: {**e, "dtypes_ran": sorted(e["dtypes_ran"]), "dtypes_failed": sorted(e["dtypes_failed"] - e["dtypes_ran"])}
        for op, e in sorted(ops.items())
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ep", help="qnn or openvino-cpu")
    parser.add_argument("--runtime", help="Python of the environment that has the EP (openvino-cpu)")
    parser.add_argument("--limit", type=int, default=0, help="probe only the first N cases (a quick look)")
    args = parser.parse_args()
    spec = resolve_ep(args.ep)
    options = LoadOptions(runtimes={spec.name: Path(args.runtime)} if args.runtime else {})
    target = ep_runtime(spec, options.runtimes)
    if not target.available:
        print(f"{spec.name} is not available here: {target.probe.error or 'no device'}", file=sys.stderr)
        return 3
    from ortprep.eps.ort_releases import release_limits

    max_opset = release_limits(target.probe.version)["max_opset"]
    found = cases(max_opset)[: args.limit or None]
    probes = []
    with tempfile.TemporaryDirectory(prefix="ortprep-opprobe-") as tmp:
        work = Path(tmp)
        for index, case in enumerate(found):
            variants = [(False, case["model"])]
            if spec.name == "qnn":
                wrapped = qdq_wrapped(case)
                if wrapped is not None:
                    variants.append((True, wrapped))
            for qdq, model in variants:
                model_id = f"{index}{'q' if qdq else ''}"
                path = work / f"{model_id}.onnx"
                onnx.save(model, str(path))
                np.savez(
                    work / f"{model_id}.npz",
                    **{v.name: value for v, value in zip(case["model"].graph.input, case["inputs"])},
                )
                dtype = helper.tensor_dtype_to_np_dtype(case["model"].graph.input[0].type.tensor_type.elem_type).name \
                    if case["model"].graph.input and case["model"].graph.input[0].type.tensor_type.elem_type else "?"
                probes.append(
                    {
                        "id": model_id,
                        "path": str(path),
                        "inputs": str(work / f"{model_id}.npz"),
                        "node": model.graph.node[len(model.graph.node) // 2 if qdq else 0].name or "probe",
                        "op": case["op"],
                        "domain": case["domain"],
                        "qdq": qdq,
                        "dtype": dtype,
                        "case": case["name"],
                    }
                )
        for probe in probes:  # the op's own node in a wrapped model is the one between the Q/DQ pairs
            if probe["qdq"]:
                wrapped = onnx.load(probe["path"])
                probe["node"] = next(n.name for n in wrapped.graph.node if n.op_type == probe["op"])
        results = run_probes(spec, target, options, work, probes)
    package = (
        target.plugin["package"]
        if target.plugin
        else f"onnxruntime {target.probe.version} ({target.python or 'this environment'})"
    )
    measured = {
        "ep": spec.name,
        "source": {
            "what": "measured by tools/probe_ep_ops.py: onnx's single-op test cases loaded and run on the EP",
            "package": package,
            "onnxruntime": target.probe.version,
            "onnx": onnx.__version__,
            "backend": "HTP (x86 simulator)" if spec.name == "qnn" else spec.session_options.get("device_type", ""),
            "date": datetime.date.today().isoformat(),
            "cases": len(found),
            "probes": len(probes),
            # QNN's outcome depends on the SoC (soc_model): the table holds for the device probed
            "provider_options": session_options(target, options.provider_options),
        },
        "ops": summarize(probes, results),
    }
    out = ROOT / "ortprep" / "eps" / "data" / "measured" / f"{spec.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(measured, indent=1) + "\n")
    write_diff(spec.name, measured)
    print(f"wrote {out.relative_to(ROOT)}: {len(measured['ops'])} ops from {len(probes)} probes")
    return 0


def write_diff(ep: str, measured: dict) -> None:
    """docs/measured-<ep>.md: where the measurement and the documented table disagree."""
    documented = load_documented_table(ep)
    doc_ops = {f"{e.domain}:{e.op}" for entries in documented.entries.values() for e in entries}
    taken = {op for op, e in measured["ops"].items() if e["ran"] or e["qdq_ran"]}
    probed = set(measured["ops"])
    never = sorted(op for op in probed & doc_ops if op not in taken)
    extra = sorted(taken - doc_ops)
    qdq_only = sorted(op for op, e in measured["ops"].items() if e["qdq_ran"] and not e["ran"])
    float_only = sorted(op for op, e in measured["ops"].items() if e["ran"] and e["qdq_probes"] and not e["qdq_ran"])
    source = measured["source"]
    lines = [f"# {ep}: measured against documented", "",
             f"Generated by `tools/probe_ep_ops.py {ep}` on {source['date']} with {source['package']} "
             f"(onnxruntime {source['onnxruntime']}, backend {source['backend'] or '-'}): {source['cases']} single-op "
             f"cases of onnx {source['onnx']}, {source['probes']} sessions. `check --ep {ep}` uses the measurement for "
             "the ops it covers and the documented table for the rest.", "",
             f"- ops probed: {len(probed)}; taken and run by the EP in at least one case: {len(taken)}",
             f"- documented as supported but never taken in any probe ({len(never)}): " + (", ".join(never) or "none"),
             f"- taken although the documented table lacks them ({len(extra)}): " + (", ".join(extra) or "none")]
    if ep == "qnn":
        lines += [f"- taken only inside Q/DQ ({len(qdq_only)}): " + (", ".join(qdq_only) or "none"),
                  f"- taken as float but not inside Q/DQ ({len(float_only)}): " + (", ".join(float_only) or "none")]
    lines += [
        "",
        "| op | probes | taken and ran | Q/DQ probes | Q/DQ taken and ran | dtypes that ran | first reason seen |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for op, e in measured["ops"].items():
        reason = (e["reasons"][0][:120].replace("|", "/") if e["reasons"] else "")
        lines.append(f"| {op} | {e['probes']} | {e['ran']} | {e['qdq_probes']} | {e['qdq_ran']} | "
                     f"{', '.join(e['dtypes_ran']) or '-'} | {reason} |")
    (ROOT / "docs" / f"measured-{ep}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
