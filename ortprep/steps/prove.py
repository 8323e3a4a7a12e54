"""Proven verdicts (`check --prove`): where an EP runs here, the session a user's application
would create is built on a worker, and its outcome is the verdict: the EP's own placement next
to the tables' prediction, or, when the session cannot be created, "none" with the EP's words.

A QNN session that fails at graph finalize is tried once more for a named device (soc_model 60,
Snapdragon X Elite): the HTP simulator's default SoC refuses float patterns that real devices
finalize (measured with onnxruntime 1.32 + onnxruntime-qnn 2.7.0: a depthwise Conv with strides
[2, 1] fails on the default SoC and finalizes with soc_model 60), so the fix, when it works, is a
provider option the application sets, and the report says so.
"""

from __future__ import annotations

import os
from typing import Any

from ortprep.analysis import ModelAnalysis, skeleton
from ortprep.eps.registry import EpSpec, resolve_ep
from ortprep.findings import Finding
from ortprep.model import ModelHandle
from ortprep.options import CheckOptions
from ortprep.report import StepResult
from ortprep.runtime.kernels import support_table
from ortprep.runtime.targets import ep_runtime, session_options

# A device to try when QNN's simulator refuses a graph at finalize (see the module's docstring).
QNN_RETRY_DEVICE = {"soc_model": "60"}
QNN_RETRY_NAME = "Snapdragon X Elite (soc_model 60)"


def compare_prediction(analysis: ModelAnalysis, spec: EpSpec, predicted: dict[str, Any], assignment: dict[str, str],
                       subgraphs: list[list]) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """A target's predicted record (check) next to a real session's assignment for the same file:
    (the comparison, the differing nodes as (node, op type, what differs))."""
    predicted_fallback = set(predicted["fallback_nodes"])
    op_of = {node.name: node.op_type for node in analysis.all_nodes()}
    compared = agree = 0
    differing_ops: dict[str, int] = {}
    differing = []
    for node, ep in sorted(assignment.items()):
        if node not in op_of:
            continue  # a node the optimizer made; check never saw it
        compared += 1
        on_cpu = ep == "CPUExecutionProvider" and spec.provider != "CPUExecutionProvider"
        if on_cpu == (node in predicted_fallback):
            agree += 1
            continue
        differing_ops[op_of[node]] = differing_ops.get(op_of[node], 0) + 1
        differing.append((node, op_of[node], f"node '{node}' ({op_of[node]}) ran on the CPU, but check predicted it on "
                          f"{spec.name}" if on_cpu else f"node '{node}' ({op_of[node]}) ran on {ep}, but check predicted "
                          "a CPU fallback"))
    on_ep = sum(1 for ep in assignment.values() if ep == spec.provider)
    actual_verdict = "none" if on_ep == 0 else "full" if on_ep == len(assignment) else "partial"
    if support_table(spec.name).granularity == "kernel":
        # A kernel EP (CUDA, DirectML, XNNPACK) lists each node as its own subgraph in the record; its
        # partitions are the groups its nodes form, counted the way check counts them.
        actual_partitions = _kernel_partitions(analysis, assignment, spec.provider)
    else:
        actual_partitions = sum(1 for ep, _ in subgraphs if ep == spec.provider)
    comparison = {
        "nodes_compared": compared,
        "node_agreement": round(agree / compared, 4) if compared else None,
        "predicted_partitions": predicted["partitions"],
        "actual_partitions": actual_partitions,
        "predicted_verdict": predicted["verdict"],
        "actual_verdict": actual_verdict,
        "differing_op_types": dict(sorted(differing_ops.items(), key=lambda kv: -kv[1])),
    }
    return comparison, differing


def _kernel_partitions(analysis: ModelAnalysis, assignment: dict[str, str], provider: str) -> int:
    from ortprep.eps.partition import CPU, FOLDED, partition_graph

    total = 0
    for graph in analysis.graphs:
        placed = [FOLDED if node.name not in assignment else (0 if assignment[node.name] == provider else CPU)
                  for node in graph.nodes]
        total += partition_graph(graph.graph, placed).partitions
    return total


