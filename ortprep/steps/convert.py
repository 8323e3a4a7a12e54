"""convert: FP16 (with repair and mixed precision), opset, static shapes, 1-D to 2-D; every
result verified against the original before it is written."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnx import ModelProto

from ortprep.errors import UsageError
from ortprep.findings import Finding, Severity
from ortprep.eps.registry import resolve_ep
from ortprep.model import ModelHandle
from ortprep.steps.options import MAX_ROUNDS, ConvertOptions
from ortprep.runtime.providers import require_ort
from ortprep.steps.base import Step, StepContext, output_path
from ortprep.report import StepResult
from ortprep.runtime.compare import compare_arrays
from ortprep.transforms import fp16 as fp16_step
from ortprep.transforms import rewrites
from ortprep.transforms.common import finish, make_feeds, reference_run
from ortprep.transforms.fp16 import KeepReason
from ortprep.transforms.verify import (
    EXACT_GATE,
    Gate,
    VerifyResult,
    float_intermediates,
    model_bytes,
    node_count,
    run_model,
    run_with_intermediates,
    verify_run,
)

log = logging.getLogger(__name__)

SCHEMA = "ortprep.convert/1"


class _Fp16Run:
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
        for node in self.source.graph.node:
            if node.name in self.block_nodes:
                kept.append(fp16_step.KeptNode(node.name, node.op_type, self.block_nodes[node.name]))
            elif node.op_type in self.block_ops:
                kept.append(fp16_step.KeptNode(node.name, node.op_type, self.block_ops[node.op_type]))
            elif node.op_type in DEFAULT_OP_BLOCK_LIST:
                kept.append(
                    fp16_step.KeptNode(node.name, node.op_type, "onnxconverter-common keeps this op in FP32")
                )
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
        culprits: dict[str, tuple[KeepReason, str]] = {}
        first_bad = None
        for node in self.source.graph.node:
            if node.name in self.block_nodes:
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
            producers = {out: node for node in self.source.graph.node for out in node.output}
            for node in self.source.graph.node:
                if node.name in self.block_nodes and any(o in bad for o in node.output):
                    for name in node.input:
                        upstream = producers.get(name)
                        if upstream is not None and upstream.name not in self.block_nodes:
                            culprits[upstream.name] = (KeepReason.FEEDS_KEPT, f"feeds '{node.name}', whose output differs even in FP32")
        if not culprits and not candidate.ok:
            # Fails without a node to blame: keep every remaining float node of the main graph in FP32.
            for node in self.source.graph.node:
                if node.name not in self.block_nodes:
                    culprits[node.name] = (KeepReason.NO_RUN, f"ORT could not run the FP16 model ({candidate.message[:120]})")
        return culprits


def convert_model(handle: ModelHandle, dest: Path, options: ConvertOptions, *, force: bool = False) -> StepResult:
    """Apply the requested transforms, verify, and write ``dest`` only when verification passes
    (or ``keep_failed``). The handle's model is transformed in place (its file is not touched)."""
    checks = dataclasses.replace(options, shapes={**options.fix_shapes, **options.shapes}, dims={**options.fix_dims, **options.dims})
    report = StepResult(step="convert", schema=SCHEMA)
    size_before = model_bytes(handle.path)
    handle.load_weights()
    nodes_before = node_count(handle.proto)
    # The reference run comes first: after it the transforms change handle.proto in place
    # (a copy would hold every weight twice).
    feeds, feed_source = make_feeds(handle, checks)
    reference = reference_run(handle.proto, feeds, report) if options.verify else None
    proto, applied = _rewrite(handle.proto, options)

    verify_result: VerifyResult | None = None
    kept: list[fp16_step.KeptNode] = []
    if options.fp16:
        proto, verify_result, kept = _fp16(proto, options, feeds, reference, report)
        applied.append({"transform": "fp16", "detail": f"ep {options.ep}"})
    elif reference is not None:
        verify_result = verify_run(reference, run_model(proto, feeds), EXACT_GATE)

    fix = (
        "keep more nodes in FP32 (--block-op / --block-node), or loosen the gate (--min-cosine)"
        if options.fp16
        else "report it: the transform changed the model's results"
    )
    written = finish(
        report,
        handle,
        nodes_before,
        proto,
        dest,
        verify_result,
        checks,
        force=force,
        size_before=size_before,
        transforms=applied,
        feed_source=feed_source,
        failure_fix=fix,
        extra={"kept_fp32_nodes": [k.to_record() for k in kept]},
    )
    report.output = written
    return report


def _rewrite(proto: ModelProto, options: ConvertOptions) -> tuple[ModelProto, list[dict[str, Any]]]:
    """The graph rewrites before FP16: opset, static shapes, 1-D to 2-D."""
    applied: list[dict[str, Any]] = []
    if options.opset:
        proto = rewrites.convert_opset(proto, options.opset)
        applied.append({"transform": "opset", "detail": f"opset {options.opset}"})
    if options.fix_dims or options.fix_shapes:
        changes = rewrites.fix_dims(proto, options.fix_dims) if options.fix_dims else []
        changes += rewrites.fix_shapes(proto, options.fix_shapes) if options.fix_shapes else []
        proto = rewrites.propagate_static_shapes(proto)
        applied.append({"transform": "fix_shape", "detail": "; ".join(changes)})
    if options.conv1d_to_conv2d:
        working = ModelHandle(proto=proto, path=None)
        names = rewrites.conv1d_to_conv2d(working)
        proto = rewrites.propagate_static_shapes(working.proto)
        applied.append({"transform": "conv1d_to_conv2d", "detail": f"{len(names)} node(s): {', '.join(names)}"})
    return proto, applied


def _fp16(proto: ModelProto, options: ConvertOptions, feeds, reference, report: StepResult):
    fp16_step.ensure_node_names(proto)
    scan = fp16_step.scan_constants(proto)
    overflow_names = {name for name, _ in scan.overflow}
    folded = fp16_step.fold_batchnorms(proto, overflow_names) if overflow_names else []
    remaining = fp16_step.scan_constants(proto).overflow if folded else scan.overflow
    run = _Fp16Run(proto, options, feeds, reference, report)
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


class ConvertStep(Step):
    name = "convert"
    Options = ConvertOptions
    writes_model = True
    progress_label = "converting"

    def prepare(self) -> None:
        if self.options.verify:
            require_ort()

    def default_output(self, model: Path) -> Path:
        suffix = ".fp16.onnx" if self.options.fp16 else ".converted.onnx"
        return model.with_name(model.name.removesuffix(".onnx") + suffix)

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        return convert_model(model, output_path(self, model, ctx), self.options, force=ctx.force)
