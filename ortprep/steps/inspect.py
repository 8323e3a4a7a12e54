"""inspect: what a model is made of, read from its graph alone (no weight bytes)."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from typing import Any

import onnx
from onnx import TypeProto, ValueInfoProto

from ortprep.version import __version__
from ortprep.findings import Finding
from ortprep.validity import checker_result, converter_defects
from ortprep.model import (
    ORT_CONTRIB_DOMAINS,
    STANDARD_DOMAINS,
    ModelHandle,
    dtype_name,
    iter_graphs,
    iter_nodes,
    iter_tensors,
    normalize_domain,
    tensor_elements,
    tensor_nbytes,
    text_of,
)
from ortprep.runtime.compat import runtime_findings
from ortprep.report import StepResult
from ortprep.steps.base import Step, StepContext
from ortprep.options import InspectOptions

log = logging.getLogger(__name__)

SCHEMA = "ortprep.inspect/1"


def describe_type(type_proto: TypeProto) -> dict[str, Any]:
    """{"kind", "dtype", "shape"}: shape is a list of ints (fixed), strings (named symbolic dims)
    and nulls (unnamed dynamic dims), or null when the rank is unknown."""
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        tensor_type = getattr(type_proto, kind)
        shape = None
        if tensor_type.HasField("shape"):
            shape = [
                dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None) for dim in tensor_type.shape.dim
            ]
        return {
            "kind": "tensor" if kind == "tensor_type" else "sparse_tensor",
            "dtype": dtype_name(tensor_type.elem_type),
            "shape": shape,
        }
    if kind == "sequence_type":
        inner = describe_type(type_proto.sequence_type.elem_type)
        return {"kind": f"sequence({inner['kind']})", "dtype": inner["dtype"], "shape": inner["shape"]}
    if kind == "optional_type":
        inner = describe_type(type_proto.optional_type.elem_type)
        return {"kind": f"optional({inner['kind']})", "dtype": inner["dtype"], "shape": inner["shape"]}
    if kind == "map_type":
        value = describe_type(type_proto.map_type.value_type)
        return {
            "kind": f"map({dtype_name(type_proto.map_type.key_type)},{value['kind']})",
            "dtype": value["dtype"],
            "shape": value["shape"],
        }
    return {"kind": "unknown", "dtype": None, "shape": None}


def describe_value(value: ValueInfoProto) -> dict[str, Any]:
    return {"name": value.name, **describe_type(value.type)}


def _graph_inputs(handle: ModelHandle) -> list[ValueInfoProto]:
    # Before IR 4, initializers were also listed as graph inputs; they are not real inputs.
    initializer_names = {t.name for t in handle.graph.initializer}
    return [value for value in handle.graph.input if value.name not in initializer_names]


def _node_counts(handle: ModelHandle) -> dict[str, int]:
    graphs = list(iter_graphs(handle.graph))
    total = sum(len(g.node) for _, g in graphs)
    top = len(handle.graph.node)
    return {"total": total, "top_level": top, "in_subgraphs": total - top, "subgraphs": len(graphs) - 1}


def _op_histogram(handle: ModelHandle) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for _, node in iter_nodes(handle.graph):
        counts[normalize_domain(node.domain)][node.op_type] += 1
    return {
        domain: dict(sorted(ops.items(), key=lambda item: (-item[1], item[0])))
        for domain, ops in sorted(counts.items(), key=lambda item: (item[0] != "ai.onnx", item[0]))
    }


def _initializer_stats(handle: ModelHandle) -> tuple[dict[str, dict[str, int]], int, dict[str, int]]:
    """(per-dtype {count, bytes} of initializers, parameter count, Constant-node tensor totals)."""
    by_dtype: dict[str, dict[str, int]] = defaultdict(lambda: {"count": 0, "bytes": 0})
    parameters = 0
    constants = {"count": 0, "bytes": 0}
    for stored in iter_tensors(handle.graph):
        if stored.is_initializer:
            entry = by_dtype[dtype_name(stored.tensor.data_type)]
            entry["count"] += 1
            entry["bytes"] += tensor_nbytes(stored.tensor)
            parameters += tensor_elements(stored.tensor)
        else:
            constants["count"] += 1
            constants["bytes"] += tensor_nbytes(stored.tensor)
    ordered = dict(sorted(by_dtype.items(), key=lambda item: -item[1]["bytes"]))
    return ordered, parameters, constants


def _runtime_facts() -> dict[str, Any]:
    from ortprep.runtime.providers import (
        import_ort,
        installed_ort_distributions,
        ort_max_ir,
        ort_max_opset,
    )

    ort = import_ort()
    return {
        "ortprep": __version__,
        "onnx": onnx.__version__,
        "onnx_max_opset": onnx.defs.onnx_opset_version(),
        "onnx_ir_version": onnx.IR_VERSION,
        "onnxruntime": getattr(ort, "__version__", None) if ort else None,
        "onnxruntime_distributions": [d.name for d in installed_ort_distributions()],
        "ort_max_opset": ort_max_opset(),
        "ort_max_ir_version": ort_max_ir(),
    }


def _findings(handle: ModelHandle, data: dict[str, Any], ort_version: str | None = None) -> list[Finding]:
    findings: list[Finding] = []
    runtime = data["runtime"]
    opsets = data["opsets"]
    default_opset = opsets.get("ai.onnx")
    if not data["checker"]["passed"]:
        findings.append(
            Finding.of(
                "MOD001",
                f"onnx.checker rejects the model: {data['checker']['error']}",
                fix="re-export the model, or fix the node the checker names",
                source="onnx.checker",
            )
        )
    if default_opset is None and "ai.onnx" in data["op_histogram"]:
        findings.append(
            Finding.of(
                "MOD008",
                "nodes use the default ONNX domain but the model imports no opset for it",
                fix="re-export with an explicit opset (e.g. torch.onnx.export(..., opset_version=17))",
            )
        )
    findings.extend(runtime_findings(data["ir_version"], default_opset, ort_version))
    findings.extend(converter_defects(handle))
    if default_opset is not None:
        if default_opset > runtime["onnx_max_opset"]:
            findings.append(
                Finding.of(
                    "MOD003",
                    f"model uses opset {default_opset}; the installed onnx {runtime['onnx']} knows up to "
                    f"{runtime['onnx_max_opset']}, so checks and shape inference may be incomplete",
                    fix="pip install --upgrade onnx",
                    source="onnx.defs.onnx_opset_version()",
                )
            )
    if data["ir_version"] > runtime["onnx_ir_version"]:
        findings.append(
            Finding.of(
                "MOD007",
                f"model IR version {data['ir_version']} is newer than the installed onnx supports "
                f"({runtime['onnx_ir_version']})",
                fix="pip install --upgrade onnx",
            )
        )
    if runtime["onnxruntime"] is None:
        from ortprep.runtime.providers import INSTALL_HINT

        findings.append(
            Finding.of("MOD006", "ONNX Runtime is not installed; runtime facts are missing", fix=INSTALL_HINT)
        )
    for domain in data["custom_domains"]:
        ops = ", ".join(data["op_histogram"].get(domain, {}))
        if domain in ORT_CONTRIB_DOMAINS:
            findings.append(
                Finding.of(
                    "MOD005",
                    f"ops of ONNX Runtime's contrib domain '{domain}' ({ops}) run on ONNX Runtime only, "
                    "and only on EPs that implement them",
                    fix="run ortprep check MODEL --ep EP to see which EPs take them",
                )
            )
        else:
            findings.append(
                Finding.of(
                    "MOD004",
                    f"ops of custom domain '{domain}' ({ops or 'no nodes'}) need a custom-op library at run time",
                    fix="register the library that implements them (SessionOptions.register_custom_ops_library), "
                    "or replace them with standard ONNX ops",
                )
            )
    return findings


def inspect_model(handle: ModelHandle, *, hash_data: bool = False, ort_version: str | None = None) -> StepResult:
    """Describe a model: IR, opsets, I/O, node and op counts, weights, external data, checker result."""
    proto = handle.proto
    opsets = handle.opsets()
    histogram = _op_histogram(handle)
    used_domains = set(histogram) | set(opsets)
    custom_domains = sorted(d for d in used_domains if d not in STANDARD_DOMAINS)
    by_dtype, parameters, constants = _initializer_stats(handle)
    passed, error = checker_result(handle)
    data: dict[str, Any] = {
        "model": {
            "path": str(handle.path) if handle.path else None,
            "size": handle.path.stat().st_size if handle.path else proto.ByteSize(),
            "sha256": handle.sha256(include_data=hash_data),
        },
        "ir_version": proto.ir_version,
        "opsets": opsets,
        "producer": {"name": text_of(proto.producer_name), "version": text_of(proto.producer_version)},
        "graph_name": text_of(proto.graph.name),
        "inputs": [describe_value(v) for v in _graph_inputs(handle)],
        "outputs": [describe_value(v) for v in proto.graph.output],
        "nodes": _node_counts(handle),
        "op_histogram": histogram,
        "custom_domains": custom_domains,
        "initializers": by_dtype,
        "constant_nodes": constants,
        "parameters": parameters,
        "external_data": [
            {"location": f.location, "size": f.size, "tensors": f.tensors, "bytes_referenced": f.bytes_referenced}
            for f in handle.external_files
        ],
        "metadata": {text_of(prop.key): text_of(prop.value) for prop in proto.metadata_props},
        "checker": {"passed": passed, "error": error},
        "runtime": _runtime_facts(),
    }
    report = StepResult(step="inspect", schema=SCHEMA, data=data)
    for finding in _findings(handle, data, ort_version):
        report.add(finding)
    return report


class InspectStep(Step):
    name = "inspect"
    Options = InspectOptions

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        return inspect_model(model, hash_data=self.options.hash_data, ort_version=self.options.ort_version)
