"""check's prediction for one target: where each node goes (tables and rules), the partitions,
the findings and the verdict. Works from the tables alone, so it answers for EPs that are not
installed; check and load (which sets it beside a real session's placement) both read it."""

from __future__ import annotations

import dataclasses
import gc
import logging
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

from ortprep.analysis import ModelAnalysis, NodeInfo, node_macs
from ortprep.eps.devices import Device, has_devices, resolve_device
from ortprep.eps.cpu_preferred import PREFERRING_EPS, cpu_preferred, elements
from ortprep.eps.partition import CPU, FOLDED, cpu_islands, partition_graph
from ortprep.eps.qnn_fusions import qnn_fused
from ortprep.runtime.compat import runtime_findings
from ortprep.eps.registry import EpSpec
from ortprep.eps.qnn_rules import QNN_SESSIONS, qnn_control_flow, qnn_lone_qdq
from ortprep.eps.rules import combination_findings, evaluate_node, model_findings, reads_the_node
from ortprep.eps.verdict import NodeVerdict
from ortprep.eps.tables import SupportLevel, SupportTable, match
from ortprep.runtime.kernels import support_table
from ortprep.findings import Finding, Severity
from ortprep.validity import checker_result, converter_defects, runtime_refusal

log = logging.getLogger(__name__)

# Findings that mean no session can be created at all.
SESSION_BLOCKERS = ("MOD002", "MOD009", "MOD010", "CMB001", "EP009")

FIXES = {
    "EP001": "replace {op} with ops {ep} supports, or accept the CPU fallback",
    "EP002": "convert the model to an opset {ep} registers: ortprep convert MODEL --opset N",
    "EP003": "cast to a type {ep} takes (ortprep convert --fp16 where float16 is supported), or accept the fallback",
    "EP005": "register the custom-op library that implements {op}, or replace it with standard ONNX ops",
    "QNN010": "compute the {op}'s bounds from constants (a Max or Min against a computed floor runs on {ep}), or "
              "accept one CPU node and its two copies",
}


def _fallback_severity(spec: EpSpec, cpu_runs_it: bool) -> Severity:
    # On the CPU EP (or when the CPU cannot take it either) the session cannot be created; NPUs
    # compile the whole graph, so any fallback defeats them.
    if spec.name == "cpu" or spec.name == "dml-npu" or not cpu_runs_it:
        return Severity.ERROR
    return Severity.WARNING


def _node_finding(spec: EpSpec, node: NodeInfo, verdict: NodeVerdict, cpu_runs_it: bool) -> Finding:
    if verdict.level == SupportLevel.CONDITIONAL:
        return Finding.of(
            verdict.code or "EP004",
            f"node '{node.name}' ({node.op_type}) runs on {spec.name} only if: {verdict.reason}",
            node=node.name,
            op_type=node.op_type,
            ep=spec.name,
            fix="check the condition; if it does not hold the node falls back to the CPU",
            source=verdict.src,
        )
    if spec.name == "cpu":
        consequence = "ONNX Runtime cannot create a session for this model"
    elif cpu_runs_it:
        consequence = "it falls back to the CPU"
    else:
        consequence = "the CPU EP has no kernel either, so the session fails"
    code = verdict.code or "EP001"
    fix = FIXES.get(code, "see the reason").format(op=node.op_type, ep=spec.name)
    return Finding.of(
        code,
        f"node '{node.name}' ({node.domain}:{node.op_type}) is not supported by {spec.name}: {verdict.reason}; "
        f"{consequence}",
        severity=verdict.severity or _fallback_severity(spec, cpu_runs_it),
        node=node.name,
        op_type=node.op_type,
        ep=spec.name,
        fix=fix,
        source=verdict.src,
    )


# Never constant-folded by ORT: Q/DQ stay for QDQ-aware EPs, random ops must not be frozen.
NOT_FOLDED = {"QuantizeLinear", "DequantizeLinear", "RandomNormal", "RandomUniform", "RandomNormalLike",
              "RandomUniformLike", "Multinomial", "Bernoulli"}


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while check builds and reads its per-node
    objects: they form no cycles, and the collector would otherwise walk all of them again at
    each full collection (docs/decisions/seams-large-graph-costs.md). Restored on leaving."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _once(analysis: ModelAnalysis, key: Hashable, compute: Callable[[], Any]) -> Any:
    """``compute()``, remembered on the analysis: what every target of a check reads of the model
    is found once (an analysis describes a model that no longer changes)."""
    memo = analysis.__dict__.setdefault("_check_memo", {})
    if key not in memo:
        memo[key] = compute()
    return memo[key]


