"""Constraints beyond op tables: DirectML fusion and support queries, NPU precision and shape
rules, QNN quantization, TensorRT opsets, and EP combinations in one session (QNN's node rules:
qnn_rules.py; the verdict a rule gives: verdict.py).

Each rule names its fact's id from the constraints table (``DML-008``, ``DMLNPU-005``...), so
a finding can say where it comes from and how firm that source is.
"""

from __future__ import annotations

from collections.abc import Callable

from ortprep.analysis import ModelAnalysis, NodeInfo, is_float32_tensor
from ortprep.eps.htp import (
    conv_transpose_bias_adds,
    quantized_batch_norms,
    sixteen_bit_activation_matmuls,
    small_multipliers,
)
from ortprep.eps import qnn_rules
from ortprep.eps.qnn_rules import QNN_MEASURED
from ortprep.eps.registry import EpSpec
from ortprep.eps.verdict import QDQ_OPS, NodeVerdict
from ortprep.eps.tables import Match, SupportLevel, SupportTable
from ortprep.findings import Finding, Severity

DML_EPS = ("dml", "dml-npu")
ONE_D_OPS = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool")


def constraint_source(table: SupportTable, constraint_id: str) -> str:
    for row in table.constraints:
        if row.get("id") == constraint_id:
            return f"{constraint_id} ({row.get('evidence', '?')}): {row.get('source', '')}"
    return constraint_id


# --------------------------------------------------------------------------- DirectML


def _outputs_used(node: NodeInfo) -> int:
    return sum(1 for name in node.node.output if name)


# Conditions under which the DML EP's Query* functions decline a node (dml_support_queries).
# Queries not listed here are reported as conditions the user must check.
DML_QUERIES: dict[str, Callable[[NodeInfo], bool]] = {
    "QueryMaxPool": lambda n: n.attribute("storage_order", 0) != 0,
    "QueryResize": lambda n: n.attribute("mode", b"nearest") in (b"cubic", "cubic")
    or n.attribute("exclude_outside", 0) != 0
    or float(n.attribute("extrapolation_value", 0.0)) != 0.0,
    "QueryScatter": lambda n: n.attribute("reduction", b"none") not in (b"none", "none"),
    "QueryRecurrentNeuralNetwork": lambda n: n.attribute("layout", 0) != 0,
    "QueryBatchNormalization": lambda n: n.attribute("training_mode", 0) != 0 or len(n.node.input) < 5,
    "QueryLayerNormalization": lambda n: _outputs_used(n) > 1,
    "QuerySkipLayerNormalization": lambda n: any(name for name in list(n.node.output)[1:3]),
    "QueryPad": lambda n: any(p < 0 for p in (n.attribute("pads", []) or [])),
    "QuerySlice": lambda n: len(n.node.input) > 5,
    "QueryQLinearSigmoid": lambda n: len(n.node.input) < 5,
}


def _static(facts) -> bool:
    return facts is not None and facts.static


