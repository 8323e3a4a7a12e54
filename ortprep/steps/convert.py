"""convert: FP16 (with repair and mixed precision), opset, static shapes, 1-D to 2-D; every
result verified against the original before it is written."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto

from ortprep.errors import UsageError
from ortprep.findings import Finding
from ortprep.model import ModelHandle, iter_graphs
from ortprep.report import StepResult
from ortprep.validity import drop_duplicate_imports
from ortprep.steps.base import Step, StepContext, output_path
from ortprep.steps.options import ConvertOptions
from ortprep.transforms import fp16 as fp16_step
from ortprep.transforms import rewrites
from ortprep.transforms.common import finish, make_feeds, reference_run
from ortprep.transforms.fp16_search import convert_to_fp16
from ortprep.transforms.verify import (
    EXACT_GATE,
    VerifyResult,
    model_bytes,
    node_count,
    run_model,
    verify_run,
)

log = logging.getLogger(__name__)

SCHEMA = "ortprep.convert/1"


def convert_model(handle: ModelHandle, dest: Path, options: ConvertOptions, *, force: bool = False) -> StepResult:
    """Apply the requested transforms, verify, and write ``dest`` only when verification passes
    (or ``keep_failed``). The handle's model is transformed in place (its file is not touched)."""
    checks = dataclasses.replace(options, shapes={**options.fix_shapes, **options.shapes}, dims={**options.fix_dims, **options.dims})
    report = StepResult(step="convert", schema=SCHEMA)
    size_before = model_bytes(handle.path)
    handle.load_weights()
    nodes_before = node_count(handle.proto)
    float_weights = sum(4 * int(np.prod(t.dims)) for _, g in iter_graphs(handle.proto.graph) for t in g.initializer
                        if t.data_type == TensorProto.FLOAT)
    # The reference run comes first: after it the transforms change handle.proto in place
    # (a copy would hold every weight twice).
    feeds, feed_source = make_feeds(handle, checks)
    reference = reference_run(handle.proto, feeds, report) if options.verify else None
    proto, applied = _rewrite(handle.proto, options)

    verify_result: VerifyResult | None = None
    kept: list[fp16_step.KeptNode] = []
    if options.fp16:
        proto, verify_result, kept = convert_to_fp16(proto, options, feeds, reference, report)
        applied.append({"transform": "fp16", "detail": f"ep {options.ep}" if options.ep else "no EP: ONNX's float16 signatures"})
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
    size_after = report.data.get("size_after")
    if options.fp16 and size_after is not None and float_weights >= size_before / 2 and size_after >= 0.9 * size_before:
        kept_weights = "" if options.ep is None else f"; {options.ep} keeps ops in FP32 whose weights stay float32"
        report.add(Finding.of(
            "CNV012", f"the FP16 model is not smaller ({size_after} bytes vs {size_before}){kept_weights}",
            fix="see kept_fp32_nodes; without --ep every op with a float16 signature is converted"))
    report.output = written
    return report


def _rewrite(proto: ModelProto, options: ConvertOptions) -> tuple[ModelProto, list[dict[str, Any]]]:
    """The graph rewrites before FP16: opset, static shapes, 1-D to 2-D."""
    applied: list[dict[str, Any]] = []
    dropped = drop_duplicate_imports(proto)
    if dropped:
        applied.append({"transform": "repair", "detail": f"dropped repeated opset import(s): {', '.join(dropped)}"})
    if options.opset:
        proto = rewrites.convert_opset(proto, options.opset)
        applied.append({"transform": "opset", "detail": f"opset {options.opset}"})
    if options.ir_version:
        if options.ir_version > proto.ir_version:  # equal: a no-op stamp
            raise UsageError(f"the model already has IR version {proto.ir_version}; --ir-version only stamps an older one",
                             hint=f"give a version below {proto.ir_version}, or leave --ir-version out")
        applied.append({"transform": "ir_version", "detail": f"IR {proto.ir_version} -> {options.ir_version}"})
        proto.ir_version = options.ir_version
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


class ConvertStep(Step):
    name = "convert"
    Options = ConvertOptions
    memory_factor = 2.0
    refuses_ep_context = True
    writes_model = True
    needs_ort = "to_verify"
    progress_label = "converting"

    def default_output(self, model: Path) -> Path:
        suffix = ".fp16.onnx" if self.options.fp16 else ".converted.onnx"
        return model.with_name(model.name.removesuffix(".onnx") + suffix)

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        return convert_model(model, output_path(self, model, ctx), self.options, force=ctx.force)