def folded_nodes(analysis: ModelAnalysis) -> set[int]:
    """Positions (in ``analysis.all_nodes()``) of nodes no EP runs: Constant nodes, and nodes
    ORT's constant folding (optimization level basic, before partitioning) computes away at
    session creation: all inputs constant, or Shape of a static tensor. Found once per analysis
    (every target of a check reads it)."""
    return _once(analysis, "folded", lambda: _find_folded(analysis))


def _macs(analysis: ModelAnalysis) -> list[int | None]:
    """node_macs of every node, in ``all_nodes()`` order, once per analysis."""
    return _once(analysis, "macs", lambda: [node_macs(node) for node in analysis.all_nodes()])


def _find_folded(analysis: ModelAnalysis) -> set[int]:
    folded: set[int] = set()
    constant = {t.name for t in analysis.handle.graph.initializer}
    position = 0
    for graph in analysis.graphs:
        constant |= {t.name for t in graph.graph.initializer}
        for node in graph.nodes:
            op = node.op_type
            if op == "Shape" and node.inputs and node.inputs[0] is not None and node.inputs[0].static:
                is_folded = True  # the Shape of a static tensor (in any domain)
            elif node.domain != "ai.onnx":
                is_folded = False
            elif op == "Constant":
                is_folded = True
            elif op in NOT_FOLDED or node.has_subgraphs:
                is_folded = False
            else:  # all inputs constant
                inputs = [name for name in node.node.input if name]
                is_folded = bool(inputs) and all(name in constant for name in inputs)
            if is_folded:
                folded.add(position)
                constant.update(name for name in node.node.output if name)
            position += 1
    return folded


def _match_key(node: NodeInfo) -> tuple:
    """What a table lookup reads of a node (tables.match): nodes alike in all of it match alike."""
    return (node.domain, node.op_type, node.since, node.opset, node.graph_size <= 3 and node.index == 0,
            tuple((v.dtype, v.is_initializer) if v is not None else None for v in node.inputs),
            tuple(v.dtype if v is not None else None for v in node.outputs))


def _kinds(analysis: ModelAnalysis) -> tuple[list[int], list[NodeInfo]]:
    """Each node's kind (an index into the second list, which holds one node of each kind): nodes
    alike in all that a table lookup reads. Found once per analysis, for every EP's table."""
    def compute() -> tuple[list[int], list[NodeInfo]]:
        kind_of: dict[tuple, int] = {}
        kinds, examples = [], []
        for node in analysis.all_nodes():
            key = _match_key(node)
            kind = kind_of.get(key)
            if kind is None:
                kind = kind_of[key] = len(examples)
                examples.append(node)
            kinds.append(kind)
        return kinds, examples

    return _once(analysis, "kinds", compute)


def analysis_matches(table: SupportTable, analysis: ModelAnalysis) -> list:
    """tables.match for every node of the analysis (``all_nodes()`` order), looked up once per
    kind of node (a large model has few kinds) and once per table."""
    def compute() -> tuple[SupportTable, list]:
        kinds, examples = _kinds(analysis)
        per_kind = [match(table, node) for node in examples]
        return table, [per_kind[kind] for kind in kinds]

    # keyed by the table's id: the memo holds the table, so no other table can take that id
    return _once(analysis, ("matches", id(table)), compute)[1]


