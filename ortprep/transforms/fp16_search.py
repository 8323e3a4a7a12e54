"""The FP16 search: convert, load, compare against FP32; keep the nodes where the error starts in
FP32 and try again (mixed precision). Used by the convert step."""

from __future__ import annotations

import logging

from onnx import ModelProto

from ortprep.eps.registry import resolve_ep
from ortprep.findings import Finding, Severity
from ortprep.model import ModelHandle, iter_graphs
from ortprep.report import StepResult
from ortprep.runtime.compare import compare_arrays
from ortprep.steps.options import ConvertOptions
from ortprep.transforms import fp16 as fp16_step
from ortprep.transforms.fp16 import KeepReason
from ortprep.transforms.verify import (
    Gate,
    VerifyResult,
    float_intermediates,
    run_model,
    run_with_intermediates,
    verify_run,
)

log = logging.getLogger(__name__)


class Fp16Search:
    """The FP16 loop: convert, load, compare; keep the nodes responsible in FP32; repeat."""

    def __init__(self, proto: ModelProto, options: ConvertOptions, feeds, reference, report: StepResult) -> None:
        self.source = proto
        self.options = options
        self.feeds = feeds
        self.reference = reference
        self.report = report
        self.keep_io = options.keep_io_types if options.keep_io_types is not None else not resolve_ep(options.ep).fp16_io
        self.block_ops: dict[str, str] = {op: "--block-op" for op in options.block_ops}
        self.block_nodes: dict[str, str] = {name: "--block-node" for name in options.block_nodes}
        # Why each node in block_nodes is there, as data (the text above is for people).
        self.keep_reasons: dict[str, KeepReason] = {name: KeepReason.ASKED for name in options.block_nodes}
        self.gate = Gate(min_cosine=options.min_cosine)
        self.repairs: list[str] = []
        self.rounds = 0
        # FP32 values of every intermediate tensor on the feeds: measured once, for the activation
        # scan, and reused by every round that localizes a failure.
        self.source_activations = None

    def kept(self, converted: ModelProto) -> list[fp16_step.KeptNode]:
        from onnxconverter_common.float16 import DEFAULT_OP_BLOCK_LIST

        kept = []
        for scope, graph in iter_graphs(self.source.graph):
            for node in graph.node:
                if node.name in self.block_nodes:
                    reason = self.block_nodes[node.name]
                elif node.op_type in self.block_ops:
                    reason = self.block_ops[node.op_type]
                elif node.op_type in DEFAULT_OP_BLOCK_LIST:
                    reason = "onnxconverter-common keeps this op in FP32"
                else:
                    continue
                kept.append(fp16_step.KeptNode(node.name, node.op_type, reason, scope))
        return kept

    def convert(self) -> tuple[ModelProto | None, VerifyResult | None]:
        last: VerifyResult | None = None
        converted: ModelProto | None = None
        for self.rounds in range(1, self.options.max_rounds + 1):
            converted, repairs = fp16_step.convert_once(
                self.source,
                keep_io_types=self.keep_io,
                block_ops=set(self.block_ops),
                block_nodes=set(self.block_nodes),
            )
            self.repairs = repairs
            if self.reference is None:
                return converted, None
            candidate = run_model(converted, self.feeds)
            last = verify_run(self.reference, candidate, self.gate)
            if last.passed:
                return converted, last
            culprits = self._culprits(converted, last)
            if not culprits:
                break
            for name, (why, reason) in culprits.items():
                self.keep(name, why, reason)
        return converted, last

    def keep(self, name: str, why: KeepReason, text: str, *, replace: bool = True) -> None:
        """Keep node ``name`` in FP32 from the next round on."""
        if replace or name not in self.block_nodes:
            self.block_nodes[name] = text
            self.keep_reasons[name] = why

    def _culprits(self, converted: ModelProto, result: VerifyResult) -> dict[str, tuple[KeepReason, str]]:
        if result.status == "crashed":
            self.report.add(
                Finding.of(
                    "CNV005",
                    f"ONNX Runtime crashed on the FP16 model ({result.error}); trying again with the nodes "
                    "whose outputs differ kept in FP32",
                    severity=Severity.WARNING,
                    fix="if it persists: ortprep convert --fp16 --block-op OP for the op types involved",
                )
            )
        return self._localize(converted)

    def _localize(self, converted: ModelProto) -> dict[str, tuple[KeepReason, str]]:
        """Compare every intermediate tensor; the nodes where the error starts stay FP32."""
        names = [n for n in float_intermediates(self.source)]
        present = {out for node in converted.graph.node for out in node.output}
        names = [n for n in names if n in present]
        if self.source_activations is None:
            self.source_activations = run_with_intermediates(self.source, self.feeds, float_intermediates(self.source))
        original = self.source_activations
        candidate = run_with_intermediates(converted, self.feeds, names)
        if not original.ok:
            return {}
        bad: set[str] = set()
        compared = set(names) | {v.name for v in self.source.graph.output}
        for name, value in original.outputs.items():
            if name not in compared or value.dtype.kind != "f":
                continue
            other = candidate.outputs.get(name) if candidate.ok else None
            if other is None or not self.gate.passes(compare_arrays(name, value, other), value):
                bad.add(name)
        return blame(self.source, bad, set(self.block_nodes), None if candidate.ok else candidate.message)