def _dml_node(spec: EpSpec, table: SupportTable, node: NodeInfo, verdict: NodeVerdict) -> NodeVerdict:
    dml = verdict.dml
    if dml is None:
        return verdict
    npu = spec.name == "dml-npu"
    query = dml.get("query")
    if query:
        text = table.extra.get("support_queries", {}).get(query, {}).get("rejected_when", query)
        check = DML_QUERIES.get(query)
        source = f"{query} in the DML EP ({table.source_text('dml-registration')})"
        if check is not None and check(node):
            return NodeVerdict(SupportLevel.UNSUPPORTED_OP, f"DirectML declines it: {text}", source, "DML003")
        if check is None:
            verdict = NodeVerdict(
                SupportLevel.CONDITIONAL, f"DirectML takes it unless: {text}", source, "EP004", dml=dml
            )
    severity = Severity.ERROR if npu else Severity.INFO
    where = (
        "NPUs compile only the fused graph, so the model will not run there"
        if npu
        else "it runs as a separate DML kernel"
    )

    def fusion_finding(code: str, why: str, fix: str, constraint_id: str) -> Finding:
        return Finding.of(
            code,
            f"node '{node.name}' ({node.op_type}) {why}; {where}",
            severity=severity,
            node=node.name,
            op_type=node.op_type,
            ep=spec.name,
            fix=fix,
            source=constraint_source(table, constraint_id),
        )

    if dml.get("graph") == "NotSupported":
        if node.op_type in ("Shape", "Size"):
            fix = "remove it from the inference graph (e.g. fold Shape/Size with `ortprep simplify`)"
        else:
            fix = f"replace {node.op_type} with ops DirectML fuses" + (" or target the GPU" if npu else "")
        verdict.extra.append(fusion_finding("DML002", "never joins a fused DirectML graph", fix, "DML-009"))
        return verdict
    reasons = []
    values = [v for v in node.inputs + node.outputs if v is not None]
    if any(not _static(v) for v in values) or len(values) < len(
        [n for n in list(node.node.input) + list(node.node.output) if n]
    ):
        reasons.append("its shapes are not static")
    for position in dml.get("cpu_inputs") or []:
        if position < len(node.inputs) and node.node.input[position]:
            facts = node.inputs[position]
            if facts is None or not facts.is_initializer:
                reasons.append(f"input {position} ('{node.node.input[position]}') must be a constant initializer")
    count = dml.get("input_count")
    if count is not None and len([i for i in node.node.input if i]) != count:
        reasons.append(f"it has {len(node.node.input)} inputs; fusion needs exactly {count}")
    if reasons:
        fix = (
            "make shapes static (ortprep convert MODEL --fix-dim NAME=VALUE) "
            "and fold constant inputs (ortprep simplify MODEL)"
        )
        verdict.extra.append(
            fusion_finding("DML001", f"stays out of the fused DirectML graph: {'; '.join(reasons)}", fix, "DML-008")
        )
    return verdict


# --------------------------------------------------------------------------- per node


# QNN's node rules: eps/qnn_rules.py

LEVEL_CODES = {
    SupportLevel.UNSUPPORTED_OP: "EP001",
    SupportLevel.UNSUPPORTED_OPSET: "EP002",
    SupportLevel.UNSUPPORTED_DTYPE: "EP003",
    SupportLevel.CONDITIONAL: "EP004",
    SupportLevel.UNKNOWN: "EP005",
}


def reads_the_node(spec: EpSpec, node: NodeInfo, found: Match) -> bool:
    """Whether evaluate_node reads more of the node than its table match: an EP rule for it, or a
    finding that names it. Where not, the verdict is the match's alone, the same for every node
    with that match."""
    return bool(found.note) or (spec.name == "qnn" and found.level.runs_on_ep) or (
        spec.name in DML_EPS and found.level.runs_on_ep and found.entry is not None and bool(found.entry.dml)) or (
        spec.name == "dml-npu" and node.op_type in ONE_D_OPS)


# An EPContext node (com.microsoft) holds a graph an EP compiled (compile's output); its ``source``
# attribute names the EP that wrote it, and only that EP runs it.
EP_CONTEXT_SOURCE = ("ONNX Runtime docs, EP context design (execution-providers/EP-Context-Design): an EPContext "
                     "node's 'source' attribute names the EP that generated it; measured: onnxruntime-qnn 2.7.0 writes "
                     "'QNNExecutionProvider', and that EP takes the node")


def ep_context_source(node: NodeInfo) -> str | None:
    """The EP an EPContext node was compiled by (its ``source`` attribute), '' where it names none;
    None for any other node."""
    if node.op_type != "EPContext" or node.domain != "com.microsoft":
        return None
    source = node.attribute("source", b"")
    return (source.decode(errors="replace") if isinstance(source, bytes) else str(source or "")).strip()