def _verdicts(spec: EpSpec, table: SupportTable, analysis: ModelAnalysis) -> list[NodeVerdict]:
    graph = analysis.handle.graph
    nodes = analysis.all_nodes()
    folded = {name for index in folded_nodes(analysis) for name in nodes[index].node.output if name}
    graph_io = ({v.name for v in graph.input}, {v.name for v in graph.output}, folded)
    verdicts = []
    shared: dict[int, NodeVerdict] = {}  # by the match's id: a verdict no rule adjusts is the match's
    for node, found in zip(nodes, analysis_matches(table, analysis)):
        if reads_the_node(spec, node, found):
            verdicts.append(evaluate_node(spec, table, node, found, graph_io))
            continue
        verdict = shared.get(id(found))
        if verdict is None:
            verdict = shared[id(found)] = evaluate_node(spec, table, node, found, graph_io)
        verdicts.append(verdict)
    if spec.name == "qnn":
        verdicts = qnn_fused(analysis, verdicts, graph_io)
    if spec.name == "qnn" and len(analysis.graphs) > 1:
        verdicts = qnn_control_flow(analysis, verdicts)
    return verdicts


def _assign(analysis: ModelAnalysis, target: tuple[EpSpec, ...],
            tables: dict[str, SupportTable]) -> tuple[list[int], list[Finding], set[str]]:
    """Which EP of the target takes each node (index into the target, CPU or FOLDED), the per-node
    findings, and the nodes ORT itself gives back to the CPU (EP010)."""
    nodes = analysis.all_nodes()
    per_ep = [_verdicts(spec, tables[spec.name], analysis) for spec in target]
    if target[0].name == "cpu":
        cpu_levels = [v.level for v in per_ep[0]]
    else:
        cpu_levels = [found.level for found in analysis_matches(support_table("cpu"), analysis)]
    assignment: list[int] = []
    findings: list[Finding] = []
    folded = folded_nodes(analysis)
    for position, node in enumerate(nodes):
        if position in folded:
            assignment.append(FOLDED)
            continue
        for chosen, verdicts in enumerate(per_ep):  # the first EP of the target that takes it
            verdict = verdicts[position]
            if verdict.level.runs_on_ep:
                break
        else:
            chosen = CPU
        assignment.append(chosen)
        if chosen == CPU:
            findings.append(_node_finding(target[0], node, per_ep[0][position], cpu_levels[position].runs_on_ep))
        else:
            if verdict.level == SupportLevel.CONDITIONAL:
                findings.append(_node_finding(target[chosen], node, verdict, cpu_levels[position].runs_on_ep))
            if verdict.extra:
                findings.extend(verdict.extra)
    by_choice: set[str] = set()
    for chosen, spec in enumerate(target):
        if spec.name in PREFERRING_EPS:
            moved, found = _move_cpu_preferred(analysis, assignment, chosen, spec)
            by_choice.update(moved)
            findings.extend(found)
        if spec.name == "qnn":
            for index in qnn_lone_qdq(analysis, assignment, chosen):
                assignment[index] = CPU
                node = nodes[index]
                findings.append(Finding.of(
                    "QNN009", f"{spec.name}: node '{node.name}' ({node.op_type}) would be a partition of its own, one "
                    "Q/DQ node, which QNN gives back to the CPU EP", node=node.name, op_type=node.op_type,
                    ep=spec.name, source=QNN_SESSIONS,
                    fix="nothing to change for it alone: it follows the nodes around it (see the other findings)"))
    return assignment, findings, by_choice


def _move_cpu_preferred(analysis: ModelAnalysis, assignment: list[int], chosen: int,
                        spec: EpSpec) -> tuple[list[str], list[Finding]]:
    """Put on the CPU the small shape computations ORT itself takes from a kernel EP such as CUDA
    (eps/cpu_preferred.py), graph by graph as ORT partitions them; one finding names them."""
    folded = folded_nodes(analysis)
    moved: list[str] = []
    offset = 0
    for graph in analysis.graphs:
        count = len(graph.nodes)
        part = assignment[offset : offset + count]
        constants: dict[str, int | None] = {}
        for tensor in graph.graph.initializer:
            constants[tensor.name] = elements(list(tensor.dims))
        for index, info in enumerate(graph.nodes):
            if offset + index in folded:
                for name, facts in zip(info.node.output, info.outputs):
                    if name:
                        constants[name] = elements(facts.shape) if facts is not None else None
        inputs = {value.name for value in graph.graph.input} - constants.keys()
        for index in cpu_preferred(graph.nodes, [a == chosen for a in part], [a == CPU for a in part], inputs,
                                   constants):
            assignment[offset + index] = CPU
            moved.append(graph.nodes[index].name)
        offset += count
    if not moved:
        return [], []
    shown = ", ".join(moved[:5]) + (", ..." if len(moved) > 5 else "")
    return moved, [Finding.of("EP010", f"{spec.name}: ORT runs {len(moved)} small shape computation(s) on the CPU "
                       f"by its own rule, not for want of a kernel ({shown}); their results feed the EP from CPU "
                       "memory",
                       ep=spec.name,
                       source="onnxruntime/core/framework/fallback_cpu_capability.cc (GetCpuPreferredNodes); "
                       "measured on onnxruntime-gpu 1.31.1, H200",
                       fix="nothing to do: it is cheaper than running them on the GPU; a static shape "
                       "(ortprep convert MODEL --fix-shape INPUT=DIMS) folds them away")]


