"""convert: FP16 (with repair and mixed precision), opset, static shapes, 1-D to 2-D; every
result verified against the original before it is written."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto

from ortprep.errors import UsageError
from ortprep.findings import Finding, Severity
from ortprep.model import ModelHandle, check_output_path
from ortprep.report import StepReport
from ortprep.runtime.compare import compare_arrays
from ortprep.runtime.feeds import input_specs, load_feeds, random_feeds
from ortprep.steps import fp16 as fp16_step
from ortprep.steps import rewrites
from ortprep.steps.verify import (
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
MAX_ROUNDS = 8


@dataclass
class ConvertOptions:
    fp16: bool = False
    ep: str = "cpu"
    keep_io_types: bool | None = None  # None: the EP's default (fp16 I/O for NPUs)
    block_ops: tuple[str, ...] = ()
    block_nodes: tuple[str, ...] = ()
    opset: int | None = None
    fix_shapes: dict[str, list[int]] = field(default_factory=dict)
    fix_dims: dict[str, int] = field(default_factory=dict)
    conv1d_to_conv2d: bool = False
    shapes: dict[str, list[int]] = field(default_factory=dict)  # feed shapes for verification only
    inputs: Path | None = None
    min_cosine: float = 0.999
    verify: bool = True
    keep_failed: bool = False
    force: bool = False
    max_rounds: int = MAX_ROUNDS

    def any_transform(self) -> bool:
        return bool(self.fp16 or self.opset or self.fix_shapes or self.fix_dims or self.conv1d_to_conv2d)


def default_output(path: Path, options: ConvertOptions) -> Path:
    suffix = ".fp16.onnx" if options.fp16 else ".converted.onnx"
    return path.with_name(path.name.removesuffix(".onnx") + suffix)


class _Fp16Run:
    """The FP16 loop: convert, load, compare; keep the nodes responsible in FP32; repeat."""

    def __init__(self, proto: ModelProto, options: ConvertOptions, feeds, reference, report: StepReport) -> None:
        self.source = proto
        self.options = options
        self.feeds = feeds
        self.reference = reference
        self.report = report
        self.keep_io = (
            options.keep_io_types
            if options.keep_io_types is not None
            else fp16_step.default_keep_io_types(options.ep)
        )
        self.block_ops: dict[str, str] = {op: "--block-op" for op in options.block_ops}
        self.block_nodes: dict[str, str] = {name: "--block-node" for name in options.block_nodes}
        self.gate = Gate(min_cosine=options.min_cosine)
        self.repairs: list[str] = []
        self.rounds = 0

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
            for name, reason in culprits.items():
                self.block_nodes[name] = reason
        return converted, last

    def _culprits(self, converted: ModelProto, result: VerifyResult) -> dict[str, str]:
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
        elif not result.loads:
            named = _node_named_in(result.error or "", self.source)
            if named:
                self.report.add(
                    Finding.of(
                        "CNV004",
                        f"ORT rejected the FP16 model at node '{named}' ({result.error}); keeping it in FP32",
                        severity=Severity.INFO,
                        node=named,
                    )
                )
                return {named: "ORT rejected it in FP16"}
        return self._localize(converted)

    def _localize(self, converted: ModelProto) -> dict[str, str]:
        """Compare every intermediate tensor; the nodes where the error starts stay FP32."""
        names = [n for n in float_intermediates(self.source)]
        present = {out for node in converted.graph.node for out in node.output}
        names = [n for n in names if n in present]
        original = run_with_intermediates(self.source, self.feeds, names)
        candidate = run_with_intermediates(converted, self.feeds, names)
        if not original.ok:
            return {}
        bad: set[str] = set()
        for name, value in original.outputs.items():
            if value.dtype.kind != "f":
                continue
            other = candidate.outputs.get(name) if candidate.ok else None
            if other is None or not self.gate.passes(compare_arrays(name, value, other), value):
                bad.add(name)
        culprits: dict[str, str] = {}
        first_bad = None
        for node in self.source.graph.node:
            if node.name in self.block_nodes:
                continue
            outs_bad = any(o in bad for o in node.output)
            if not outs_bad:
                continue
            first_bad = first_bad or node
            if not any(i in bad for i in node.input):
                culprits[node.name] = "its FP16 output differs from FP32 beyond the gate"
        if not culprits and first_bad is not None:
            culprits[first_bad.name] = "first node whose FP16 output differs beyond the gate"
        if not culprits and not candidate.ok:
            # Fails without a node to blame: keep every remaining float node of the main graph in FP32.
            for node in self.source.graph.node:
                if node.name not in self.block_nodes:
                    culprits[node.name] = f"ORT could not run the FP16 model ({candidate.message[:120]})"
        return culprits


def _node_named_in(message: str, proto: ModelProto) -> str | None:
    names = sorted((n.name for n in proto.graph.node if n.name), key=len, reverse=True)
    for name in names:
        if f"({name})" in message or f"'{name}'" in message or f"node {name}" in message:
            return name
    return None


def _feeds(handle: ModelHandle, proto: ModelProto, options: ConvertOptions) -> tuple[dict[str, np.ndarray], str]:
    specs = input_specs(proto)
    if options.inputs is not None:
        return load_feeds(options.inputs, input_specs(handle.proto)), str(options.inputs)
    shapes = {**options.fix_shapes, **options.shapes}
    return random_feeds(specs, seed=0, shapes=shapes, dims=options.fix_dims), "random (seed 0)"


def convert_model(handle: ModelHandle, output: Path | None, options: ConvertOptions) -> tuple[StepReport, ModelProto | None]:
    """Apply the requested transforms, verify, and write ``output`` only when verification passes
    (or ``keep_failed``). Returns the report and the written model."""
    if not options.any_transform():
        raise UsageError("nothing to do", hint="give at least one of --fp16, --opset, --fix-shape, --fix-dim, --conv1d-to-conv2d")
    if handle.path is None:
        raise UsageError("convert needs a model file")
    dest = check_output_path(Path(output) if output else default_output(handle.path, options), input_path=handle.path, force=options.force)
    report = StepReport(step="convert", schema=SCHEMA)
    size_before = model_bytes(handle.path)
    handle.load_weights()
    original = ModelProto()
    original.CopyFrom(handle.proto)
    proto = ModelProto()
    proto.CopyFrom(handle.proto)
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

    feeds, feed_source = _feeds(handle, original, options)
    reference = None
    verify_result: VerifyResult | None = None
    kept: list[fp16_step.KeptNode] = []
    if options.verify:
        outcome = run_model(original, feeds)
        if outcome.ok:
            reference = outcome
        else:
            report.add(
                Finding.of(
                    "CNV007",
                    f"the original model does not run on ONNX Runtime's CPU EP ({outcome.status}: {outcome.message[:200]}); "
                    "the result cannot be verified against it",
                    fix="check it: ortprep check MODEL --ep cpu; pass --inputs FILE.npz if the inputs are the problem",
                )
            )

    if options.fp16:
        proto, verify_result, kept = _fp16(proto, options, feeds, reference, report)
    elif reference is not None:
        verify_result = verify_run(reference, run_model(proto, feeds), EXACT_GATE)

    failed = verify_result is not None and not verify_result.passed
    if failed:
        report.add(
            Finding.of(
                "CNV006",
                "verification failed: "
                + (
                    f"the result does not load or run ({verify_result.error})"
                    if not verify_result.loads or verify_result.error
                    else f"outputs differ (lowest cosine {verify_result.cosine}, max abs diff {verify_result.max_abs_diff})"
                ),
                fix="keep more nodes in FP32 (--block-op / --block-node), or loosen the gate (--min-cosine)"
                if options.fp16
                else "report it: the transform changed the model's results",
            )
        )
    written = None
    if proto is not None and (not failed or options.keep_failed):
        result_handle = ModelHandle(proto=proto, path=None)
        written = result_handle.save(dest, force=options.force, external_data=True if handle.external_files else None)
        report.artifacts.append(str(written))
    report.data = {
        "input": str(handle.path),
        "output": str(written) if written else None,
        "transforms": applied + ([{"transform": "fp16", "detail": f"ep {options.ep}"}] if options.fp16 else []),
        "nodes_before": node_count(original),
        "nodes_after": node_count(proto) if proto is not None else None,
        "size_before": size_before,
        "size_after": model_bytes(written) if written else None,
        "verify": verify_result.to_record()
        if verify_result
        else {"loads": None, "max_abs_diff": None, "max_rel_diff": None, "cosine": None, "passed": None, "outputs": [], "error": None},
        "inputs": feed_source,
        "kept_fp32_nodes": [k.to_record() for k in kept],
    }
    return report, proto if written else None


def _fp16(proto: ModelProto, options: ConvertOptions, feeds, reference, report: StepReport):
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
                run.block_nodes[node.name] = f"reads constant '{name}' beyond FP16's range"
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
        if activations.ok:
            flagged = fp16_step.activation_overflow_nodes(proto, activations.outputs)
            for name, peak in flagged.items():
                run.block_nodes.setdefault(name, f"activations reach {peak:.4g}, beyond FP16's safe range")
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
    if result is not None and result.passed and any(r.startswith("its FP16") or r.startswith("first node") for r in run.block_nodes.values()):
        report.add(
            Finding.of(
                "CNV009",
                f"verification passed with mixed precision after {run.rounds} round(s): "
                f"{sum(1 for r in run.block_nodes.values() if 'gate' in r)} node(s) kept in FP32",
                fix="see kept_fp32_nodes",
            )
        )
    return converted, result, kept