def evaluate_node(spec: EpSpec, table: SupportTable, node: NodeInfo, found: Match,
                  graph_io: tuple = (set(), set())) -> NodeVerdict:
    """A table match, adjusted by the EP's node rules. ``graph_io``: the main graph's input and
    output names, and (optionally) the outputs ORT's constant folding computes away."""
    source = ep_context_source(node)
    if source is not None:
        # ORT's EPs read the attribute without regard to case, QNN's as 'qnn' or 'QNNExecutionProvider'
        # (onnxruntime's QNN EP: GraphHasEpContextNode lowercases it)
        provider = spec.provider.lower()
        if source.lower() in (provider, provider.removesuffix("executionprovider")):
            return NodeVerdict(
                SupportLevel.SUPPORTED, f"a graph compiled for {spec.provider} (EPContext)", EP_CONTEXT_SOURCE
            )
        return NodeVerdict(SupportLevel.UNSUPPORTED_OP, f"a graph compiled for {source or 'an EP it does not name'} "
                           f"(EPContext): only that EP runs it, not {spec.provider}", EP_CONTEXT_SOURCE,
                           LEVEL_CODES[SupportLevel.UNSUPPORTED_OP])
    verdict = NodeVerdict(found.level, found.reason, found.src, LEVEL_CODES.get(found.level))
    if found.note:
        verdict.extra.append(
            Finding.of(
                "EP008",
                f"node '{node.name}' ({node.op_type}) on {spec.name}: {found.note}",
                node=node.name,
                op_type=node.op_type,
                ep=spec.name,
                fix="run float16 models on an EP with float16 kernels (cuda, dml), "
                "or keep the model in float32 for the CPU",
                source=found.src,
            )
        )
    if spec.name == "qnn" and found.level.runs_on_ep:
        verdict = qnn_rules.qnn_node(node, verdict, *graph_io)
    if spec.name in DML_EPS and found.level.runs_on_ep and found.entry is not None and found.entry.dml:
        verdict.dml = found.entry.dml
        verdict = _dml_node(spec, table, node, verdict)
    if spec.name == "dml-npu" and node.op_type in ONE_D_OPS and node.inputs and node.inputs[0] is not None:
        shape = node.inputs[0].shape
        if shape is not None and len(shape) == 3:
            verdict.extra.append(
                Finding.of(
                    "NPU003",
                    f"node '{node.name}' ({node.op_type}) works on 1-D data (3-D tensor); DirectML NPUs are "
                    "known to fail on 1-D convolution and pooling",
                    node=node.name,
                    op_type=node.op_type,
                    ep=spec.name,
                    fix="ortprep convert MODEL --conv1d-to-conv2d (rewrites it as 2-D)",
                    source="DirectML NPU reports (project seed article; see DML_NPU facts)",
                )
            )
    return verdict


# --------------------------------------------------------------------------- per model


def _dynamic_inputs(analysis: ModelAnalysis) -> list[str]:
    described = []
    for name, facts in analysis.graph_inputs():
        if facts.shape is None:
            described.append(f"{name} (unknown rank)")
        elif any(not isinstance(d, int) or d <= 0 for d in facts.shape):
            dims = ", ".join("?" if d is None else str(d) for d in facts.shape)
            described.append(f"{name} [{dims}]")
    return described