def _partitions(analysis: ModelAnalysis, assignment: list[int], target: tuple[EpSpec, ...]) -> tuple[int, int]:
    """(EP partitions, tensor copies between EP and CPU), graph by graph: ORT partitions each
    subgraph on its own."""
    partitions = copies = offset = 0
    for graph in analysis.graphs:
        count = len(graph.nodes)
        result = partition_graph(graph.graph, assignment[offset : offset + count])
        partitions += result.partitions
        copies += result.copies
        offset += count
    if all(spec.name == "cpu" for spec in target):
        copies = 0  # the CPU EP is the fallback itself: nothing to copy
    return partitions, copies


def _coverage_finding(label: str, nodes_placed: int, supported: int, fallback: list[str], partitions: int,
                      copies: int, first_ep: str) -> Finding | None:
    if not nodes_placed or first_ep == "cpu":
        return None
    if supported == 0:
        return Finding.of("EP007", f"{label}: none of the {nodes_placed} nodes runs on the EP; the whole model would "
                          "run on the CPU", ep=label,
                          fix="see the per-node findings; convert or replace the ops the EP lacks")
    if fallback:
        return Finding.of("EP006", f"{label}: {len(fallback)} of {nodes_placed} nodes fall back to the CPU; the EP "
                          f"gets {partitions} partition(s), with {copies} tensor copies between EP and CPU per run",
                          ep=label,
                          fix="replace the fallback ops, or check the cost: ortprep load MODEL --ep " + first_ep)
    return None


def _verdict(findings: list[Finding], nodes_placed: int, supported: int) -> str:
    blocked = any(f.code in SESSION_BLOCKERS or (f.code == "MOD001" and f.severity >= Severity.ERROR) for f in findings)
    has_error = any(f.severity >= Severity.ERROR for f in findings)
    if blocked or (nodes_placed and supported == 0):
        return "none"
    if supported == nodes_placed and not has_error:
        return "full"
    return "partial"


def predicted_ep_nodes(analysis: ModelAnalysis, record: dict[str, Any]) -> set[str]:
    """The nodes a one-EP target's ``record`` (check_target's) places on its EP: neither a CPU
    fallback nor folded by ORT's optimizer; what a real session's placement is held against. Read
    from the record, not predicted again."""
    folded, fallback = folded_nodes(analysis), set(record["fallback_nodes"])
    return {node.name for position, node in enumerate(analysis.all_nodes())
            if position not in folded and node.name not in fallback}