def convert_to_fp16(proto: ModelProto, options: ConvertOptions, feeds, reference, report: StepResult):
    """FP16 with the range scans first (constants, activations), the EP's FP32-only ops kept, and
    the mixed-precision search; returns (converted model, verification, kept nodes)."""
    fp16_step.ensure_node_names(proto)
    scan = fp16_step.scan_constants(proto)
    overflow_names = {name for name, _ in scan.overflow}
    folded = fp16_step.fold_batchnorms(proto, overflow_names) if overflow_names else []
    remaining = fp16_step.scan_constants(proto).overflow if folded else scan.overflow
    run = Fp16Search(proto, options, feeds, reference, report)
    for name, peak in scan.overflow:
        handled = "folded into the preceding Conv" if name not in {n for n, _ in remaining} else "kept in FP32 with its consumers"
        report.add(
            Finding.of(
                "CNV001",
                f"constant '{name}' holds values up to {peak:.4g}, beyond FP16's 65504 (onnxconverter-common "
                f"would clamp it); {handled}",
                fix="nothing to do: ortprep handled it",
            )
        )
    for name, _ in remaining:
        for node in proto.graph.node:
            if name in node.input:
                run.keep(node.name, KeepReason.CONSTANT_RANGE, f"reads constant '{name}' beyond FP16's range")
    for name, tiny, total in scan.underflow:
        report.add(
            Finding.of(
                "CNV002",
                f"constant '{name}': {tiny} of {total} values are smaller than FP16 can hold (2^-24) and become zero",
                fix="usually harmless; if accuracy suffers, --block-node the consumer",
            )
        )
    ep_ops = fp16_step.ep_blocked_ops(ModelHandle(proto=proto, path=None), options.ep)
    for op, reason in ep_ops.items():
        run.block_ops.setdefault(op, reason)
    if ep_ops:
        report.add(
            Finding.of(
                "CNV008",
                f"{len(ep_ops)} op type(s) stay FP32 because {options.ep} has no FP16 kernel for them: {', '.join(sorted(ep_ops))}",
                fix="convert for the EP you deploy to: --ep cuda, --ep dml or --ep dml-npu",
            )
        )
    if reference is not None:
        activations = run_with_intermediates(proto, feeds, float_intermediates(proto))
        run.source_activations = activations
        if activations.ok:
            flagged = fp16_step.activation_overflow_nodes(proto, activations.outputs)
            for name, peak in flagged.items():
                run.keep(name, KeepReason.ACTIVATION_RANGE, f"activations reach {peak:.4g}, beyond FP16's safe range", replace=False)
            if flagged:
                report.add(
                    Finding.of(
                        "CNV003",
                        f"{len(flagged)} node(s) produce or read activations beyond FP16's range on the test inputs "
                        f"({', '.join(sorted(flagged)[:5])}); they stay FP32",
                        fix="pass real inputs with --inputs FILE.npz to base this on your data",
                    )
                )
    converted, result = run.convert()
    for repair in run.repairs:
        log.info("repair: %s", repair)
    kept = run.kept(converted) if converted is not None else []
    for name, reason in run.block_nodes.items():
        if not any(k.name == name for k in kept):
            op_type = next((n.op_type for n in proto.graph.node if n.name == name), "?")
            kept.append(fp16_step.KeptNode(name, op_type, reason))
    localized = sum(1 for why in run.keep_reasons.values() if why == KeepReason.ERROR_STARTS)
    if result is not None and result.passed and localized:
        report.add(
            Finding.of(
                "CNV009",
                f"verification passed with mixed precision after {run.rounds} round(s): "
                f"{localized} node(s) kept in FP32",
                fix="see kept_fp32_nodes",
            )
        )
    return converted, result, kept


def blame(source: ModelProto, bad: set[str], kept: set[str], failure: str | None) -> dict[str, tuple[KeepReason, str]]:
    """The nodes to keep in FP32 next round, given the tensors whose FP16 values differ (``bad``),
    the nodes already kept, and why ORT could not run the FP16 model (``failure``), if it could not."""
    culprits: dict[str, tuple[KeepReason, str]] = {}
    first_bad = None
    for node in source.graph.node:
        if node.name in kept:
            continue
        outs_bad = any(o in bad for o in node.output)
        if not outs_bad:
            continue
        first_bad = first_bad or node
        if not any(i in bad for i in node.input):
            culprits[node.name] = (KeepReason.ERROR_STARTS, "its FP16 output differs from FP32 beyond the gate")
    if not culprits and first_bad is not None:
        culprits[first_bad.name] = (KeepReason.ERROR_STARTS, "first node whose FP16 output differs beyond the gate")
    if not culprits:
        # The error starts in nodes already kept in FP32: what feeds them (e.g. two FP16 weights
        # whose difference matters) goes to FP32 too.
        producers = {out: node for node in source.graph.node for out in node.output}
        for node in source.graph.node:
            if node.name in kept and any(o in bad for o in node.output):
                for name in node.input:
                    upstream = producers.get(name)
                    if upstream is not None and upstream.name not in kept:
                        culprits[upstream.name] = (KeepReason.FEEDS_KEPT, f"feeds '{node.name}', whose output differs even in FP32")
    if not culprits and failure is not None:
        # Fails without a node to blame: keep every remaining float node of the main graph in FP32.
        for node in source.graph.node:
            if node.name not in kept:
                culprits[node.name] = (KeepReason.NO_RUN, f"ORT could not run the FP16 model ({failure[:120]})")
    return culprits