def model_findings(spec: EpSpec, table: SupportTable, analysis: ModelAnalysis) -> list[Finding]:
    findings: list[Finding] = []
    opset = analysis.opsets.get("ai.onnx")
    shape_rule = spec.static_shapes
    if shape_rule:
        dynamic = _dynamic_inputs(analysis)
        if dynamic:
            severity = Severity.parse(shape_rule.severity)
            constraint_id, why = shape_rule.constraint, shape_rule.why
            findings.append(
                Finding.of(
                    "SHP001",
                    f"{spec.name}: inputs with dynamic dimensions: {', '.join(dynamic)}; {why}",
                    severity=severity,
                    ep=spec.name,
                    fix="fix them: ortprep convert MODEL --fix-dim NAME=VALUE (or --fix-shape INPUT=1,3,224,224)",
                    source=constraint_source(table, constraint_id),
                )
            )
    if spec.name == "dml-npu":
        fp32 = _float32_tensors(analysis)
        if fp32:
            findings.append(
                Finding.of(
                    "NPU001",
                    f"dml-npu: {fp32} float32 tensors; the validated DirectML NPU path is FP16 (the official NPU "
                    "sample runs an FP16 model; Microsoft states no FP16-only rule, so this is inferred, but "
                    "FP32 models are reported failing)",
                    ep=spec.name,
                    fix="ortprep convert MODEL --fp16 --ep dml-npu -o MODEL.fp16.onnx",
                    source=constraint_source(table, "DMLNPU-005"),
                )
            )
        findings.append(
            Finding.of(
                "NPU004",
                "dml-npu: DirectML on NPUs is a developer preview validated on a set of models only; other models "
                "may fail at session creation (DXGI_ERROR_UNSUPPORTED 0x887A0004) even when every check passes",
                ep=spec.name,
                fix="prove it on the target device with ortprep load MODEL --ep dml; prefer the vendor's EP "
                "(openvino-npu, qnn) where one exists",
                source=constraint_source(table, "DMLNPU-003"),
            )
        )
    if spec.name in DML_EPS and opset is not None and opset > table.extra["max_opset"]:
        findings.append(
            Finding.of(
                "DML004",
                f"{spec.name}: model opset {opset} is above the opset {table.extra['max_opset']} that "
                "DirectML 1.15 documents; newer ops may be unsupported or slow",
                ep=spec.name,
                fix=f"ortprep convert MODEL --opset {table.extra['max_opset']}",
                source=constraint_source(table, "DML-006"),
            )
        )
    if spec.name == "qnn" and _has_float_compute(analysis) and not _has_qdq(analysis):
        findings.append(
            Finding.of(
                "QNN001",
                "qnn: the model computes in floating point and has no QuantizeLinear/DequantizeLinear; the HTP "
                "backend takes float ops and computes them in FP16 (measured: float models ran wholly on the HTP "
                "simulator), but QNN documents QDQ models as the HTP path, and FP16 arithmetic on the device may "
                "lose accuracy the simulator's result does not show",
                ep=spec.name,
                fix="ortprep quantize MODEL --static --ep qnn --calib DATA -o MODEL.qdq.onnx, then "
                    "ortprep load MODEL.qdq.onnx --ep qnn --reference MODEL",
                source=constraint_source(table, "QNN-002") + "; " + QNN_MEASURED,
            )
        )
    if spec.name == "qnn" and _has_qdq(analysis):
        low = small_multipliers(analysis.handle.proto)
        if low:
            channels = sum(item["channels"] for item in low)
            shown = ", ".join(f"{item['node']} ({item['channels']})" for item in low[:5]) + (
                ", ..." if len(low) > 5 else ""
            )
            findings.append(
                Finding.of(
                    "QNN005",
                    f"qnn: {channels} weight channel(s) of {len(low)} node(s) have a requantization multiplier (input "
                    "scale x weight scale / output scale) below 2^-24, which QNN's HTP computes wrongly (measured: "
                    f"large values (8 to 70 measured) where the CPU EP gives about 0, and the tensor is lost): {shown}",
                    ep=spec.name,
                    fix="quantize the float model with ortprep quantize MODEL --static --ep qnn (it raises those "
                        "scales, QNT020), then ortprep load MODEL.qdq.onnx --ep qnn --reference MODEL",
                    source=QNN_MEASURED + "; bench/studies/htp_multiplier.md, QNN's smallest requantization multiplier",
                )
            )
    if spec.name == "qnn" and _has_qdq(analysis):
        for code, finder, words, fix, source in _HTP_NODE_RULES:
            for name in finder(analysis.handle.proto):
                findings.append(
                    Finding.of(
                        code,
                        f"qnn: {words.format(name=name)}",
                        ep=spec.name,
                        node=name,
                        fix=f"quantize the float model again: ortprep quantize FLOAT.onnx --static --ep qnn "
                        f"({fix}); then ortprep load FLOAT.qdq.onnx --ep qnn --reference FLOAT.onnx",
                        source=f"{QNN_MEASURED}; bench/suite/results/journey.md, {source}",
                    )
                )
    if spec.name == "tensorrt" and opset is not None:
        low, high = table.extra["opset_range"]
        if not low <= opset <= high:
            findings.append(
                Finding.of(
                    "TRT001",
                    f"tensorrt: model opset {opset} is outside the opsets {low}-{high} the TensorRT ONNX parser "
                    "documents (TensorRT 10.0; newer releases may accept more)",
                    ep=spec.name,
                    fix=f"ortprep convert MODEL --opset {min(max(opset, low), high)}",
                    source=constraint_source(table, "TRT-001"),
                )
            )
    return findings