def check_target(analysis: ModelAnalysis, target: tuple[EpSpec, ...], ort_version: str | None = None,
                 device: Device | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """Check one target (one session's EP priority list) and return its result record and findings.
    ``device``: the device a one-EP target is for (QNN's SoC; None: the EP's stated default)."""
    if device is None and len(target) == 1 and has_devices(target[0].name):
        device = resolve_device(target[0].name, None)
    tables = {spec.name: support_table(spec.name) for spec in target}
    label = ",".join(spec.name for spec in target)
    nodes = analysis.all_nodes()
    assignment, findings, by_choice = _assign(analysis, target, tables)
    partitions, copies = _partitions(analysis, assignment, target)
    nodes_placed = sum(1 for a in assignment if a != FOLDED)
    supported = sum(1 for a in assignment if a >= 0)
    fallback = [node.name for node, a in zip(nodes, assignment) if a == CPU]
    known = list(zip(_macs(analysis), assignment))
    macs_total = sum(m for m, _ in known if m is not None)
    macs_on_ep = sum(m for m, a in known if m is not None and a >= 0)
    for spec in target:
        findings.extend(model_findings(spec, tables[spec.name], analysis))
    findings.extend(combination_findings(target, tables))
    findings.extend(runtime_findings(analysis.handle.proto.ir_version, analysis.opsets.get("ai.onnx"), ort_version))
    findings.extend(converter_defects(analysis.handle))
    passed, error = checker_result(analysis.handle, analysis.strict_inference_passed)
    if not passed:
        refused = runtime_refusal(analysis.handle)
        findings.append(Finding.of(
            "MOD001", f"onnx.checker rejects the model ({error}); "
            + ("ONNX Runtime does not load it either" if refused
               else "ONNX Runtime loads it anyway, other tools may not"),
            severity=Severity.ERROR if refused else Severity.WARNING,
            fix="re-export the model, or fix what the checker names", source="onnx.checker"))
    # the nodes ORT itself gives back to the CPU (EP010) are no want of the EP's: EP006 counts the others
    coverage = _coverage_finding(label, nodes_placed, supported, [n for n in fallback if n not in by_choice],
                                 partitions, copies, target[0].name)
    if coverage is not None:
        findings.append(coverage)
    device_failures = _device_failures(analysis, label, device) if len(target) == 1 and device is not None else []
    findings.extend(device_failures)
    if len(target) == 1:
        findings.extend(_session_failures(analysis, label, target[0], assignment))
    record = {
        "ep": label,
        "providers": [spec.provider for spec in target]
        + ([] if target[-1].name == "cpu" else ["CPUExecutionProvider"]),
        "tables": {spec.name: {"source": tables[spec.name].summary(), "version": tables[spec.name].version()}
                   for spec in target},
        "nodes": nodes_placed,
        "supported_nodes": supported,
        "partitions": partitions,
        "copies": copies,
        "fallback_nodes": fallback,
        "cpu_islands": cpu_islands(analysis.handle.graph, fallback),
        "node_share": round(supported / nodes_placed, 4) if nodes_placed else None,
        "macs": {"known": macs_total, "on_ep": macs_on_ep},
        "mac_share": round(macs_on_ep / macs_total, 4) if macs_total else None,
        "verdict": "none" if device_failures else _verdict(findings, nodes_placed, supported),
        "finding_count": len(findings),
    }
    if device is not None and len(target) == 1:
        record["device"] = device.record()  # the device is part of the target: every report names it
    return record, [dataclasses.replace(f, target=label) for f in findings]


def _device_failures(analysis: ModelAnalysis, label: str, device: Device) -> list[Finding]:
    """Patterns measured to fail the whole session on this device (QNN: at graph finalize), one
    finding (QNN004) per node that matches; the verdict is then "none"."""
    from ortprep.eps.device_rules import failing_patterns

    return [Finding.of(
        "QNN004", f"{label}: node '{node.name}' ({node.op_type}) is {failure['what']}, measured to fail the session "
        f"on {device.title}: no session is created", ep=label, node=node.name, op_type=node.op_type,
        source=failure["source"],
        fix="if you deploy to a newer SoC, name it (--device x-elite, 8gen3 or 8-elite: measured to finalize this) and "
            "prove it: ortprep check MODEL --ep qnn --prove --device NAME")
        for node, failure in failing_patterns(analysis, device)]


def _session_failures(analysis: ModelAnalysis, label: str, spec: EpSpec, assignment: list[int]) -> list[Finding]:
    """Patterns measured to fail the EP's whole session (eps/session_rules.py): EP009, and the
    verdict "none"."""
    from ortprep.eps.session_rules import session_failures

    return [Finding.of("EP009", f"{label}: the model has {failure.what}, measured to fail the whole session on "
                       f"{spec.name} (\"{failure.message}\"): no session is created", ep=label,
                       node=failure.nodes[0] if len(failure.nodes) == 1 else None, source=failure.source,
                       fix=failure.fix)
            for failure in session_failures(analysis, spec.name, [a >= 0 for a in assignment])]