def prove_targets(analysis: ModelAnalysis, result: StepResult, options: CheckOptions) -> None:
    """Build each target's real session where its EP runs here and make its outcome the verdict
    (``results[].proof``, ``results[].predicted_verdict``); findings PRV001-PRV003. ``analysis`` is
    the one check predicted from."""
    from ortprep.runtime.requests import Prove
    from ortprep.runtime.worker import call

    handle = analysis.handle
    for record in result.data["results"]:
        label = record["ep"]
        record["predicted_verdict"] = record["verdict"]
        if "," in label:
            record["proof"] = {"status": "not proven", "message": "a priority list of several EPs; prove each EP alone"}
            continue
        spec = resolve_ep(label)
        target = ep_runtime(spec, options.runtimes)
        if not target.available:
            where = f"the environment of {target.python}" if target.python else "this environment"
            record["proof"] = {"status": "unavailable", "message": f"{spec.provider} does not run in {where}"}
            result.add(Finding.of("PRV003", f"{label}: the EP does not run here, so the verdict stays a prediction",
                                  ep=label, target=label, fix=spec.install_hint))
            continue
        chosen = session_options(target, options.provider_options)
        qnn = spec.provider == "QNNExecutionProvider"

        def session(provider_options: dict[str, str]):
            return call(Prove(model=os.path.abspath(handle.path), provider=spec.provider, provider_options=provider_options,
                              plugin=target.plugin, verbose_record=qnn),
                        python=target.python, timeout=options.timeout)

        reply = session(chosen)
        proof: dict[str, Any] = {"status": "created" if reply.ok else reply.status, "provider_options": chosen}
        record["proof"] = proof
        if not reply.ok:
            proof["message"] = reply.message
            record["verdict"] = "none"
            fix = f"ortprep load MODEL --ep {label} shows the same failure with its log"
            culprit_text = ""
            if reply.status == "failed":
                def fails(path: str) -> tuple[bool, str]:
                    probe = call(Prove(model=path, provider=spec.provider, provider_options=chosen, plugin=target.plugin),
                                 python=target.python, timeout=options.timeout)
                    return probe.status == "failed", probe.message

                culprit = reduce_failure(handle, fails)
                if culprit is not None:
                    proof["culprit"] = culprit
                    if culprit["nodes"]:
                        culprit_text = "; the smallest run of nodes that fails alone: " + ", ".join(
                            f"{n['name']} ({n['op_type']} {', '.join(n['inputs'])}"
                            + (f", strides {n['attributes']['strides']}" if "strides" in n["attributes"] else "") + ")"
                            for n in culprit["nodes"][:5]) + f" ({culprit['probes']} probe sessions, {culprit['seconds']} s)"
            if qnn and "finalize" in reply.message.lower() and "soc_model" not in chosen:
                # Its own worker (the request's affinity): QNN keeps one HTP backend per process and the first
                # session's SoC sticks, so a soc_model 60 session must not share a process with default ones.
                retry = session({**chosen, **QNN_RETRY_DEVICE})
                proof["retry"] = {"device": QNN_RETRY_NAME, "provider_options": QNN_RETRY_DEVICE, "created": retry.ok,
                                  "message": "" if retry.ok else retry.message}
                if retry.ok:
                    fix = (f"name the device: the session is created for {QNN_RETRY_NAME}; set soc_model=60 in your "
                           f"application's QNN options, and prove it: ortprep check MODEL --ep qnn --prove "
                           f"--provider-option qnn:soc_model=60")
            result.add(Finding.of("PRV002", f"{label}: the real session is not created ({reply.message}); check "
                                  f"predicted '{record['predicted_verdict']}'{culprit_text}", ep=label, target=label, fix=fix))
            continue
        default = reply.placement.get("default", {})
        assignment, subgraphs = default.get("assignment", {}), default.get("subgraphs", [])
        comparison, differing = compare_prediction(analysis, spec, record, assignment, subgraphs)
        proof.update(nodes_total=len(assignment), nodes_on_ep=sum(1 for ep in assignment.values() if ep == spec.provider),
                     fallback_nodes=sorted(node for node, ep in assignment.items() if ep != spec.provider),
                     comparison=comparison)
        record["verdict"] = comparison["actual_verdict"]
        # The tables' findings that the real session contradicts go: a node they sent to the CPU that
        # the EP took, and the coverage finding of a target the EP takes whole. PRV001 names them.
        on_ep = {node for node, ep in assignment.items() if ep == spec.provider}
        result.findings = [f for f in result.findings if f.target != label or not (
            (f.code.startswith("EP") and f.node in on_ep)
            or (f.code in ("EP006", "EP007") and comparison["actual_verdict"] == "full"))]
        if differing or comparison["actual_verdict"] != comparison["predicted_verdict"]:
            shown = ", ".join(node for node, _, _ in differing[:5]) + (", ..." if len(differing) > 5 else "")
            result.add(Finding.of(
                "PRV001", f"{label}: the real session's verdict is '{comparison['actual_verdict']}' (check predicted "
                f"'{comparison['predicted_verdict']}'); {len(differing)} node(s) placed otherwise"
                + (f": {shown}" if shown else ""), ep=label, target=label,
                fix="the proven verdict counts; please report the model so the tables learn it"))