# What QNN's HTP computes otherwise than the CPU EP in a QDQ model, node by node, read from the graph
# alone (eps/htp.py): (code, finder, message, what quantize --ep qnn does instead, RESULTS section).
_HTP_NODE_RULES = (
    ("QNN006", sixteen_bit_activation_matmuls,
     "MatMul '{name}' multiplies two 16-bit activations, which QNN's HTP computes far less precisely than the CPU "
     "EP's run of the same QDQ model (measured: max abs diff 0.099 at an output range of 20.7, the CPU EP 0.0007); "
     "in FP16 on the HTP it is 0.0064",
     "it computes such MatMuls in FP16, QNT024; or put a Cast to float16 around this MatMul",
     "A MatMul of two 16-bit activations on QNN's HTP"),
    ("QNN007", conv_transpose_bias_adds,
     "Add '{name}' adds a constant per channel to a quantized ConvTranspose's output, which QNN's HTP computes "
     "wrongly (measured: 6.5% of the output's range off the CPU EP's run of the same model, cosine 0.9927, where "
     "the ConvTranspose's own output agrees within 0.02%)",
     "it folds the constant into the ConvTranspose's bias, QNT025",
     "A bias Add after a ConvTranspose on QNN's HTP"),
    ("QNN008", quantized_batch_norms,
     "BatchNormalization '{name}' is quantized on its own, which QNN's HTP computes wrongly (measured: up to half "
     "of the output's range off, cosine 0.975, in A16W16 and A8W8)",
     "it folds a BatchNormalization after a Conv into the Conv, QNT026",
     "A BatchNormalization on QNN's HTP"),
)


def _float32_tensors(analysis: ModelAnalysis) -> int:
    return sum(1 for facts in analysis.values.values() if is_float32_tensor(facts))


def _has_float_compute(analysis: ModelAnalysis) -> bool:
    # an EPContext node's float outputs are a compiled graph's: what it computes in is the compiler's
    return any(
        any(is_float32_tensor(v) for v in node.outputs) and node.op_type not in QDQ_OPS
        and ep_context_source(node) is None
        for node in analysis.all_nodes()
    )


def _has_qdq(analysis: ModelAnalysis) -> bool:
    return any(node.op_type in QDQ_OPS for node in analysis.all_nodes())


# --------------------------------------------------------------------------- EP combinations


def combination_findings(target: tuple[EpSpec, ...], tables: dict[str, SupportTable]) -> list[Finding]:
    """Errors for EP lists that cannot share one session."""
    findings = []
    names = [spec.name for spec in target]
    label = ",".join(names)
    dml = [spec for spec in target if spec.name in DML_EPS]
    if not dml:
        return findings
    table = tables[dml[0].name]
    openvino = [spec.name for spec in target if spec.name.startswith("openvino")]
    others = [spec.name for spec in target if spec.name not in DML_EPS and spec.device != "cpu"]
    if openvino:
        findings.append(
            Finding.of(
                "CMB001",
                f"{label}: OpenVINO and DirectML cannot share one session; session creation fails with "
                "\"Execution type OpenVINOExecutionProvider doesn't support memcpy\"",
                ep=label,
                fix="use one session per EP (ortprep check MODEL --ep openvino-cpu --ep dml checks each)",
                source=constraint_source(table, "DML-005"),
            )
        )
    if others:
        findings.append(
            Finding.of(
                "CMB001",
                f"{label}: DirectML can only be combined with CPU-device EPs, not {', '.join(others)} "
                "(\"DML EP can only be used with CPU EPs\")",
                ep=label,
                fix="use one session per EP",
                source=constraint_source(table, "DML-004"),
            )
        )
    return findings