# At most this many probe sessions when a session is reduced to its culprit (each 0.2-0.4 s on the
# QNN simulator, measured): two binary searches over the node order need 2 * log2(nodes).
MAX_PROBES = 40


def window_model(proto, start: int, end: int, shapes: dict[str, Any]):
    """The main graph's nodes start..end (inclusive, node order) as a model of their own: what
    they read from outside becomes a graph input (typed from shape inference), what they make and
    something after them (or the graph) reads becomes an output. None when a value's type is unknown."""
    from onnx import ModelProto, helper

    nodes = list(proto.graph.node)[start:end + 1]
    made = {out for node in nodes for out in node.output if out}
    initializers = {t.name: t for t in proto.graph.initializer}
    needed, inputs = [], []
    for node in nodes:
        for name in node.input:
            if name and name not in made and name not in needed:
                needed.append(name)
    for name in needed:
        if name in initializers:
            continue
        if name not in shapes:
            return None
        inputs.append(shapes[name])
    later = {name for node in list(proto.graph.node)[end + 1:] for name in node.input} | {o.name for o in proto.graph.output}
    outputs = [shapes[name] if name in shapes else helper.make_empty_tensor_value_info(name)
               for node in nodes for name in node.output if name and name in later]
    if not outputs:
        outputs = [shapes.get(nodes[-1].output[0]) or helper.make_empty_tensor_value_info(nodes[-1].output[0])]
    graph = helper.make_graph(nodes, "window", inputs, outputs, [initializers[n] for n in needed if n in initializers])
    model = ModelProto()
    model.CopyFrom(helper.make_model(graph, opset_imports=list(proto.opset_import), ir_version=proto.ir_version))
    return model


def reduce_failure(handle: ModelHandle, fails) -> dict[str, Any] | None:
    """The shortest run of nodes (in node order) whose own session still fails, found by two
    binary searches: the first end at which a prefix fails, then the last start at which the
    window up to that end still fails. ``fails(model_path)`` builds the session and answers
    (failed?, message). Bounded by MAX_PROBES sessions; None when the graph cannot be cut
    (control flow, values of unknown type) or no window fails alone."""
    import tempfile
    import time

    import onnx

    proto = handle.proto
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in proto.graph.node for a in n.attribute):
        return None
    inferred = onnx.shape_inference.infer_shapes(skeleton(proto))  # types only: no weight bytes copied
    shapes = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    weights = {t.name: onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in proto.graph.initializer}
    count = len(proto.graph.node)
    started, probes, messages = time.perf_counter(), [0], {}
    with tempfile.TemporaryDirectory(prefix="ortprep-reduce-") as tmp:

        def probe(start: int, end: int) -> bool:
            if probes[0] >= MAX_PROBES:
                raise TimeoutError
            model = window_model(proto, start, end, shapes)
            if model is None:
                return False
            path = f"{tmp}/w{start}_{end}.onnx"
            onnx.save(model, path)
            probes[0] += 1
            failed, message = fails(path)
            if failed:
                messages[(start, end)] = message
            return failed

        try:
            low, high = 0, count - 1  # the first end whose prefix fails
            if not probe(0, high):
                return None
            while low < high:
                middle = (low + high) // 2
                if probe(0, middle):
                    high = middle
                else:
                    low = middle + 1
            end = high
            low, high = 0, end  # the last start whose window to `end` still fails
            while low < high:
                middle = (low + high + 1) // 2
                if probe(middle, end):
                    low = middle
                else:
                    high = middle - 1
            start = low
        except TimeoutError:
            return {"nodes": [], "probes": probes[0], "seconds": round(time.perf_counter() - started, 2),
                    "stopped": f"after {MAX_PROBES} probe sessions"}
    nodes = list(proto.graph.node)[start:end + 1]
    described = []
    for node in nodes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        described.append({"name": node.name, "op_type": node.op_type,
                          "attributes": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in attrs.items()
                                         if isinstance(v, (int, float, str, list, tuple))},
                          "inputs": [_describe(shapes.get(name) or weights.get(name)) for name in node.input if name]})
    message = messages.get((start, end)) or next(iter(messages.values()), "")
    return {"nodes": described, "probes": probes[0], "seconds": round(time.perf_counter() - started, 2), "message": message}


def _describe(value) -> str:
    """dtype[dims] of a value_info, or "?"."""
    if value is None or not value.type.HasField("tensor_type"):
        return "?"
    import onnx

    tensor = value.type.tensor_type
    dims = ",".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim)
    return f"{onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else '?'}[{dims}]"
